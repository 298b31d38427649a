"""Open a checkpoint by what it is: a GGUF file, a ``.safetensors`` file or a Hugging Face
folder (:func:`open_weights`), each through its format's reader (:mod:`poot.load.gguf`,
:mod:`poot.load.safetensors`) into one :class:`~poot.load.store.WeightStore`.
"""

from __future__ import annotations

import os

from poot.load.errors import LoadError
from poot.load.gguf import looks_like_gguf, open_gguf_store
from poot.load.safetensors import open_hf_folder, open_safetensors_store
from poot.load.store import WeightStore


def open_weights(path: str | os.PathLike) -> WeightStore:
    """Open a checkpoint's tensors without copying them.

    ``path`` may be a ``.gguf`` file, a ``.safetensors`` file, or a Hugging Face folder
    (``model.safetensors`` or shards listed by ``model.safetensors.index.json``).
    Raises :class:`~poot.load.errors.LoadError` for a missing or malformed checkpoint.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        return open_hf_folder(p)
    if not os.path.exists(p):
        raise LoadError(p, "path", "no such file or folder")
    if p.endswith(".safetensors"):
        return open_safetensors_store(p)
    if p.endswith(".gguf") or looks_like_gguf(p):
        return open_gguf_store(p)
    raise LoadError(p, "path", "not a .gguf file, a .safetensors file or a Hugging Face folder")
