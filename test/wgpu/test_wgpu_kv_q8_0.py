"""The q8_0 KV cache on wgpu (lavapipe in CI), whose SPIR-V has no 16-bit storage: the f16
scales planes keep their f16 bytes and the kernels move them as 32-bit words, two scales a
word. The KV write (the scatter that quantizes K/V into the pools) gives numpy's q8_0 bytes
and scales exactly, also where one word holds the scales of two heads or of two positions;
the flash-decoding kernel equals a straight numpy dequantize-then-attend; planning takes q8_0
and still refuses fp8 by name."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlir.ir", reason="the MLIR wheels are not installed here: this module "
                    "compiles kernels")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from test_gpu_attention_q8_0 import q8_inputs, q8_region  # noqa: E402
from test_vulkan_kernels import run_artifact  # noqa: E402

from poot.dialects.kv_quant import quantize_q8_0  # noqa: E402
from poot.dialects.types import DType, TensorType  # noqa: E402

#: against numpy in f64 (the kernels accumulate in f32)
RTOL = ATOL = 1e-4


def _with_cores(target, cores):
    from dataclasses import replace

    from poot.compiler.target import Target

    return Target(target.backend, replace(target.caps, cores=cores))


def kv_write_graph(NB, bs, H, D, N):
    """A step that quantizes ``new`` f32 ``[N, H, D]`` as the model does
    (:func:`poot.models.blocks.quantize_q8_0`) and scatters values and scales into the q8_0
    pool planes ``kv.k`` i8 ``[NB, bs, H, D]`` and ``kv.k_scale`` f16 ``[NB, bs, H, D / 32]``
    at ``index`` i32 ``[N, 2]`` (block, offset)."""
    from poot.graph.builder import Builder, TraceLimits
    from poot.models.blocks import quantize_q8_0 as trace_q8_0

    b = Builder(TraceLimits(max_values=256, max_ops=256, max_literal_bytes=1 << 16,
                            max_owned_bytes=1 << 30), name="kv_write")
    vals = b.input("kv.k", TensorType((NB, bs, H, D), DType.I8))
    scales = b.input("kv.k_scale", TensorType((NB, bs, H, D // 32), DType.F16))
    new = b.input("new", TensorType((N, H, D), DType.F32))
    index = b.input("index", TensorType((N, 2), DType.I32))
    q, d = trace_q8_0(b, new)
    vals, scales = b.scatter(vals, index, q), b.scatter(scales, index, d)
    # read back as the step's attention reads them: what marks the f16 plane as q8_0
    # scales (kept f16 by poot-legalize); this whole-pool read is not checked here (the
    # engine's attention reads the pools in place, test_q8_0_paged_attention_...)
    return b.finish({"values": vals, "scales": scales,
                     "keys": b.op("dequantize_q8_0", [vals, scales])})


#: (NB, bs, H, D, rows): head dim 32 (the scales of two or four heads share 32-bit words), 64
#: and 128 (3 heads: 6 scales a position), rows that repeat a slot (the later wins) or fall
#: outside (dropped)
WRITES = [(4, 16, 2, 32, [(1, 3), (0, 0), (2, 15), (1, 3)]),
          (3, 16, 4, 32, [(0, 4), (0, 5), (2, 8), (1, 15), (-1, 2), (0, 7)]),
          (3, 16, 3, 64, [(1, 0), (1, 1), (0, 9)]),
          (2, 16, 2, 128, [(1, 2), (0, 3), (1, 2)])]


@pytest.mark.parametrize("case", WRITES, ids=lambda c: f"H{c[2]}-D{c[3]}-N{len(c[4])}")
def test_kv_write_gives_numpys_q8_0_bytes(wg_device, wg_target, case):
    from poot.backends.vulkan.codegen import compile_vulkan

    NB, bs, H, D, rows = case
    rng = np.random.default_rng(len(rows) + D)
    g = kv_write_graph(NB, bs, H, D, len(rows))
    old_q = rng.integers(-128, 128, (NB, bs, H, D)).astype(np.int8)
    old_d = rng.standard_normal((NB, bs, H, D // 32)).astype(np.float16)
    new = (rng.standard_normal((len(rows), H, D)) * rng.choice([1e-6, 1e-3, 1, 300],
                                                               (len(rows), H, 1))
           ).astype(np.float32)
    new[0, 0, :32] = 0                                  # a zero group: d = 0, q = 0
    index = np.array(rows, np.int32)
    want_q, want_d = old_q.copy(), old_d.copy()
    q, d = quantize_q8_0(new)
    for n, (blk, off) in enumerate(rows):
        if 0 <= blk < NB and 0 <= off < bs:
            want_q[blk, off], want_d[blk, off] = q[n], d[n]
    art = compile_vulkan(g, wg_target).executable
    got = run_artifact(wg_device, art, {"kv.k": old_q, "kv.k_scale": old_d, "new": new,
                                        "index": index})
    np.testing.assert_array_equal(np.asarray(got["values"]).view(np.int8).reshape(want_q.shape),
                                  want_q)
    np.testing.assert_array_equal(np.asarray(got["scales"]).view(np.uint16).reshape(
        want_d.shape), want_d.view(np.uint16))


def test_kv_write_of_scales_straddling_words_is_refused(wg_target):
    """Three heads of 32: a position's 3 scales do not fill whole words, so two positions'
    writes would share one: a typed refusal, naming the scatter."""
    from poot.backends.vulkan.codegen import compile_vulkan
    from poot.compiler.planning import Refusal

    with pytest.raises(Refusal, match="poot.scatter.*multiple of 2"):
        compile_vulkan(kv_write_graph(3, 16, 3, 32, 2), wg_target)


#: (B, Hkv, G, NB, bs, TW, D, mask, lengths): head dims 32, 64 and 128, GQA 4 and 2 and MHA,
#: contexts ending inside a block, several sequences, one that sees nothing
ATTENTION = [
    (3, 2, 4, 40, 16, 12, 32, "i1", (150, 37, 0)),
    (2, 2, 2, 40, 16, 16, 64, "f32", (45, 200)),
    (2, 1, 1, 24, 16, 8, 128, "i1", (100, 5)),
]


@pytest.mark.parametrize("case", ATTENTION, ids=lambda c: f"D{c[6]}-G{c[2]}-{c[7]}")
def test_q8_0_paged_attention_matches_numpy_on_wgpu(wg_device, wg_target, case):
    """The strategy reads the scales planes as 32-bit words (planned for 1 and 1000 cores:
    one launch, or split + combine) and equals numpy's dequantize-then-attend; stale rows'
    inf scales never leak."""
    from poot.backends.gpu.strategies.attention import match_attention, plan_attention
    from poot.backends.vulkan.codegen import codegen_vulkan
    from test_gpu_attention import _callee

    *shape, lengths = case
    g = q8_region(*shape)
    feed, want = q8_inputs(*shape, lengths, seed=ATTENTION.index(case))
    reg = match_attention(_callee(g))
    for cores in (1, 1000):
        target = _with_cores(wg_target, cores)
        plan = plan_attention(reg, target.caps)
        assert plan is not None and plan.scale_words
        got = run_artifact(wg_device, codegen_vulkan(g, target), feed)["r0"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"cores={cores} {plan}")


def test_planning_takes_q8_0_and_refuses_fp8_on_wgpu():
    """wgpu lists q8_0 among its KV formats; fp8 is a typed refusal naming the option."""
    from poot.api.memory import check_kv_storage
    from poot.backends.wgpu.target import wgpu_target
    from poot.dialects.kv_quant import FP8, Q8_0
    from poot.sampling_params import InvalidRequest

    target = wgpu_target()
    assert "q8_0" in target.caps.kv_formats

    def dims(heads, head_dim):
        return type("Dims", (), {"head_dim": head_dim, "n_kv_heads": heads,
                                 "kv_elems_per_token": None})()

    check_kv_storage(dims(3, 64), target, Q8_0, "kv_dtype")       # SmolLM2's: 6 scales
    with pytest.raises(InvalidRequest, match="kv_dtype_k") as e:
        check_kv_storage(dims(3, 64), target, FP8, "kv_dtype_k")
    assert "fp8" in str(e.value) and "q8_0" in str(e.value) and "f16" not in str(e.value)
    # 3 heads of 32: a position's 3 scales would share a word with the next position's
    with pytest.raises(InvalidRequest, match="kv_dtype_v.*3 scales"):
        check_kv_storage(dims(3, 32), target, Q8_0, "kv_dtype_v")
