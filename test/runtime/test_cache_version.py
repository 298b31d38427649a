"""The compile cache keys programs by poot's version: a source tree that was never installed
(the copy a GPU machine without MLIR runs from a carried cache) must key them as the
installed tree that compiled them, or every carried program misses."""

from __future__ import annotations

import importlib.metadata

from poot.compiler import cache
from poot.version import __version__


def test_version_in_keys_is_the_source_trees_when_poot_is_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    cache.poot_version.cache_clear()
    try:
        assert cache.poot_version() == __version__
        assert __version__ != "unknown"
    finally:
        cache.poot_version.cache_clear()
