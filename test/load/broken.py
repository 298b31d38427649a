"""Writers of small valid and deliberately broken GGUF / safetensors files for loader tests.

The GGUF writer emits raw bytes from a :class:`GGUFSpec` so that any header field can lie
(counts, lengths, value types, dims, tensor types, offsets); by default it writes a valid
~70 KB GGUF v3 file (tensor data dominates, as in real files) (ggml docs/gguf.md layout). The safetensors helpers write a header dict
verbatim (or raw header bytes) followed by a data buffer.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from poot.dialects.quant import QuantFormat

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
         BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
_NP = {U8: "u1", I8: "i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4", F32: "<f4",
       BOOL: "u1", U64: "<u8", I64: "<i8", F64: "<f8"}


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A gguf_string; ``length`` overrides the stored length (to lie)."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def kv_scalar(key: str, vtype: int, value, stored_type: int | None = None) -> bytes:
    """One key/value pair; ``stored_type`` overrides the type id written."""
    t = vtype if stored_type is None else stored_type
    payload = gstr(value) if vtype == STR else struct.pack(_PACK[vtype], value)
    return gstr(key) + struct.pack("<I", t) + payload


def kv_array(key: str, elem: int, values, length: int | None = None) -> bytes:
    """An array pair; ``length`` overrides the stored element count (to lie)."""
    n = len(values) if length is None else length
    if elem == STR:
        body = b"".join(gstr(v) for v in values)
    else:
        body = np.asarray(values, dtype=_NP[elem]).tobytes()
    return gstr(key) + struct.pack("<IIQ", ARR, elem, n) + body


@dataclass
class GTensor:
    """A tensor: ``dims`` in GGUF order (innermost first), raw ``data`` bytes; ``offset``
    (relative to the data section) overrides where the info claims the data is."""

    name: str
    dims: list[int]
    ggml_type: int
    data: bytes
    offset: int | None = None
    n_dims: int | None = None


def _default_kvs(n_vocab: int = 64) -> list[bytes]:
    toks = [f"tok{i}" for i in range(n_vocab)]
    return [
        kv_scalar("general.architecture", STR, "llama"),
        kv_scalar("general.alignment", U32, 32),
        kv_scalar("general.name", STR, "broken-test"),
        kv_scalar("llama.block_count", U32, 1),
        kv_scalar("llama.embedding_length", U32, 64),
        kv_scalar("llama.feed_forward_length", U32, 128),
        kv_scalar("llama.attention.head_count", U32, 4),
        kv_scalar("llama.context_length", U32, 256),
        kv_scalar("llama.rope.freq_base", F32, 10000.0),
        kv_scalar("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        kv_scalar("tokenizer.ggml.model", STR, "gpt2"),
        kv_array("tokenizer.ggml.tokens", STR, toks),
        kv_array("tokenizer.ggml.scores", F32, np.zeros(n_vocab, np.float32)),
        kv_array("tokenizer.ggml.token_type", I32, np.ones(n_vocab, np.int32)),
        kv_scalar("tokenizer.ggml.add_bos_token", BOOL, 1),
    ]


def _default_tensors() -> list[GTensor]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 64)).astype(np.float32)  # dims [64, 256], 64 KiB
    q = rng.integers(0, 256, (16, 2, 34), dtype=np.uint8)  # q8_0 [16 rows x 64]
    q[..., 0:2] = np.array([0.01], np.float16).view(np.uint8).reshape(1, 1, 2)  # finite scales
    c = rng.standard_normal(128).astype(np.float16)
    return [GTensor("a.weight", [64, 256], 0, a.tobytes()),
            GTensor("b.weight", [64, 16], 8, q.tobytes()),
            GTensor("c.weight", [128], 1, c.tobytes())]


@dataclass
class GGUFSpec:
    """A GGUF file to write; every field can be set to a wrong value."""

    magic: bytes = b"GGUF"
    version: int = 3
    kvs: list[bytes] = field(default_factory=_default_kvs)
    tensors: list[GTensor] = field(default_factory=_default_tensors)
    kv_count: int | None = None
    tensor_count: int | None = None
    alignment: int = 32  # used to lay out data (independent of what the KV says)
    truncate: int | None = None  # cut this many bytes off the end
    big_endian_version: bool = False

    def build(self) -> bytes:
        ver = struct.pack(">I" if self.big_endian_version else "<I", self.version)
        out = bytearray(self.magic + ver)
        out += struct.pack("<QQ", len(self.tensors) if self.tensor_count is None
                           else self.tensor_count,
                           len(self.kvs) if self.kv_count is None else self.kv_count)
        for kv in self.kvs:
            out += kv
        natural, pos = [], 0
        for t in self.tensors:
            natural.append(pos)
            pos += -(-len(t.data) // self.alignment) * self.alignment
        for t, off in zip(self.tensors, natural):
            nd = len(t.dims) if t.n_dims is None else t.n_dims
            out += gstr(t.name) + struct.pack("<I", nd)
            out += b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.ggml_type, off if t.offset is None else t.offset)
        out += b"\0" * (-len(out) % self.alignment)
        for t, off in zip(self.tensors, natural):
            out += t.data + b"\0" * (-len(t.data) % self.alignment)
        if self.truncate:
            del out[-self.truncate:]
        return bytes(out)

    def write(self, path: str | os.PathLike) -> str:
        with open(path, "wb") as f:
            f.write(self.build())
        return os.fspath(path)


# --- safetensors ----------------------------------------------------------------------------

def st_bytes(header: dict | list | bytes, data: bytes, header_len: int | None = None) -> bytes:
    """``u64 N | header | data``; ``header`` may be raw bytes, ``header_len`` may lie."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if header_len is None else header_len) + h + data


def st_valid(tensors: dict[str, np.ndarray], dtypes: dict[str, str] | None = None
             ) -> tuple[dict, bytes]:
    """A correct header and buffer for ``tensors`` (dtype names from numpy unless given,
    e.g. ``{"x": "BF16"}`` for ml_dtypes.bfloat16 arrays)."""
    names = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
             "int32": "I32", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float64": "F64"}
    header, buf = {}, bytearray()
    for name, arr in tensors.items():
        dt = (dtypes or {}).get(name) or names[arr.dtype.name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [len(buf), len(buf) + len(b)]}
        buf += b
    return header, bytes(buf)


def write_bytes(path: str | os.PathLike, b: bytes) -> str:
    with open(path, "wb") as f:
        f.write(b)
    return os.fspath(path)


# --- quant blocks ------------------------------------------------------------------------------

# Byte offsets of the f16 scale fields per block (ggml-common.h): random bytes there could be
# NaN/Inf, where "bitwise equal" would only test NaN propagation.
_F16_FIELDS = {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0],
               "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}


def random_blocks(fmt: QuantFormat, n_blocks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n_blocks, fmt.block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS[fmt.name]:
        scales = rng.uniform(-4, 4, n_blocks).astype(np.float16)
        b[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return b
