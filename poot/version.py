"""The version of poot (the package's one source of it; ``poot.__version__`` re-exports it).

Imports nothing, so any layer may read it (the compile cache keys its entries with it).
"""

__version__ = "0.1.0"
