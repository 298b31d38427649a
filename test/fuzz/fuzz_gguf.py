"""Fuzz the GGUF reader and what reads its metadata: ``read_gguf`` (header, metadata, tensor
infos, data mapping), the model config (``config_from_gguf``) and the tokenizer
(``from_gguf_metadata``).

Contract: any bytes either load or raise LoadError (the reader, the config) or TokenizerError
(the tokenizer). Properties of a file that loads: every tensor's view holds the bytes its
shape and type need, inside the file, and reading it does not fault.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PropertyFailed, ScratchFile, instrumented, main  # noqa: E402

with instrumented(__name__ == "__main__"):
    from poot.load.config import config_from_gguf
    from poot.load.errors import LoadError
    from poot.load.gguf import read_gguf
    from poot.text.tokenizer import TokenizerError, from_gguf_metadata

ALLOWED = (LoadError, TokenizerError)
_FILE = ScratchFile(".gguf")


def one_input(data: bytes) -> None:
    g = read_gguf(_FILE.write(data))
    for name, t in g.tensors.items():
        arr = t.data
        if arr.flags.writeable:
            raise PropertyFailed(f"tensor {name}: its view is writable")
        if arr.nbytes and not (g.data_offset <= _offset(arr, g) and
                               _offset(arr, g) + arr.nbytes <= g.file_size):
            raise PropertyFailed(f"tensor {name}: view outside the file")
        arr.tobytes()                                  # every byte readable
    try:
        config_from_gguf(g.metadata, set(g.tensors), _FILE.path)
    except LoadError:
        pass
    if "tokenizer.ggml.tokens" in g.metadata:
        from_gguf_metadata(g.metadata)


def _offset(arr, g) -> int:
    import numpy as np
    base = np.frombuffer(g._map, np.uint8)
    return arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]


if __name__ == "__main__":
    main(one_input, ALLOWED)
