"""Graph construction: the :class:`Builder` and the ``ops`` compositions over primitives."""

from poot.graph.builder import (Builder, BuilderError, BuilderLimitExceeded, Graph, Tensor,
                                TraceLimits)

__all__ = ["Builder", "BuilderError", "BuilderLimitExceeded", "Graph", "Tensor", "TraceLimits"]
