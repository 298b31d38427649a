"""``hoist_constant_loads``: loads of the step's constants move above the grid dependency
wait, speculated in bounds; everything else stays after it."""

from __future__ import annotations

import pytest

pytest.importorskip("mlir.ir")

from mlir import ir  # noqa: E402

from poot.backends.cuda.codegen import add_grid_dependency_control  # noqa: E402
from poot.backends.cuda.hoist_constant_loads import hoist_constant_loads  # noqa: E402

#: a LoRA-expand-like element-wise kernel: x (the predecessor's result), B (a weight),
#: the output; one element a thread under a bounds check, two ranks, one of them read
#: twice, and a loop whose address changes with its induction variable
EXPAND = """gpu.module @m {
  gpu.func @k(%x: memref<1x32xf32>, %b: memref<16x8192xi16>, %o: memref<8192xf32>,
              %t: memref<4x8xf32>) kernel {
    %c256 = arith.constant 256 : index
    %c8192 = arith.constant 8192 : index
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %tid = gpu.thread_id x
    %bid = gpu.block_id x
    %0 = arith.muli %bid, %c256 : index
    %1 = arith.addi %0, %tid : index
    %2 = arith.cmpi ult, %1, %c8192 : index
    scf.if %2 {
      %a = memref.load %x[%c0, %c0] : memref<1x32xf32>
      %w = memref.load %b[%c0, %1] : memref<16x8192xi16>
      %w1 = memref.load %b[%c1, %1] : memref<16x8192xi16>
      %w2 = memref.load %b[%c0, %1] : memref<16x8192xi16>
      %s = arith.addi %w, %w1 : i16
      %s2 = arith.addi %s, %w2 : i16
      %f = arith.uitofp %s2 : i16 to f32
      %r = arith.mulf %a, %f : f32
      %acc = scf.for %i = %c0 to %c4 step %c1 iter_args(%v = %r) -> (f32) {
        %y = memref.load %t[%i, %c0] : memref<4x8xf32>
        %z = arith.addf %v, %y : f32
        scf.yield %z : f32
      }
      memref.store %acc, %o[%1] : memref<8192xf32>
    }
    gpu.return
  }
}"""


def _hoisted(text: str, consts: dict, limit: int = 96):
    """(loads hoisted, [(block, op names before its wait, op names after)])."""
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    with ctx:
        m = ir.Module.parse(text)
        add_grid_dependency_control(m)
        n = hoist_constant_loads(m, consts, limit=limit)
        assert m.operation.verify()
        f = m.body.operations[0].regions[0].blocks[0].operations[0]
        out = []
        blocks = [f.regions[0].blocks[0]] + [
            b for o in f.regions[0].blocks[0].operations if o.operation.name == "scf.if"
            for r in o.operation.regions for b in r.blocks]
        for b in blocks:
            ops = [o.operation for o in b.operations]
            names = [o.name for o in ops]
            if "nvvm.griddepcontrol" in names:
                w = names.index("nvvm.griddepcontrol")
                out.append(([str(o) for o in ops[:w]], [str(o) for o in ops[w:]]))
        return n, out


def test_constant_loads_move_above_the_wait_in_bounds():
    """B's loads (argument 1, a constant) move above the wait inside the bounds check, their
    column clamped to the memref (speculated: the index could be out of bounds where the
    branch is not taken), the repeated element loaded once; x (argument 0, the
    predecessor's result) is read after the wait; the loop's loads of argument 3 stay in
    the loop even though it is constant (their address changes with the loop)."""
    n, [(before, after)] = _hoisted(EXPAND, {"k": {1, 3}})
    assert n == 2
    loads = [s for s in before if "memref.load" in s]
    assert len(loads) == 2 and all("%arg1[" in s for s in loads)
    assert sum("arith.minui" in s for s in before) == 1       # one clamp, shared
    assert any("arith.constant 8191" in s for s in before)
    assert "memref.load %arg1" not in "\n".join(after)
    assert "memref.load %arg0" in "\n".join(after)
    assert "memref.load %arg3" in "\n".join(after)


def test_nothing_moves_without_constant_arguments():
    n, [(before, after)] = _hoisted(EXPAND, {"k": {2}})
    assert n == 0 and not [s for s in before if "memref.load" in s]
    n, _ = _hoisted(EXPAND, {})
    assert n == 0


def test_limit_caps_the_registers_held_across_the_wait():
    n, [(before, _)] = _hoisted(EXPAND, {"k": {1}}, limit=1)
    assert n == 1 and sum("memref.load" in s for s in before) == 1


def test_single_trip_loop_loads_are_speculated_at_the_lower_bound():
    """``for i = tid to 256 step 512`` runs at most once with i = tid: its constant loads
    move above the wait indexed by the lower bound (clamped); a loop that may run twice
    (step 128) keeps its loads."""
    def kernel(step: int) -> str:
        return f"""gpu.module @m {{
  gpu.func @k(%w: memref<256xf32>, %o: memref<256xf32>) kernel {{
    %c256 = arith.constant 256 : index
    %step = arith.constant {step} : index
    %tid = gpu.thread_id x
    scf.for %i = %tid to %c256 step %step {{
      %v = memref.load %w[%i] : memref<256xf32>
      memref.store %v, %o[%i] : memref<256xf32>
    }}
    gpu.return
  }}
}}"""
    n, [(before, after)] = _hoisted(kernel(512), {"k": {0}})
    assert n == 1
    assert any("memref.load %arg0" in s for s in before)
    assert any("arith.minui %thread_id_x" in s for s in before)
    n, [(before, after)] = _hoisted(kernel(128), {"k": {0}})
    assert n == 0 and "memref.load %arg0" in "\n".join(after)
    # a lower bound that may be negative (signed compare: tid - 32 can run twice)
    neg = kernel(512).replace("scf.for %i = %tid", "%c32 = arith.constant 32 : index\n"
                              "    %lb = arith.subi %tid, %c32 : index\n"
                              "    scf.for %i = %lb")
    n, [(before, after)] = _hoisted(neg, {"k": {0}})
    assert n == 0 and "memref.load %arg0" in "\n".join(after)


def test_fused_kernel_members_hoist_above_their_own_wait():
    """A horizontally fused kernel waits in each member's branch: each member's constant
    loads go above its own wait (the limit counts per wait), never to the kernel's top."""
    text = """gpu.module @m {
  gpu.func @k(%w: memref<64xf32>, %o: memref<64xf32>, %c: i1, %d: i1) kernel {
    %i = gpu.thread_id x
    scf.if %c {
      %v = memref.load %w[%i] : memref<64xf32>
      memref.store %v, %o[%i] : memref<64xf32>
    }
    scf.if %d {
      %v = memref.load %w[%i] : memref<64xf32>
      %v2 = arith.addf %v, %v : f32
      memref.store %v2, %o[%i] : memref<64xf32>
    }
    gpu.return
  }
}"""
    n, blocks = _hoisted(text, {"k": {0}}, limit=1)
    assert n == 2 and len(blocks) == 2
    for before, after in blocks:
        assert sum("memref.load %arg0" in s for s in before) == 1
        assert "memref.load" not in "\n".join(after)
