"""Fuzz the safetensors reader (``read_safetensors``: header length, JSON header, entries,
tiling of the byte buffer).

Contract: any bytes either load or raise LoadError. Properties of a file that loads: every
tensor's array has its header's shape and dtype, is read-only, and its bytes are readable.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PropertyFailed, ScratchFile, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from poot.load.errors import LoadError
    from poot.load.safetensors import read_safetensors

ALLOWED = (LoadError,)
_FILE = ScratchFile(".safetensors")


def one_input(data: bytes) -> None:
    tensors, meta = read_safetensors(_FILE.write(data))
    total = 0
    for name, t in tensors.items():
        arr = t.data
        if tuple(arr.shape) != tuple(t.shape) or arr.dtype != t.dtype.numpy:
            raise PropertyFailed(f"{name}: array {arr.shape} {arr.dtype} but header "
                                 f"{t.shape} {t.dtype}")
        if arr.size and arr.flags.writeable:
            raise PropertyFailed(f"{name}: its view is writable")
        total += len(arr.tobytes())
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise PropertyFailed("__metadata__ is not a string map")
    if total > len(data):
        raise PropertyFailed(f"tensors hold {total} bytes of a {len(data)}-byte file")


if __name__ == "__main__":
    main(one_input, ALLOWED)
