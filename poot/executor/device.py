"""The per-backend device protocol the :class:`~poot.executor.engine.Engine` runs over.

A device is thin: it owns buffers, moves bytes, loads a compiled program as a kernel, records a
kernel's launch over a fixed list of buffers, replays a recording, and reads buffers back. It
knows nothing about models, KV caches or sampling; the engine decides what is bound where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from poot.dialects.types import PootType

#: Argument roles of a kernel, in the order a device reports them.
ROLES = ("input", "param", "output")


@dataclass(frozen=True)
class KernelArg:
    """One argument of a loaded kernel: its role (``input``/``param``/``output``), the
    graph-level name and its type."""

    role: str
    name: str
    type: PootType


@runtime_checkable
class Kernel(Protocol):
    """A program loaded on a device: ``args`` lists its arguments in call order."""

    args: Sequence[KernelArg]


@runtime_checkable
class Device(Protocol):
    """What a backend provides to the engine.

    Buffers are opaque handles typed by a :class:`~poot.dialects.types.PootType`;
    :meth:`upload` rewrites one in place (its identity, and so every recording that binds it,
    stays valid). :meth:`record` fixes a kernel's arguments to buffers once; :meth:`replay`
    launches that recording again with no per-call argument work.
    """

    name: str

    def alloc(self, type_: PootType) -> Any:
        """A zero-filled buffer of ``type_`` (packed weights: their stored bytes)."""
        ...

    def upload(self, buffer: Any, array: np.ndarray) -> None:
        """Write ``array`` into ``buffer`` in place (same shape and element type)."""
        ...

    def download(self, buffer: Any) -> np.ndarray:
        """A host copy of ``buffer`` (after any pending work finished)."""
        ...

    def load(self, program: Any) -> Kernel:
        """Load a compiled :class:`~poot.compiler.Program` for this device."""
        ...

    def record(self, kernel: Kernel, bindings: Sequence[Any]) -> Any:
        """Record one launch of ``kernel`` with ``bindings[i]`` bound to ``kernel.args[i]``."""
        ...

    def replay(self, recording: Any) -> None:
        """Launch a recording again (the bound buffers' current contents are read)."""
        ...

    def synchronize(self) -> None:
        """Wait for launched work (a no-op on a synchronous device)."""
        ...
