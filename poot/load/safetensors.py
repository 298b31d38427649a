"""A hardened, memory-mapped safetensors reader (single files and Hugging Face folders).

Format source: the safetensors specification (github.com/huggingface/safetensors, README
"Format")::

    u64 N (little-endian) | N bytes of UTF-8 JSON header (may end in spaces) | byte buffer

The header is an object mapping each tensor name to ``{"dtype": "F32", "shape": [..],
"data_offsets": [begin, end]}`` (offsets relative to the byte buffer), plus an optional
``"__metadata__"`` string-to-string map. The tensors must tile the byte buffer exactly: no
overlaps, no holes, nothing past its end.

The ``safetensors`` library validates the same things but cannot hand out zero-copy numpy
views of BF16, so the header is validated here and each tensor is a read-only numpy view of
one ``mmap`` (BF16 as ``ml_dtypes.bfloat16`` words, F16 as float16; nothing converted).
Every problem is a :class:`~poot.load.errors.LoadError` naming file, field and problem.
"""

from __future__ import annotations

import json
import mmap
import os
from typing import Any

import numpy as np

from poot.load.errors import LoadError
from poot.load.gguf import open_gguf_store
from poot.load.store import DType, StoredTensor, WeightStore, map_file

MAX_HEADER_BYTES = 100 * 1000 * 1000  # the reference implementation's limit
MAX_DIMS = 64  # numpy's limit on an array's rank
_INT64_MAX = (1 << 63) - 1
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

_DTYPES: dict[str, DType] = {
    "F64": DType.F64, "F32": DType.F32, "F16": DType.F16, "BF16": DType.BF16,
    "F8_E4M3": DType.F8_E4M3, "F8_E5M2": DType.F8_E5M2, "I64": DType.I64, "I32": DType.I32,
    "I16": DType.I16, "I8": DType.I8, "U64": DType.U64, "U32": DType.U32, "U16": DType.U16,
    "U8": DType.U8, "BOOL": DType.BOOL,
}


def _no_duplicates(path: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise LoadError(path, k, "duplicate key in JSON")
            out[k] = v
        return out
    return hook


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, StoredTensor], dict[str, str]]:
    """Validate one ``.safetensors`` file and map its tensors.

    Returns ``(tensors, metadata)``: name -> :class:`StoredTensor` (read-only views, header
    order) and the ``__metadata__`` map (empty if absent). Raises LoadError for: a file
    shorter than 8 bytes, a header length past the file or over 100 MB, a header that is not
    UTF-8 JSON or not an object, duplicate keys, malformed entries or ``__metadata__``,
    unknown dtypes, a shape of more than 64 dimensions or spanning more than 2**63 bytes
    (its zero dimensions aside), a dtype*shape size that disagrees with the offsets, and offsets that
    overlap, leave holes or run past the end of the file.
    """
    p = os.fspath(path)
    buf, size = map_file(p)
    return parse_safetensors(p, buf, size)


def parse_safetensors(p: str, buf: mmap.mmap | bytes | None, size: int
                      ) -> tuple[dict[str, StoredTensor], dict[str, str]]:
    """:func:`read_safetensors` of a file already mapped (``buf``, ``size`` bytes; None when
    empty), named ``p`` in errors."""
    if size < 8:
        raise LoadError(p, "header length", f"file is {size} bytes, shorter than the 8-byte "
                                            "header length")
    n = int.from_bytes(buf[0:8], "little")
    if n > MAX_HEADER_BYTES:
        raise LoadError(p, "header length", f"{n} bytes exceeds the {MAX_HEADER_BYTES}-byte "
                                            "limit")
    if n > size - 8:
        raise LoadError(p, "header length", f"{n} bytes runs past the end of the file "
                                            f"({size - 8} bytes after the length)")
    header = _parse_header(p, buf[8:8 + n])
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise LoadError(p, "__metadata__", "must be an object of strings")
    base, buf_len = 8 + n, size - 8 - n
    entries = [_entry(p, name, info) for name, info in header.items()]
    _check_tiling(p, entries, buf_len)
    tensors = {name: StoredTensor(name, shape, dtype, None,
                                  _view(buf, dtype, shape, base + begin, end - begin), p)
               for name, dtype, shape, begin, end in entries}
    return tensors, meta


def _view(buf: mmap.mmap, dtype: DType, shape: tuple[int, ...], offset: int,
          nbytes: int) -> np.ndarray:
    """A read-only view of ``nbytes`` at ``offset`` (zero-size tensors map nothing)."""
    if nbytes == 0:
        return np.empty(shape, dtype.numpy)
    return np.frombuffer(buf, dtype.numpy, count=nbytes // dtype.itemsize,
                         offset=offset).reshape(shape)


def _parse_header(p: str, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates(p))
    except UnicodeDecodeError as e:
        raise LoadError(p, "header", f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise LoadError(p, "header", f"not valid JSON ({e.msg} at byte {e.pos})") from None
    except RecursionError:
        raise LoadError(p, "header", "JSON nested too deeply") from None
    if not isinstance(header, dict):
        raise LoadError(p, "header", f"must be a JSON object, found {type(header).__name__}")
    return header


def _entry(p: str, name: str, info: Any) -> tuple[str, DType, tuple[int, ...], int, int]:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise LoadError(p, name, "entry must be an object with dtype, shape and data_offsets")
    dtype = _DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise LoadError(p, f"{name}.dtype", f"unknown dtype {info['dtype']!r}")
    shape, offs = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise LoadError(p, f"{name}.shape", f"must be a list of non-negative integers, "
                                            f"found {shape!r}")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_uint(o) for o in offs)
            or offs[0] > offs[1]):
        raise LoadError(p, f"{name}.data_offsets", f"must be [begin, end] with "
                                                   f"0 <= begin <= end, found {offs!r}")
    if len(shape) > MAX_DIMS:
        raise LoadError(p, f"{name}.shape", f"{len(shape)} dimensions; at most {MAX_DIMS}")
    # numpy refuses an array whose nonzero dimensions multiply past int64 bytes, even one
    # of zero elements (a zero dimension does not make [0, 10**30] representable)
    extent = 1
    for d in shape:
        extent *= max(d, 1)
    if extent * dtype.itemsize > _INT64_MAX:
        raise LoadError(p, f"{name}.shape", f"{shape} spans more than 2**63 bytes "
                                            f"(as {info['dtype']})")
    numel = 1
    for d in shape:
        numel *= d
    if numel * dtype.itemsize != offs[1] - offs[0]:
        raise LoadError(p, f"{name}.data_offsets", f"{info['dtype']} {shape} needs "
                        f"{numel * dtype.itemsize} bytes but the offsets span "
                        f"{offs[1] - offs[0]}")
    return name, dtype, tuple(shape), offs[0], offs[1]


def _check_tiling(p: str, entries: list, buf_len: int) -> None:
    """The tensors must cover the byte buffer exactly, in some order."""
    pos, prev = 0, None
    for name, _, _, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if end > buf_len:
            raise LoadError(p, f"{name}.data_offsets", f"end {end} runs past the end of the "
                                                       f"file ({buf_len} data bytes)")
        if begin < pos:
            raise LoadError(p, f"{name}.data_offsets", f"[{begin}, {end}) overlaps {prev}")
        if begin > pos:
            raise LoadError(p, f"{name}.data_offsets", f"leaves a hole: bytes [{pos}, {begin}) "
                                                       "belong to no tensor")
        pos, prev = end, name
    if pos != buf_len:
        raise LoadError(p, "data_offsets", f"leaves a hole: bytes [{pos}, {buf_len}) at the "
                                           "end belong to no tensor")


def open_safetensors_store(path: str | os.PathLike) -> WeightStore:
    """A :class:`WeightStore` over one ``.safetensors`` file."""
    p = os.fspath(path)
    tensors, meta = read_safetensors(p)
    return WeightStore(tensors, kind="safetensors", files=[p], metadata=dict(meta), root=p)


def _load_index(index_path: str) -> dict[str, str]:
    try:
        with open(index_path, "rb") as f:
            # Size first: read(limit) would allocate the whole limit up front.
            size = os.fstat(f.fileno()).st_size
            if size > MAX_HEADER_BYTES:
                raise LoadError(index_path, "file", f"index of {size} bytes is larger than "
                                                    f"{MAX_HEADER_BYTES} bytes")
            raw = f.read(size)
    except OSError as e:
        raise LoadError(index_path, "file", e.strerror or str(e)) from None
    index = _parse_header(index_path, raw)
    wm = index.get("weight_map")
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise LoadError(index_path, "weight_map", "must be an object of tensor name -> shard "
                                                  "file name")
    return wm


def _shard_path(folder: str, index_path: str, name: str, shard: str) -> str:
    # A shard must be a file inside the folder: no absolute paths, no "..".
    norm = os.path.normpath(shard)
    if os.path.isabs(norm) or norm.startswith(os.pardir):
        raise LoadError(index_path, f"weight_map.{name}", f"shard {shard!r} is outside the "
                                                          "folder")
    full = os.path.join(folder, norm)
    if not os.path.isfile(full):
        raise LoadError(index_path, f"weight_map.{name}", f"shard {shard!r} does not exist")
    return full


def open_hf_folder(folder: str | os.PathLike) -> WeightStore:
    """A :class:`WeightStore` over a Hugging Face folder.

    Uses ``model.safetensors.index.json`` (sharded) if present, else ``model.safetensors``,
    else a single ``*.gguf`` in the folder. Raises LoadError for a folder with none of these,
    an index naming a missing shard, a tensor the index lists but its shard lacks, or a
    tensor stored in two shards.
    """
    folder = os.fspath(folder)
    index_path = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index_path):
        return _open_sharded(folder, index_path)
    single = os.path.join(folder, SINGLE_NAME)
    if os.path.isfile(single):
        store = open_safetensors_store(single)
        store.root = folder
        return store
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return open_gguf_store(os.path.join(folder, ggufs[0]))
    raise LoadError(folder, "path", f"no {SINGLE_NAME}, {INDEX_NAME} or single .gguf file")


def _open_sharded(folder: str, index_path: str) -> WeightStore:
    wm = _load_index(index_path)
    shards: dict[str, str] = {}  # shard file name -> full path, index order
    for name, shard in wm.items():
        if shard not in shards:
            shards[shard] = _shard_path(folder, index_path, name, shard)
    tensors: dict[str, StoredTensor] = {}
    metadata: dict[str, str] = {}
    for shard, full in shards.items():
        part, meta = read_safetensors(full)
        metadata.update(meta)
        for name, t in part.items():
            if name in tensors:
                raise LoadError(full, name, f"tensor also stored in {tensors[name].source}")
            tensors[name] = t
    for name, shard in wm.items():
        t = tensors.get(name)
        if t is None or t.source != shards[shard]:
            raise LoadError(shards[shard], name, f"listed in {INDEX_NAME} but missing from "
                                                 "this shard")
    return WeightStore(tensors, kind="safetensors", files=list(shards.values()),
                       metadata=metadata, root=folder)
