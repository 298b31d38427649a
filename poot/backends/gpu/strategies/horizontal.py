"""Strategy ``horizontal``: a function merged from independent sibling dispatches (its
``poot.dispatch`` names its members) becomes ONE kernel whose grid concatenates the members'
grids. Tried before every other strategy: only it may split such a body back into members.
See :mod:`poot.backends.gpu.horizontal`."""

from __future__ import annotations

from poot.backends.gpu.horizontal import horizontal_kernels
from poot.backends.gpu.strategies import register

register("horizontal", first=True)(horizontal_kernels)

__all__ = ["horizontal_kernels"]
