"""Lowering of the poot dialect to upstream MLIR: linalg on tensors, tensor, arith, math, scf.

One rule per op, beside its definition's family (``lowering/<family>.py`` mirrors
``ops/<family>.py``). A rule reads the op's Python attributes and types (from the op's one
definition, :mod:`poot.dialects.opdef`) and emits MLIR text for it through an
:class:`~poot.dialects.lowering.emit.Emitter`; :func:`lower_function` assembles the rules'
snippets into one ``func.func`` that uses only upstream dialects:

* step inputs stay the leading function arguments (``poot.name`` argument attributes);
* every weight (``poot.param``/``poot.packed_param``) becomes a trailing function argument,
  in first-use order, marked ``{poot.param = "<name>"}``; the function attribute
  ``poot.params`` lists their names in argument order. Packed weights are passed as their
  stored bytes, ``tensor<NBYTESxi8>`` (``poot.packed = "<format>"`` on the argument).
* i1 tensors are stored as i8 holding 0 or 1 (numpy's bool layout); bodies convert at the
  boundary, so scalars are i1 inside (:func:`~poot.dialects.lowering.emit.storage`).

Each rule must agree with the op's ``evaluate`` within the tolerance its tests state. An op a
rule cannot lower raises :class:`LoweringRefusal` naming the op and the missing capability.
"""

from __future__ import annotations

from poot.dialects.lowering.function import RULES, lower_function, lower_module
from poot.dialects.lowering.rules import LoweringRefusal, Strategy

__all__ = ["LoweringRefusal", "RULES", "Strategy", "lower_function", "lower_module"]
