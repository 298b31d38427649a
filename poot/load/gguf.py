"""A hardened, memory-mapped GGUF v2/v3 reader.

Format source: ``ggml/docs/gguf.md`` (the GGUF specification) and ``ggml/src/gguf.cpp``.
A file is, little-endian::

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count  x (gguf_string key | u32 value_type | value)
    tensor_count x (gguf_string name | u32 n_dims | u64 dims[n_dims] (innermost first)
                    | u32 ggml_type | u64 offset (relative to the data section))
    padding to ``general.alignment`` (default 32) | tensor data

where ``gguf_string`` is ``u64 length | UTF-8 bytes`` and an array value is
``u32 elem_type | u64 count | elements``.

Every check below happens before anything is allocated from a count read from the file:
counts and lengths are first compared with the bytes that remain, so a hostile header costs
at most O(file size) memory and returns in well under a second. Every problem is a
:class:`~poot.load.errors.LoadError` naming the file, the field and the problem.
Tensor data and numeric metadata arrays are read-only numpy views of one ``mmap``; nothing is
copied.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from poot.dialects.quant import BY_GGML_TYPE, QuantFormat
from poot.load.errors import LoadError
from poot.load.store import DType, StoredTensor, WeightStore, map_file

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
_INT64_MAX = (1 << 63) - 1
_MAX_EXTENT = 1 << 60  # elements an array may span, zero dimensions aside (8-byte elements)
_HEADER_BYTES = 24  # magic + version + two u64 counts
# Smallest possible encodings, used to bound counts by the bytes that remain.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length + 1-byte key + value type + 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name len + name + n_dims + 1 dim + type + offset


class ValueType(enum.IntEnum):
    """GGUF metadata value types (``enum gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12

    def __str__(self) -> str:
        return self.name.lower()


# Fixed-size element types: struct code and numpy dtype (little-endian).
_FIXED: dict[ValueType, tuple[str, np.dtype]] = {
    ValueType.UINT8: ("<B", np.dtype("u1")), ValueType.INT8: ("<b", np.dtype("i1")),
    ValueType.UINT16: ("<H", np.dtype("<u2")), ValueType.INT16: ("<h", np.dtype("<i2")),
    ValueType.UINT32: ("<I", np.dtype("<u4")), ValueType.INT32: ("<i", np.dtype("<i4")),
    ValueType.FLOAT32: ("<f", np.dtype("<f4")), ValueType.BOOL: ("<B", np.dtype("?")),
    ValueType.UINT64: ("<Q", np.dtype("<u8")), ValueType.INT64: ("<q", np.dtype("<i8")),
    ValueType.FLOAT64: ("<d", np.dtype("<f8")),
}
_INTS = frozenset({ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16,
                   ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64})
_FLOATS = frozenset({ValueType.FLOAT32, ValueType.FLOAT64})


@dataclass(frozen=True)
class KVType:
    """The stored type of one metadata value: a scalar type, or ARRAY with its element type."""

    type: ValueType
    elem: ValueType | None = None

    def __str__(self) -> str:
        return f"array[{self.elem}]" if self.type == ValueType.ARRAY else str(self.type)


# ggml tensor types (``enum ggml_type``): dense ones poot reads, plus names for messages.
_DENSE_GGML: dict[int, DType] = {
    0: DType.F32, 1: DType.F16, 24: DType.I8, 25: DType.I16, 26: DType.I32, 27: DType.I64,
    28: DType.F64, 30: DType.BF16,
}
_GGML_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}


# ---------------------------------------------------------------------------------------------
# Stored types that well-known keys must have (ggml/docs/gguf.md "Standardized key-value pairs").

def _is_int(t: KVType) -> bool:
    return t.type in _INTS


def _is_float(t: KVType) -> bool:
    return t.type in _FLOATS


def _int_or_int_array(t: KVType) -> bool:  # per-layer values are arrays in some models
    return t.type in _INTS or (t.type == ValueType.ARRAY and t.elem in _INTS)


_KNOWN: dict[str, tuple[Callable[[KVType], bool], str]] = {
    "general.alignment": (lambda t: t.type == ValueType.UINT32, "uint32"),
    "general.architecture": (lambda t: t.type == ValueType.STRING, "string"),
    "general.name": (lambda t: t.type == ValueType.STRING, "string"),
    "general.file_type": (_is_int, "an integer"),
    "general.quantization_version": (_is_int, "an integer"),
    "tokenizer.ggml.model": (lambda t: t.type == ValueType.STRING, "string"),
    "tokenizer.ggml.pre": (lambda t: t.type == ValueType.STRING, "string"),
    "tokenizer.chat_template": (lambda t: t.type == ValueType.STRING, "string"),
    "tokenizer.ggml.tokens": (lambda t: t.elem == ValueType.STRING, "array[string]"),
    "tokenizer.ggml.merges": (lambda t: t.elem == ValueType.STRING, "array[string]"),
    "tokenizer.ggml.scores": (lambda t: t.elem == ValueType.FLOAT32, "array[float32]"),
    "tokenizer.ggml.token_type": (
        lambda t: t.type == ValueType.ARRAY and t.elem in _INTS, "an integer array"),
}
for _k in ("bos", "eos", "unknown", "padding", "separator", "cls", "mask", "eot", "eom"):
    _KNOWN[f"tokenizer.ggml.{_k}_token_id"] = (_is_int, "an integer")
for _k in ("add_bos_token", "add_eos_token", "add_space_prefix"):
    _KNOWN[f"tokenizer.ggml.{_k}"] = (lambda t: t.type == ValueType.BOOL, "bool")

# Keys under ``{arch}.``: checked once the architecture is known.
_ARCH_KNOWN: dict[str, tuple[Callable[[KVType], bool], str]] = {
    "block_count": (_is_int, "an integer"),
    "context_length": (_is_int, "an integer"),
    "embedding_length": (_is_int, "an integer"),
    "vocab_size": (_is_int, "an integer"),
    "expert_count": (_is_int, "an integer"),
    "expert_used_count": (_is_int, "an integer"),
    "expert_feed_forward_length": (_is_int, "an integer"),
    "rope.dimension_count": (_is_int, "an integer"),
    "attention.key_length": (_is_int, "an integer"),
    "attention.value_length": (_is_int, "an integer"),
    "attention.sliding_window": (_is_int, "an integer"),
    "feed_forward_length": (_int_or_int_array, "an integer or integer array"),
    "attention.head_count": (_int_or_int_array, "an integer or integer array"),
    "attention.head_count_kv": (_int_or_int_array, "an integer or integer array"),
    "rope.freq_base": (_is_float, "a float"),
    "rope.scaling.factor": (_is_float, "a float"),
    "attention.layer_norm_rms_epsilon": (_is_float, "a float"),
    "attention.layer_norm_epsilon": (_is_float, "a float"),
    "attn_logit_softcapping": (_is_float, "a float"),
    "final_logit_softcapping": (_is_float, "a float"),
}


# ---------------------------------------------------------------------------------------------

@dataclass
class GGUFFile:
    """A parsed GGUF file whose tensors are views of a read-only mapping.

    Attributes:
        path: the file.
        version: 2 or 3.
        metadata: key -> value, in file order. Scalars are Python int/float/bool/str, string
            arrays are ``list[str]``, numeric arrays read-only numpy views (little-endian).
            String values that are not valid UTF-8 decode with ``surrogateescape`` (so
            ``s.encode("utf-8", "surrogateescape")`` gives the stored bytes back).
        metadata_types: key -> :class:`KVType`, the stored type of each value.
        alignment: data alignment in bytes (``general.alignment``, default 32).
        tensors: name -> :class:`~poot.load.store.StoredTensor`, in file order.
        data_offset: absolute file offset of the tensor data section.
        file_size: bytes in the file.
    """

    path: str
    version: int
    metadata: dict[str, Any]
    metadata_types: dict[str, KVType]
    alignment: int
    tensors: dict[str, StoredTensor]
    data_offset: int
    file_size: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


def looks_like_gguf(path: str | os.PathLike) -> bool:
    """True if the file starts with the GGUF magic (False for unreadable files)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


class _Cursor:
    """Bounds-checked little-endian reads over the mapping; every overrun is a LoadError."""

    def __init__(self, path: str, buf: mmap.mmap, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, fld: str, problem: str) -> LoadError:
        return LoadError(self.path, fld, problem)

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, fld: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(fld, f"needs {n} bytes at offset {self.pos} but the file ends "
                                 f"after {self.size - self.pos} (truncated or bad length)")

    def scalar(self, code: str, n: int, fld: str) -> Any:
        self.need(n, fld)
        v = struct.unpack_from(code, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self, fld: str) -> int:
        return self.scalar("<I", 4, fld)

    def u64(self, fld: str) -> int:
        return self.scalar("<Q", 8, fld)

    def string(self, fld: str, strict: bool) -> str:
        n = self.u64(fld + " (string length)")
        self.need(n, fld)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8", "strict" if strict else "surrogateescape")
        except UnicodeDecodeError as e:
            raise self.fail(fld, f"string is not valid UTF-8 ({e.reason} at byte {e.start})")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and validate a GGUF v2/v3 file, mapping it read-only.

    Returns a :class:`GGUFFile`. Raises :class:`~poot.load.errors.LoadError` (file, field,
    problem) for: an unreadable or short file, bad magic, an unsupported version or
    big-endian file, tensor/KV counts that cannot fit in the file, string or array lengths
    past its end, empty or duplicate keys, duplicate tensor names, unknown value types or
    wrong stored types for well-known keys, nested arrays, an alignment that is 0 or not a
    power of two, ``n_dims`` of 0 or above 4, dimension products past int64 (or, zero
    dimensions aside, past 2**60 elements for a tensor of none), unknown or
    unsupported ggml tensor types, a packed row not a whole number of blocks, and tensor data
    that is misaligned, starts outside the file, is truncated or overlaps another tensor.
    """
    p = os.fspath(path)
    buf, size = map_file(p)
    if size < _HEADER_BYTES:
        raise LoadError(p, "header", f"file is {size} bytes, shorter than the "
                                     f"{_HEADER_BYTES}-byte GGUF header")
    return _parse(p, buf, size)


def open_gguf_store(path: str | os.PathLike) -> WeightStore:
    """A :class:`~poot.load.store.WeightStore` over one GGUF file (:func:`read_gguf`; its
    metadata and the parsed file kept). Raises :class:`~poot.load.errors.LoadError`."""
    p = os.fspath(path)
    g = read_gguf(p)
    return WeightStore(dict(g.tensors), kind="gguf", files=[p], metadata=g.metadata, gguf=g,
                       root=p)


def _parse(p: str, buf: mmap.mmap, size: int) -> GGUFFile:
    cur = _Cursor(p, buf, size)
    version = _read_header(cur)
    n_tensors = cur.u64("tensor_count")
    n_kv = cur.u64("kv_count")
    # Bound both counts by the bytes left before reading (or allocating for) any item.
    if n_kv > cur.remaining() // _MIN_KV_BYTES:
        raise cur.fail("kv_count", f"{n_kv} key/value pairs cannot fit in the "
                                   f"{cur.remaining()} bytes left in the file")
    if n_tensors > (cur.remaining() - n_kv * _MIN_KV_BYTES) // _MIN_TENSOR_INFO_BYTES:
        raise cur.fail("tensor_count", f"{n_tensors} tensor infos cannot fit in the "
                                       f"{cur.remaining()} bytes left in the file")
    metadata, types = _read_kvs(cur, n_kv)
    _check_known_keys(cur, metadata, types)
    alignment = _alignment(cur, metadata)
    infos = _read_tensor_infos(cur, n_tensors)
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = _map_tensors(cur, infos, data_offset, alignment)
    return GGUFFile(p, version, metadata, types, alignment, tensors, data_offset, size, buf)


def _read_header(cur: _Cursor) -> int:
    magic = bytes(cur.buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.fail("magic", f"expected b'GGUF', found {magic!r} (not a GGUF file)")
    cur.pos = 4
    version = cur.u32("version")
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in SUPPORTED_VERSIONS:
        if swapped in SUPPORTED_VERSIONS:
            raise cur.fail("version", "big-endian GGUF files are not supported")
        raise cur.fail("version", f"version {version} is not supported (supported: "
                                  f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
    return version


def _value_type(cur: _Cursor, fld: str) -> ValueType:
    raw = cur.u32(fld)
    try:
        return ValueType(raw)
    except ValueError:
        raise cur.fail(fld, f"unknown value type {raw}") from None


def _read_kvs(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, KVType]]:
    metadata: dict[str, Any] = {}
    types: dict[str, KVType] = {}
    for i in range(n_kv):
        key = cur.string(f"kv[{i}].key", strict=True)
        if not key:
            raise cur.fail(f"kv[{i}].key", "empty key")
        if key in metadata:
            raise cur.fail(key, "duplicate metadata key")
        vtype = _value_type(cur, f"{key} (value type)")
        kvtype = KVType(vtype)
        if vtype == ValueType.ARRAY:
            elem = _value_type(cur, f"{key} (array element type)")
            if elem == ValueType.ARRAY:
                raise cur.fail(key, "nested arrays are not supported")
            kvtype = KVType(vtype, elem)
        known = _KNOWN.get(key)
        if known is not None and not known[0](kvtype):
            raise cur.fail(key, f"stored as {kvtype}, must be {known[1]}")
        metadata[key] = (_read_array(cur, key, kvtype.elem) if vtype == ValueType.ARRAY
                         else _read_scalar(cur, key, vtype))
        types[key] = kvtype
    return metadata, types


def _read_scalar(cur: _Cursor, key: str, vtype: ValueType) -> Any:
    if vtype == ValueType.STRING:
        return cur.string(key, strict=False)
    code, dt = _FIXED[vtype]
    v = cur.scalar(code, dt.itemsize, key)
    if vtype == ValueType.BOOL:
        if v > 1:
            raise cur.fail(key, f"bool stored as {v}, must be 0 or 1")
        return bool(v)
    return v


def _read_array(cur: _Cursor, key: str, elem: ValueType) -> Any:
    n = cur.u64(f"{key} (array length)")
    if elem == ValueType.STRING:
        # Each string needs at least its 8-byte length: bound n before building the list.
        if n > cur.remaining() // 8:
            raise cur.fail(key, f"array of {n} strings cannot fit in the {cur.remaining()} "
                                f"bytes left in the file")
        return _read_string_array(cur, key, n)
    dt = _FIXED[elem][1]
    if n > cur.remaining() // dt.itemsize:
        raise cur.fail(key, f"array of {n} {elem} values ({n * dt.itemsize} bytes) runs past "
                            f"the end of the file ({cur.remaining()} bytes left)")
    arr = np.frombuffer(cur.buf, dtype=dt, count=n, offset=cur.pos)
    cur.pos += n * dt.itemsize
    return arr


def _read_string_array(cur: _Cursor, key: str, n: int) -> list[str]:
    # Inlined hot loop: tokenizer vocabularies hold ~10^5 strings.
    buf, size, pos = cur.buf, cur.size, cur.pos
    unpack = struct.Struct("<Q").unpack_from
    out: list[str] = []
    append = out.append
    for i in range(n):
        if pos + 8 > size:
            cur.pos = pos
            raise cur.fail(f"{key}[{i}]", "string length runs past the end of the file")
        ln = unpack(buf, pos)[0]
        pos += 8
        if ln > size - pos:
            cur.pos = pos
            raise cur.fail(f"{key}[{i}]", f"string of {ln} bytes runs past the end of the "
                                          f"file ({size - pos} bytes left)")
        append(buf[pos:pos + ln].decode("utf-8", "surrogateescape"))
        pos += ln
    cur.pos = pos
    return out


def _check_known_keys(cur: _Cursor, metadata: dict[str, Any], types: dict[str, KVType]) -> None:
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return
    prefix = arch + "."
    for key, t in types.items():
        if key.startswith(prefix):
            known = _ARCH_KNOWN.get(key[len(prefix):])
            if known is not None and not known[0](t):
                raise cur.fail(key, f"stored as {t}, must be {known[1]}")
    # Tokenizer arrays describe the same vocabulary: their lengths must agree.
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None:
        for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            if k in metadata and len(metadata[k]) != len(tokens):
                raise cur.fail(k, f"has {len(metadata[k])} entries but tokenizer.ggml.tokens "
                                  f"has {len(tokens)}")


def _alignment(cur: _Cursor, metadata: dict[str, Any]) -> int:
    a = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if a == 0 or a & (a - 1):
        raise cur.fail("general.alignment", f"{a} is not a nonzero power of two")
    return a


@dataclass
class _Info:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first)
    dtype: DType | None
    quant: QuantFormat | None
    offset: int
    nbytes: int


def _read_tensor_infos(cur: _Cursor, n: int) -> list[_Info]:
    infos: list[_Info] = []
    seen: set[str] = set()
    for i in range(n):
        name = cur.string(f"tensor[{i}].name", strict=True)
        if not name:
            raise cur.fail(f"tensor[{i}].name", "empty tensor name")
        fld = f"tensor {name}"
        if name in seen:
            raise cur.fail(fld, "duplicate tensor name")
        seen.add(name)
        n_dims = cur.u32(f"{fld} n_dims")
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise cur.fail(f"{fld} n_dims", f"{n_dims} dimensions (must be 1..{MAX_DIMS})")
        dims = [cur.u64(f"{fld} dims") for _ in range(n_dims)]
        count = _element_count(cur, fld, dims)
        dtype, quant = _tensor_type(cur, fld, cur.u32(f"{fld} type"))
        offset = cur.u64(f"{fld} offset")
        shape = tuple(reversed(dims))  # GGUF dims are innermost first
        if quant is not None:
            if dims[0] % quant.block_elems:
                raise cur.fail(f"{fld} dims", f"row of {dims[0]} elements is not a whole "
                                              f"number of {quant.name} blocks "
                                              f"({quant.block_elems} elements)")
            nbytes = count // quant.block_elems * quant.block_bytes
        else:
            nbytes = count * dtype.itemsize
        infos.append(_Info(name, shape, dtype, quant, offset, nbytes))
    return infos


def _element_count(cur: _Cursor, fld: str, dims: list[int]) -> int:
    count = 1
    for d in dims:
        if d > _INT64_MAX:
            raise cur.fail(f"{fld} dims", f"dimension {d} exceeds int64")
        count *= d
        if count > _INT64_MAX:
            raise cur.fail(f"{fld} dims", f"element count of {dims} overflows int64")
    # A tensor of zero elements is still an array numpy must shape: its other dimensions
    # may not multiply past what an array can span (2**60 elements of at most 8 bytes).
    extent = 1
    for d in dims:
        extent *= max(d, 1)
    if extent > _MAX_EXTENT:
        raise cur.fail(f"{fld} dims", f"dimensions {dims} span {extent} elements (zero "
                                      f"dimensions aside), more than 2**60")
    # Even at the smallest type (~0.5 byte/element) the data must fit in the file.
    if count > 2 * cur.size:
        raise cur.fail(f"{fld} dims", f"{count} elements cannot be stored in a file of "
                                      f"{cur.size} bytes")
    return count


def _tensor_type(cur: _Cursor, fld: str, t: int) -> tuple[DType | None, QuantFormat | None]:
    if t in _DENSE_GGML:
        return _DENSE_GGML[t], None
    if t in BY_GGML_TYPE:
        return None, BY_GGML_TYPE[t]
    if t in _GGML_NAMES:
        raise cur.fail(f"{fld} type", f"ggml type {_GGML_NAMES[t]} ({t}) is not supported")
    raise cur.fail(f"{fld} type", f"unknown ggml tensor type {t}")


def _map_tensors(cur: _Cursor, infos: list[_Info], data_offset: int,
                 alignment: int) -> dict[str, StoredTensor]:
    size = cur.size
    for t in infos:
        fld = f"tensor {t.name}"
        if t.offset % alignment:
            raise cur.fail(f"{fld} offset", f"data offset {t.offset} is not a multiple of the "
                                            f"alignment {alignment}")
        start = data_offset + t.offset
        if start > size or (t.nbytes and start >= size):
            raise cur.fail(f"{fld} offset", f"data starts at byte {start}, outside the file "
                                            f"of {size} bytes")
        if start + t.nbytes > size:
            raise cur.fail(f"{fld} data", f"needs {t.nbytes} bytes at {start} but the file "
                                          f"ends at {size} (truncated)")
    _check_overlaps(cur, infos)
    out: dict[str, StoredTensor] = {}
    for t in infos:
        start = data_offset + t.offset
        if t.quant is not None:
            row_bytes = t.shape[-1] // t.quant.block_elems * t.quant.block_bytes
            data = np.frombuffer(cur.buf, np.uint8, count=t.nbytes, offset=start)
            data = data.reshape(t.shape[:-1] + (row_bytes,))
        else:
            data = np.frombuffer(cur.buf, t.dtype.numpy, count=t.nbytes // t.dtype.itemsize,
                                 offset=start).reshape(t.shape)
        out[t.name] = StoredTensor(t.name, t.shape, t.dtype, t.quant, data, cur.path)
    return out


def _check_overlaps(cur: _Cursor, infos: list[_Info]) -> None:
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in infos if t.nbytes)
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise cur.fail(f"tensor {b} offset", f"data [{start_b}, ...) overlaps tensor {a} "
                                                 f"which ends at {end_a}")
