"""Typed, memory-mapped weights: :class:`StoredTensor`, :class:`WeightStore` (opened by
:func:`poot.load.checkpoint.open_weights`).

A checkpoint is opened without copying: every tensor's ``data`` is a numpy view into a
read-only ``mmap`` of its file. Dense tensors keep their stored element type (BF16 stays
16-bit words, F16 stays float16); packed GGUF tensors keep their quant blocks as stored
(``uint8`` rows of blocks, see :mod:`poot.dialects.quant`). Nothing is converted to float32
here; dequantization is the compiler's job (or :mod:`poot.dialects.quant_ref` in tests).
"""

from __future__ import annotations

import enum
import mmap
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from poot.dialects.quant import QuantFormat
from poot.load.errors import LoadError


class DType(str, enum.Enum):
    """Dense element types a stored tensor may have (value = short name used in IR and CLI)."""

    F64 = "f64"
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F8_E4M3 = "f8e4m3"
    F8_E5M2 = "f8e5m2"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U64 = "u64"
    U32 = "u32"
    U16 = "u16"
    U8 = "u8"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        """The little-endian numpy dtype of one stored element (BF16/F8 via ml_dtypes,
        imported on first use)."""
        dt = _NUMPY.get(self)
        if dt is None:
            import ml_dtypes

            dt = _NUMPY[self] = np.dtype({DType.BF16: ml_dtypes.bfloat16,
                                          DType.F8_E4M3: ml_dtypes.float8_e4m3fn,
                                          DType.F8_E5M2: ml_dtypes.float8_e5m2}[self])
        return dt

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    def __str__(self) -> str:
        return self.value


_NUMPY: dict[DType, np.dtype] = {   # BF16 and F8 added on first use (DType.numpy)
    DType.F64: np.dtype("<f8"), DType.F32: np.dtype("<f4"), DType.F16: np.dtype("<f2"),
    DType.I64: np.dtype("<i8"),
    DType.I32: np.dtype("<i4"), DType.I16: np.dtype("<i2"), DType.I8: np.dtype("i1"),
    DType.U64: np.dtype("<u8"), DType.U32: np.dtype("<u4"), DType.U16: np.dtype("<u2"),
    DType.U8: np.dtype("u1"), DType.BOOL: np.dtype("?"),
}
_ITEMSIZE: dict[DType, int] = {**{k: v.itemsize for k, v in _NUMPY.items()},
                               DType.BF16: 2, DType.F8_E4M3: 1, DType.F8_E5M2: 1}


@dataclass(frozen=True, eq=False)
class StoredTensor:
    """One tensor as stored in a checkpoint.

    Attributes:
        name: the checkpoint's tensor name (GGUF ``blk.0.attn_q.weight``, HF ``model.layers...``).
        shape: logical shape in numpy (row-major, outermost first) order. GGUF stores dims
            innermost first; the GGUF reader reverses them.
        dtype: the dense element type, or None when the tensor is packed.
        quant: the packed block format (:class:`~poot.dialects.quant.QuantFormat`), or None.
        data: a numpy view of the stored bytes. Dense: ``dtype.numpy`` elements of ``shape``.
            Packed: ``uint8`` of shape ``shape[:-1] + (shape[-1] // block_elems * block_bytes,)``
            (each row a whole number of blocks; blocks never cross rows).
        source: the file the bytes come from.
    """

    name: str
    shape: tuple[int, ...]
    dtype: DType | None
    quant: QuantFormat | None
    data: np.ndarray
    source: str

    @property
    def nbytes(self) -> int:
        """Stored bytes (packed bytes for quantized tensors)."""
        return int(self.data.nbytes)

    @property
    def is_packed(self) -> bool:
        return self.quant is not None

    @property
    def format(self) -> str:
        """``"f32"``, ``"bf16"``, ... or the quant format name (``"q4_1"``)."""
        return self.quant.name if self.quant is not None else self.dtype.value

    @property
    def is_mapped(self) -> bool:
        """True when ``data`` is a view of a file mapping (costs no process memory)."""
        return _is_mapped(self.data)

    def take_rows(self, index: np.ndarray | list[int]) -> "StoredTensor":
        """A new tensor whose row ``i`` is this tensor's row ``index[i]`` (along axis 0).

        Packed tensors stay packed: the copy moves whole rows of blocks, which is exact because
        quant blocks never cross rows. The result owns its memory (counted by
        :meth:`WeightStore.resident_bytes` if put into a store). Raises ValueError for a
        0-d tensor or an index out of range.
        """
        idx = np.asarray(index, dtype=np.int64)
        if not self.shape or idx.ndim != 1:
            raise ValueError(f"{self.name}: take_rows needs a 1-D index and a tensor of rank >= 1")
        if idx.size and (idx.min() < -self.shape[0] or idx.max() >= self.shape[0]):
            raise ValueError(f"{self.name}: row index out of range for {self.shape[0]} rows")
        data = np.take(self.data, idx, axis=0)
        return replace(self, shape=(int(idx.size),) + self.shape[1:], data=data)

    def __repr__(self) -> str:
        return f"StoredTensor({self.name!r}, {self.format}, {list(self.shape)}, {self.nbytes} B)"


def _is_mapped(a: np.ndarray) -> bool:
    """Walk numpy's ``base`` chain to the buffer owner; mapped if that is an mmap."""
    base: Any = a
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer(mmap) keeps a memoryview of the map
        base = base.obj
    return isinstance(base, mmap.mmap)


def llama_rotary_permute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order of llama.cpp's ``convert_hf_to_gguf`` Q/K permutation.

    The converter stores ``w.reshape(n_head, 2, n_rows // n_head // 2, cols).swapaxes(1, 2)``
    (HF's "rotate half" layout -> ggml's interleaved pairs): the returned ``P`` satisfies
    ``gguf[r] = hf[P[r]]``, so ``hf_rows[P]`` lays out any HF-ordered rows of that
    projection (a LoRA ``lora_B``, a bias) as the GGUF file does. ``n_head`` is the head count
    of that tensor (KV heads for K). Returns int64 of shape ``[n_rows]``; ValueError if rows
    do not split into ``n_head`` heads of even size.
    """
    if n_head <= 0 or n_rows % (2 * n_head):
        raise ValueError(f"{n_rows} rows do not split into {n_head} heads of even size")
    return np.arange(n_rows, dtype=np.int64).reshape(n_head, 2, n_rows // n_head // 2) \
        .swapaxes(1, 2).reshape(-1)


def llama_rotary_unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's ``convert_hf_to_gguf`` Q/K permutation: the inverse
    ``Q = argsort(P)`` of :func:`llama_rotary_permute_rows`, so
    ``gguf_tensor.take_rows(Q) == hf_tensor``. Returns int64 of shape ``[n_rows]``; ValueError
    if rows do not split into ``n_head`` heads of even size.
    """
    return np.argsort(llama_rotary_permute_rows(n_rows, n_head)).astype(np.int64)


class WeightStore(Mapping[str, StoredTensor]):
    """Tensors by name over one or more mapped files, in file order.

    Attributes:
        kind: ``"gguf"`` or ``"safetensors"``.
        files: the files the tensors come from.
        metadata: GGUF key/values (see :class:`poot.load.gguf.GGUFFile`) or the safetensors
            ``__metadata__`` string map(s), merged.
        gguf: the parsed :class:`~poot.load.gguf.GGUFFile` for GGUF checkpoints, else None.
        root: the path the store was opened from.
    """

    def __init__(self, tensors: dict[str, StoredTensor], *, kind: str, files: list[str],
                 metadata: dict[str, Any] | None = None, gguf: Any = None, root: str = ""):
        self._tensors = tensors
        self.kind, self.files, self.root = kind, list(files), root
        self.metadata = metadata or {}
        self.gguf = gguf

    def __getitem__(self, name: str) -> StoredTensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def replace(self, tensor: StoredTensor) -> None:
        """Put ``tensor`` under its name (for example a row-permuted copy from take_rows)."""
        self._tensors[tensor.name] = tensor

    def resident_bytes(self) -> int:
        """Bytes of tensor data copied into process memory (not backed by a file mapping).

        ~0 right after :func:`~poot.load.checkpoint.open_weights`; grows only by what callers
        copy in (take_rows).
        """
        return sum(t.nbytes for t in self._tensors.values() if not t.is_mapped)

    def mapped_bytes(self) -> int:
        """Bytes of tensor data served straight from file mappings (paged in on demand)."""
        return sum(t.nbytes for t in self._tensors.values() if t.is_mapped)

    def __repr__(self) -> str:
        return f"WeightStore({self.kind}, {len(self)} tensors, {self.root!r})"


def map_file(path: str) -> tuple[mmap.mmap | None, int]:
    """``(read-only mapping of the file at path, its size in bytes)``; the mapping is None for
    an empty file. Raises :class:`~poot.load.errors.LoadError` for a file that cannot be
    opened, is not a regular file or cannot be mapped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise LoadError(path, "file", e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LoadError(path, "file", "not a regular file")
        try:
            return (mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else None), \
                st.st_size
        except (OSError, ValueError) as e:
            raise LoadError(path, "file", f"cannot be memory-mapped ({e})") from None
    finally:
        os.close(fd)
