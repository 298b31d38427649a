"""The prefill GEMM on AMD matrix instructions (:data:`~poot.backends.gpu.strategies.gemm.
MFMA_16X16X16` on CDNA, :data:`~poot.backends.gpu.strategies.gemm.WMMA_16X16X16` on RDNA 3).

No AMD GPU is on these machines, so: the lane maps against entries of AMD's tables (written
out here, not computed by the strategy); which targets get which instruction; the whole
kernel with each AMD instruction's lane layout -- 64-lane wavefronts with 16 x 16 tiles, or
32 lanes with 8 accumulators each -- run on lavapipe with the instruction emulated from
workgroup memory, against the f32 oracle within the strategy's stated error bound; and the
ROCDL lowering of the same kernel, whose AMDGCN assembly has the instruction for every arch
(``test/rocm/test_rocm_codegen.py`` checks the code objects' descriptors). What none of this
shows: that the operand loads feed the hardware the layout its tables describe (checked
against the tables, never on an AMD device) and the kernel's speed.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

from test_gpu_gemm import _within_bound
from test_gpu_matmul import gemv_region

# ---- lane maps ---------------------------------------------------------------------------------

#: (lane, element) -> (row m, column n) of D, entries of AMD's tables (Matrix Instruction
#: Calculator for v_mfma_f32_16x16x16_f16 on CDNA 3: "D[i][j]: lane = j + 16 * (i / 4),
#: item = i % 4"; RDNA 3 ISA, WMMA 16x16x16 f32 D: "lane = j + 16 * (i % 2), item = i / 2")
MFMA_D = {(0, 0): (0, 0), (0, 3): (3, 0), (15, 1): (1, 15), (16, 0): (4, 0), (17, 2): (6, 1),
          (47, 3): (11, 15), (63, 3): (15, 15)}
WMMA_D = {(0, 0): (0, 0), (0, 7): (14, 0), (16, 0): (1, 0), (19, 2): (5, 3), (31, 7): (15, 15),
          (5, 4): (8, 5)}
#: (lane, element) -> (row of A or column of B, k): MFMA "A[i][k]: lane = i + 16 * (k / 4),
#: item = k % 4"; WMMA: lane l holds row l % 16, k = item (lanes 16-31 repeat 0-15)
MFMA_AB = {(0, 0): (0, 0), (1, 3): (1, 3), (17, 2): (1, 6), (35, 0): (3, 8), (63, 3): (15, 15)}
WMMA_AB = {(0, 15): (0, 15), (3, 7): (3, 7), (19, 7): (3, 7), (31, 0): (15, 0)}


@pytest.mark.parametrize("name,d,ab", [("MFMA_16X16X16", MFMA_D, MFMA_AB),
                                       ("WMMA_16X16X16", WMMA_D, WMMA_AB)])
def test_lane_maps_are_amds_tables(name, d, ab):
    """The strategy's maps agree with the tables' entries, and every element of D is one
    lane's accumulator exactly once (every lane holds accs of them)."""
    from poot.backends.gpu.strategies import gemm as G

    op = getattr(G, name)
    for (lane, i), want in d.items():
        assert op.c_fragment(lane, i) == want, (lane, i)
    for (lane, i), want in ab.items():
        assert op.ab_fragment(lane, i) == want, (lane, i)
    owners = [op.c_fragment(lane, i) for lane in range(op.wave) for i in range(op.accs)]
    assert sorted(owners) == [(m, n) for m in range(16) for n in range(op.n)]
    # A: each 16 x 16 element is in some lane; MFMA: exactly once, WMMA: twice (repeated)
    held = [op.ab_fragment(lane, i) for lane in range(op.wave) for i in range(op.ka)]
    assert sorted(set(held)) == [(r, k) for r in range(16) for k in range(16)]
    assert len(held) == 256 * (op.wave * op.ka // 256)


def test_targets_choose_their_matrix_instruction():
    """mma.sync on sm_80+, MFMA on the CDNA archs, WMMA on the RDNA 3 archs, none on
    Vulkan/lavapipe: the decision is the target's features and subgroup size."""
    from dataclasses import replace

    from poot.backends.cuda.codegen import cuda_target
    from poot.backends.gpu.strategies import gemm as G
    from poot.backends.rocm.target import rocm_target
    from poot.backends.vulkan.codegen import vulkan_target

    assert G.matrix_op(cuda_target().caps) is G.MMA_SYNC
    assert G.matrix_op(rocm_target("gfx90a").caps) is G.MFMA_16X16X16
    assert G.matrix_op(rocm_target("gfx942").caps) is G.MFMA_16X16X16
    assert G.matrix_op(rocm_target("gfx1100").caps) is G.WMMA_16X16X16
    assert G.matrix_op(rocm_target("gfx1151").caps) is G.WMMA_16X16X16
    assert G.matrix_op(vulkan_target().caps) is None
    # the feature without its subgroup size is not enough
    caps = rocm_target("gfx942").caps
    assert G.matrix_op(replace(caps, subgroup_size=32)) is None


@pytest.mark.parametrize("name", ["MFMA_16X16X16", "WMMA_16X16X16"])
def test_tiling_fits_sixteen_column_tiles(name):
    """Every block tile gives each subgroup whole 16 x 16 tiles; threads are subgroups times
    the instruction's lanes."""
    from poot.backends.gpu.strategies import gemm as G

    op = getattr(G, name)
    for M in (9, 20, 40, 100, 300):
        for N in (16, 40, 100, 2048):
            t = G.choose_tiling(M, N, 2048, 104, 64 * 1024, False, op)
            assert t.WTM % 16 == 0 and t.WTN % op.n == 0 and t.mt >= 1 and t.nt >= 1
            assert t.T == t.WM * t.WN * op.wave <= 1024
            assert t.smem_bytes <= 64 * 1024


# ---- the whole kernel on lavapipe, the AMD instruction emulated ---------------------------------

#: (format, M, N, K, epilogue, forced (BM, BN, BK) or None): ragged M/N, K % 8 != 0, packed
#: decoders, BM 128 (8 wavefronts of 64 lanes: 512 threads), BK 64/128
_CASES = [("bf16", 77, 100, 100, "residual", None),
          ("bf16", 19, 40, 36, "silu_up", None),
          ("f16", 9, 72, 40, "residual", None),
          ("q4_0", 33, 100, 576, "silu_up", None),
          ("q4_k", 20, 48, 512, "none", None),
          ("q4_1", 16, 64, 384, "none", (16, 32, 128)),
          ("q8_0", 50, 40, 256, "residual", (64, 32, 64))]


@pytest.mark.parametrize("name", ["MFMA_16X16X16", "WMMA_16X16X16"])
@pytest.mark.parametrize("fmt,M,N,K,epilogue,tile", _CASES)
def test_emulated_amd_kernel_matches_oracle(vk, monkeypatch, name, fmt, M, N, K, epilogue,
                                            tile):
    """Tiling, staging, decode, double buffering and the epilogue with the AMD
    instruction's accumulator layout, on lavapipe: within the stated bound of the oracle."""
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies import gemm as G

    dev, target = vk
    monkeypatch.setattr(G, "EMULATE_MMA", getattr(G, name))
    monkeypatch.setattr(G, "FORCE_TILING", tile)
    g, inputs = gemv_region(fmt, M, N, K, epilogue, seed=M + N + K)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), target.caps)
    assert set(plan.strategies) == {"gemm"}
    block = [L["block"][0] for L in plan.launches if L["op"] == "kernel"][0]
    assert block % getattr(G, name).wave == 0
    _within_bound(dev, target, g, inputs, fmt, M, N, K, epilogue)


@pytest.mark.parametrize("name", ["MFMA_16X16X16", "WMMA_16X16X16"])
def test_emulated_amd_split_k_matches_oracle(vk, monkeypatch, name):
    """Split-K slices with the AMD layout: the partials' kernel and the reduction."""
    from poot.backends.gpu.plan import plan_program
    from poot.backends.gpu.strategies import gemm as G

    dev, target = vk
    monkeypatch.setattr(G, "EMULATE_MMA", getattr(G, name))
    monkeypatch.setattr(G, "FORCE_TILING", (32, 32, 64))
    monkeypatch.setattr(G, "FORCE_SPLIT", 3)
    g, inputs = gemv_region("bf16", 40, 70, 520, "residual", seed=5)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), target.caps)
    assert [L["grid"][2] for L in plan.launches if L["op"] == "kernel"] == [3, 1]
    _within_bound(dev, target, g, inputs, "bf16", 40, 70, 520, "residual")


# ---- the ROCDL lowering: the instruction in every arch's assembly --------------------------------

#: arch -> the assembly spelling of the f16 and bf16 instructions (LLVM's AMDGPU names: gfx90a
#: keeps the CDNA 2 spellings, gfx942 the CDNA 3 ones)
ISA = {"gfx90a": ("v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16bf16_1k"),
       "gfx942": ("v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16_bf16"),
       "gfx1100": ("v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"),
       "gfx1151": ("v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16")}


def _rocm_tools():
    from poot.backends.rocm.codegen import tools_missing

    if tools_missing() is not None:
        pytest.skip(f"ROCm code generation tools: {tools_missing()}")


@pytest.mark.parametrize("arch", sorted(ISA))
@pytest.mark.parametrize("fmt", ["bf16", "f16", "q4_1"])
def test_rocdl_lowering_uses_the_matrix_instruction(arch, fmt):
    """A prefill GEMM region planned for ``arch`` lowers through ROCDL to assembly with the
    arch's matrix instruction (bf16 weights: the bf16 form; f16 and packed: f16), vector
    reads of workgroup memory, and no scratch (spilled registers)."""
    from mlir import ir

    from poot.backends.gpu.plan import plan_program
    from poot.backends.rocm import codegen as C
    from poot.backends.rocm.target import rocm_target

    _rocm_tools()
    g, _ = gemv_region(fmt, 64, 128, 256, "residual", seed=1)
    plan = plan_program(SimpleNamespace(graph=g, storage=[]), rocm_target(arch).caps)
    assert set(plan.strategies) == {"gemm"}
    module = ir.Module.parse(str(plan.module), context=plan.module.context)
    asm = C.isa(C.link_device_library(C.lower_to_llvm_ir(module, arch)), arch)
    f16, bf16 = ISA[arch]
    want = bf16 if fmt == "bf16" else f16
    used = set(re.findall(r"\bv_(?:mfma|wmma)\w*", asm))
    assert used == {want}, used
    assert re.search(r"\bds_(?:read|load)_?b(?:64|128)|\bds_read2_b64", asm)
    assert all(int(v) == 0 for v in re.findall(r"\.private_segment_fixed_size:\s+(\d+)", asm))
