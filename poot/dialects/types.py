"""Types of the poot dialect, on the Python side, and their MLIR spelling.

A poot value is either a dense tensor (MLIR's builtin ``tensor<4x8xf32>``, :class:`TensorType`)
or a packed block-quantized weight (``!poot.packed<#poot.q4_1, array<i64: rows, cols>>``,
:class:`PackedType`). Shapes are static: decode graphs have a constant shape by construction.
"""

from __future__ import annotations

import enum
import functools
import weakref
from dataclasses import dataclass

import numpy as np
from poot.lazy import lazy_module
ir = lazy_module("mlir.ir")

from poot.dialects.quant import BY_NAME, QuantFormat


class DType(enum.Enum):
    """Element types of poot tensors; the value is the MLIR spelling."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I8 = "i8"
    I1 = "i1"

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I64, DType.I32, DType.I8)

    @property
    def is_bool(self) -> bool:
        return self is DType.I1

    @property
    def itemsize(self) -> int:
        return np.dtype(self.numpy).itemsize

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype the CPU oracle stores this dtype in (bf16 via ml_dtypes)."""
        return _NUMPY[self] if self is not DType.BF16 else bfloat16()

    def mlir(self) -> ir.Type:
        return ir.Type.parse(self.value)

    @staticmethod
    def from_mlir(t: ir.Type) -> "DType":
        try:
            return DType(str(t))
        except ValueError:
            raise TypeError(f"element type {t} is not a poot dtype") from None

    @staticmethod
    def from_numpy(dt: np.dtype) -> "DType":
        dt = np.dtype(dt)
        for k, v in _NUMPY.items():
            if v == dt:
                return k
        if dt.name == "bfloat16" and dt == bfloat16():
            return DType.BF16
        raise TypeError(f"numpy dtype {dt} has no poot dtype")

    def __str__(self) -> str:
        return self.value


@functools.cache
def bfloat16() -> np.dtype:
    """``ml_dtypes.bfloat16``, imported on first use: the import costs about 0.6 s (its
    extension registers every cast and ufunc), which a CPU run of a quantized or f16
    checkpoint never needs."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


_NUMPY = {   # BF16: bfloat16()
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.I64: np.dtype(np.int64),
    DType.I32: np.dtype(np.int32),
    DType.I8: np.dtype(np.int8),
    DType.I1: np.dtype(np.bool_),
}


class _Shaped:
    """What a type with a static ``shape`` has: the shape normalized to a tuple of ints at
    construction, and its rank."""

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class TensorType(_Shaped):
    """A dense tensor: static ``shape`` (row-major) and ``dtype``."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(self.shape, dtype)

    def mlir(self) -> ir.Type:
        return ir.RankedTensorType.get(list(self.shape), self.dtype.mlir())

    def __str__(self) -> str:
        return f"tensor<{'x'.join(map(str, self.shape + (self.dtype.value,)))}>"


@dataclass(frozen=True)
class PackedType(_Shaped):
    """A packed weight: logical ``shape`` ``[..., rows, cols]`` stored in ``format`` blocks
    along ``cols`` (see :mod:`poot.dialects.quant`)."""

    format: QuantFormat
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.format.packed_bytes(self.shape)

    def mlir(self) -> ir.Type:
        dims = ", ".join(map(str, self.shape))
        return ir.Type.parse(f"!poot.packed<#poot.{self.format.name}, array<i64: {dims}>>")

    def __str__(self) -> str:
        return f"!poot.packed<#poot.{self.format.name}, array<i64: " \
               f"{', '.join(map(str, self.shape))}>>"


PootType = TensorType | PackedType


#: per MLIR context, type -> poot type: reading a type is 10 us, and the passes read the same
#: few hundred types hundreds of thousands of times (types are uniqued in their context, so
#: the MLIR type itself is the key; a context's entries go with it)
_READ: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def type_from_mlir(t: ir.Type) -> PootType:
    """Read a poot type from its MLIR form; raises TypeError for anything else."""
    ctx = t.context
    seen = _READ.get(ctx)
    if seen is None:
        seen = _READ[ctx] = {}
    got = seen.get(t)
    if got is None:
        got = seen[t] = _read_type(t)
    return got


def _read_type(t: ir.Type) -> PootType:
    if isinstance(t, ir.RankedTensorType):
        rt = t
        if not rt.has_static_shape:
            raise TypeError(f"{t}: poot tensors have static shapes")
        return TensorType(tuple(rt.shape), DType.from_mlir(rt.element_type))
    s = str(t)
    if s.startswith("!poot.packed<#poot."):
        # !poot.packed<#poot.q4_1, array<i64: 32, 64>>
        fmt, _, rest = s[len("!poot.packed<#poot."):].partition(",")
        dims = rest.strip().removeprefix("array<i64").removesuffix(">>").lstrip(":").strip()
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        return PackedType(BY_NAME[fmt.strip()], shape)
    raise TypeError(f"{t} is not a poot type")
