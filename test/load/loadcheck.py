"""Assertion helper shared by the malformed-file tests."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from poot.load.errors import LoadError


def _bytes_under(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return os.path.getsize(path)


def expect_load_error(fn, path: str, field: str, problem: str = "") -> LoadError:
    """``fn(path)`` must raise LoadError whose field contains ``field`` (and problem contains
    ``problem``), naming the file, with peak traced memory below the size of the file (or of
    the folder's files): nothing the header claims is allocated. (How fast it fails is a
    benchmark's business, not a test's.)"""
    path = os.fspath(path)
    size = _bytes_under(path)
    with pytest.raises(LoadError) as ei:
        fn(path)
    err = ei.value
    assert field in err.field, f"field {err.field!r} does not name {field!r}: {err}"
    assert problem in err.problem, f"problem {err.problem!r} lacks {problem!r}"
    assert err.file.startswith(path) or os.path.basename(path) in err.file, err.file
    assert str(err).startswith(err.file) and "\n" not in str(err)
    tracemalloc.start()
    try:
        with pytest.raises(LoadError):
            fn(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size, f"peak traced memory {peak} B >= file size {size} B"
    return err
