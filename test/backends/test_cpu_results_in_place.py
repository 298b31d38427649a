"""Dispatch functions compute their results in the caller's out-parameters
(:func:`poot.backends.cpu.results_in_place.write_results_in_place`): the copy that
``buffer-results-to-out-params`` adds is dropped where the copied buffer is an allocation (or
a reshape of one) used by nothing after the copy, in private functions and the step's entry
(whose out-parameters its callers never alias); every other copy stays. The whole step's
results are checked by the CPU suites (every compiled program goes through this)."""

from __future__ import annotations

from mlir import ir

from poot.backends.cpu.results_in_place import write_results_in_place
from poot.dialects import make_context

FILL = """
    %c = arith.constant 1.0 : f32
    linalg.fill ins(%c : f32) outs(%a : memref<4x8xf32>)"""


def _run(body: str, args: str, visibility: str = "private",
         entry: str | None = None) -> tuple[int, str]:
    text = (f"func.func {visibility} @d({args}) {{\n"
            f"    %a = memref.alloc() {{alignment = 64 : i64}} : memref<4x8xf32>{body}\n"
            "    return\n}")
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        n = write_results_in_place(module, entry)
        module.operation.verify()
        return n, str(module)


def test_an_allocation_copied_out_becomes_the_out_parameter():
    n, text = _run(FILL + "\n    memref.copy %a, %out : memref<4x8xf32> to memref<4x8xf32>",
                   "%out: memref<4x8xf32>")
    assert n == 1
    assert "memref.copy" not in text and "memref.alloc" not in text
    assert "outs(%arg0 : memref<4x8xf32>)" in text


def test_a_reshaped_allocation_becomes_the_inverse_reshape_of_the_out_parameter():
    n, text = _run(FILL + """
    %r = memref.expand_shape %a [[0], [1, 2]] output_shape [4, 1, 8]
        : memref<4x8xf32> into memref<4x1x8xf32>
    memref.copy %r, %out : memref<4x1x8xf32> to memref<4x1x8xf32>""", "%out: memref<4x1x8xf32>")
    assert n == 1
    assert "memref.copy" not in text and "memref.alloc" not in text
    assert "memref.collapse_shape %arg0" in text


def test_one_allocation_copied_into_two_results_is_computed_in_the_last_and_copied_once():
    """(The case MLIR's hoist-static-allocs crashes on.) The first copy has a use of the
    allocation after it, so only the last becomes in place: the other result is copied from
    it."""
    n, text = _run(FILL + """
    memref.copy %a, %o1 : memref<4x8xf32> to memref<4x8xf32>
    memref.copy %a, %o2 : memref<4x8xf32> to memref<4x8xf32>""",
                   "%o1: memref<4x8xf32>, %o2: memref<4x8xf32>")
    assert n == 1 and "memref.alloc" not in text
    assert "outs(%arg1 : memref<4x8xf32>)" in text
    assert text.count("memref.copy") == 1 and "memref.copy %arg1, %arg0" in text


def test_a_use_after_the_copy_keeps_it():
    n, text = _run(FILL + """
    memref.copy %a, %out : memref<4x8xf32> to memref<4x8xf32>
    %c2 = arith.constant 2.0 : f32
    linalg.fill ins(%c2 : f32) outs(%a : memref<4x8xf32>)""", "%out: memref<4x8xf32>")
    assert n == 0 and "memref.copy" in text


def test_an_out_parameter_read_elsewhere_keeps_its_copy():
    n, text = _run(FILL + """
    memref.copy %a, %out : memref<4x8xf32> to memref<4x8xf32>
    %i = arith.constant 0 : index
    %v = memref.load %out[%i, %i] : memref<4x8xf32>""", "%out: memref<4x8xf32>")
    assert n == 0 and "memref.copy" in text


def test_public_functions_keep_their_copies():
    """A public function's caller might bind an output to an array that is also an input."""
    n, text = _run(FILL + "\n    memref.copy %a, %out : memref<4x8xf32> to memref<4x8xf32>",
                   "%out: memref<4x8xf32>", visibility="")
    assert n == 0 and "memref.copy" in text


def test_the_named_entry_computes_its_results_in_its_out_parameters():
    """The step's entry: its callers never alias an out-parameter (CpuDevice.record refuses
    one, below), so its last copy (the logits) goes too."""
    copy = "\n    memref.copy %a, %out : memref<4x8xf32> to memref<4x8xf32>"
    n, text = _run(FILL + copy, "%out: memref<4x8xf32>", visibility="", entry="d")
    assert n == 1 and "memref.copy" not in text and "memref.alloc" not in text
    n, text = _run(FILL + copy, "%out: memref<4x8xf32>", visibility="", entry="other")
    assert n == 0 and "memref.copy" in text


def test_a_recording_refuses_an_output_that_overlaps_another_argument():
    import numpy as np
    import pytest

    from poot.backends.cpu.runtime import CpuDevice, CpuKernel
    from poot.dialects.types import DType, TensorType
    from poot.runtime.device import DeviceError, KernelArg

    t = TensorType((4,), DType.F32)
    kernel = CpuKernel([KernelArg("input", "x", t), KernelArg("output", "y", t)],
                       fn=None, engine=None)
    dev = CpuDevice()
    buf = np.zeros(8, np.float32)
    with pytest.raises(DeviceError, match="output 'y' is bound to memory that input 'x'"):
        dev.record(kernel, [buf[:4], buf[2:6]])
    dev.record(kernel, [buf[:4], buf[4:]])          # disjoint halves of one array: fine
