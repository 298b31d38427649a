"""Fuzz the safetensors reader (``read_safetensors``: header length, JSON header, entries,
tiling of the byte buffer). An input is the file, its header's JSON text and byte buffer,
or a header built from the input's bytes: :func:`file_bytes`.

Contract: any bytes either load or raise LoadError. Properties of a file that loads: every
tensor's array has its header's shape and dtype, is read-only, and its bytes are readable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import atheris  # noqa: E402

from _harness import PropertyFailed, ScratchFile, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from poot.load.errors import LoadError
    from poot.load.safetensors import read_safetensors

ALLOWED = (LoadError,)
_FILE = ScratchFile(".safetensors")


#: dimensions and offsets the structured form picks from: small, and the edges of u32/i64/u64
EDGES = [0, 1, 2, 3, 7, 64, 2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 10 ** 30]
DTYPES = ["F32", "F16", "BF16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "I64", "Q4", 7]


def _structured(data: bytes) -> bytes:
    """A header built entry by entry from the input: dtypes, shapes of edge dimensions (up
    to 70 of them), offsets that tile the buffer or not."""
    fdp = atheris.FuzzedDataProvider(data)
    header, pos = {}, 0
    for i in range(fdp.ConsumeIntInRange(0, 3)):
        dtype = DTYPES[fdp.ConsumeIntInRange(0, len(DTYPES) - 1)]
        ndim = fdp.ConsumeIntInRange(0, 70) if fdp.ConsumeProbability() < 0.1 else \
            fdp.ConsumeIntInRange(0, 4)
        shape = [EDGES[fdp.ConsumeIntInRange(0, len(EDGES) - 1)] if fdp.ConsumeBool()
                 else fdp.ConsumeIntInRange(0, 4) for _ in range(ndim)]
        size = fdp.ConsumeIntInRange(0, 64) if fdp.ConsumeBool() else \
            EDGES[fdp.ConsumeIntInRange(0, len(EDGES) - 1)]
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(min(pos, 256))


def file_bytes(data: bytes) -> bytes:
    """The file the input stands for: an input starting with ``{`` is a header's JSON text,
    then ``\\n\\n``, then the byte buffer (the 8-byte length is added, so mutations of
    the JSON text reach the entry checks); one starting with ``\\x01`` builds a header
    entry by entry (:func:`_structured`); any other input is the file itself."""
    if data[:1] == b"\x01":
        return _structured(data[1:])
    if data[:1] != b"{":
        return data
    header, _, buffer = data.partition(b"\n\n")
    return len(header).to_bytes(8, "little") + header + buffer


def one_input(data: bytes) -> None:
    data = file_bytes(data)
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
