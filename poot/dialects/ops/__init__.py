"""The ops of the poot dialect, one module per family; importing registers them."""

from poot.dialects.ops import (  # noqa: F401  (registration side effects)
    attention,
    contraction,
    elementwise,
    indexing,
    packed,
    reduce,
    sources,
    views,
)
