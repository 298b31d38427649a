"""Ops that introduce values: parameters (weights bound at load), constants and iota."""

from __future__ import annotations

import numpy as np

from poot.dialects.opdef import Attr, OpDef, register
from poot.dialects.types import DType, PackedType, TensorType


@register
class Param(OpDef):
    """A dense weight, bound by ``name`` from the weight store when the program is loaded."""

    name = "param"
    attrs = {"name": Attr("str", doc="the weight's role name")}
    summary = "dense weight bound by name at load time"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if not attrs["name"]:
            cls.fail("attribute 'name' must not be empty")
        return cls.need_result(result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        raise RuntimeError("parameters are bound by the evaluator, not evaluated")


@register
class PackedParam(OpDef):
    """A packed block-quantized weight, bound by ``name``; read by ``poot.dequantize``."""

    name = "packed_param"
    packed_result = True
    attrs = {"name": Attr("str")}
    summary = "packed quantized weight bound by name at load time"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        if not isinstance(result, PackedType):
            cls.fail(f"result must be !poot.packed, got {result}")
        if result.rank < 2:
            cls.fail(f"packed weights have rank >= 2, got shape {list(result.shape)}")
        if result.shape[-1] % result.format.block_elems:
            cls.fail(f"innermost dimension {result.shape[-1]} is not a multiple of the "
                     f"{result.format.name} block size {result.format.block_elems}")
        return result

    evaluate = Param.evaluate


@register
class Constant(OpDef):
    """A literal tensor; its type is the type of ``value``."""

    name = "constant"
    attrs = {"value": Attr("dense")}
    summary = "literal tensor"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        v = attrs["value"]
        inferred = TensorType(v.shape, DType.from_numpy(v.dtype))
        return cls.same_result(inferred, result)

    @classmethod
    def evaluate(cls, args, attrs, result):
        return np.asarray(attrs["value"])


@register
class Iota(OpDef):
    """``result[i_0, ..., i_n] = i_axis``, in the result's dtype (int or float)."""

    name = "iota"
    attrs = {"axis": Attr("i64")}
    summary = "index along an axis"

    @classmethod
    def check(cls, operands, attrs, result):
        cls.check_attrs(attrs)
        r = cls.need_result(result)
        if r.dtype.is_bool:
            cls.fail("result dtype must be int or float, got i1")
        cls.axis(attrs["axis"], r.rank)
        return r

    @classmethod
    def evaluate(cls, args, attrs, result):
        ax = attrs["axis"]
        shape = [1] * result.rank
        shape[ax] = result.shape[ax]
        idx = np.arange(result.shape[ax]).reshape(shape)
        return np.broadcast_to(idx, result.shape).astype(result.dtype.numpy)
