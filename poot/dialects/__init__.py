"""The poot primitive dialect: types, op definitions (one per op), IRDL and verification.

Use :func:`make_context` for an MLIR context with the dialect loaded, and
:func:`poot.dialects.verify.verify_module` to check poot ops beyond IRDL's structural rules.
"""

from poot.dialects.irdl import irdl_text, load_dialect, make_context
from poot.dialects.opdef import REGISTRY, OpDef, VerifyError, lookup
from poot.dialects.types import DType, PackedType, TensorType

__all__ = ["irdl_text", "load_dialect", "make_context", "REGISTRY", "OpDef", "VerifyError",
           "lookup", "DType", "PackedType", "TensorType"]
