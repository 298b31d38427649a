"""The CUDA decode step with the on-device sampling suffix, and what ``poot bench --backend
cuda`` runs.

Here (no CUDA device): the tiny Llama decode step with the greedy and the full sampler is
planned for the CUDA target and its PTX assembles; the same shared plan's regions (the
sampler's included) run one by one on a Vulkan device (lavapipe in CI) against the oracle.
On a machine with a CUDA device: greedy generation through the driver equals the fixture's
reference, random-init weights filled on the device equal their host values, and ``poot
bench --backend cuda --profile`` reports graph nodes and a per-kind breakdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
pytest.importorskip("mlir.ir", reason="the MLIR wheels (xtc-mlir-python-bindings) are not "
                    "installed here: this module compiles kernels")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vulkan"))

from model_steps import fixture_path, reference, step_feed  # noqa: E402

from poot.graph.sampling import GREEDY  # noqa: E402
from poot.graph.sampling import SamplerSpec  # noqa: E402

FULL = SamplerSpec(logprobs=2)        # penalties, bias, top-k, top-p, min-p, log-probs


def _sampling_inputs(spec: SamplerSpec, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    counts = np.zeros((1, vocab), np.int32)
    counts[0, [3, 7, 11]] = [1, 2, 1]
    vals = {"temperature": np.array([0.0 if spec == GREEDY else 0.8], np.float32),
            "top_k": np.array([5], np.int32), "top_p": np.array([0.9], np.float32),
            "min_p": np.array([0.05], np.float32),
            "repetition_penalty": np.array([1.1], np.float32),
            "presence_penalty": np.array([0.1], np.float32),
            "frequency_penalty": np.array([0.1], np.float32),
            "uniform": np.array([0.3], np.float32),
            "logit_bias": (rng.standard_normal((1, vocab)) * 0.1).astype(np.float32),
            "token_counts": counts}
    from poot.graph.sampling import INPUTS
    return {INPUTS[r]: vals[r] for r in spec.input_roles()}


def _step_inputs(graph, spec):
    rng = np.random.default_rng(1)
    out = step_feed(graph, [[5]], [[7]], [0])
    for n, t in graph.inputs:
        if n.startswith("kv."):
            out[n] = (0.5 * rng.standard_normal(t.shape)).astype(t.dtype.numpy)
    out.update(_sampling_inputs(spec, 256))
    return out


@pytest.mark.parametrize("spec", [GREEDY, FULL], ids=["greedy", "full"])
def test_decode_with_sampler_plans_for_cuda(spec):
    """The decode step with the sampler suffix compiles for cuda_target(): every dispatch
    region has launches, the sampler's outputs are plan outputs, ptxas accepts the PTX."""
    from poot.backends.cuda.artifact import cuda_target, kernel_nodes
    from poot.backends.cuda.codegen import ptxas_check
    from poot.compiler.compile import compile as compile_step
    from poot.models import StepSpec, load_model

    model, weights = load_model(fixture_path("llama"))
    g = model.trace(StepSpec.decode(kv_capacity=16, sampler=spec), weights.types)
    art = compile_step(g, cuda_target()).executable
    outs = {o["name"] for o in art.plan["outputs"]}
    assert {"sampling.token", "sampling.token_counts_out", "sampling.nonfinite"} <= outs
    if spec.logprobs is not None:
        assert {"sampling.logprob", "sampling.top_logprobs", "sampling.top_ids"} <= outs
    assert all(d["count"] >= 1 for d in art.plan["dispatches"])
    assert kernel_nodes(art.plan)["kernels"] >= len(art.plan["dispatches"]) // 2
    ptxas_check(art.ptx)       # raises with ptxas's message; None (no check) without ptxas




@pytest.mark.parametrize("spec", [GREEDY, FULL], ids=["greedy", "full"])
def test_sampler_regions_match_oracle_on_vulkan(vk, spec):
    """Each dispatch region of the decode+sampler step (the shared GPU plan CUDA uses too),
    compiled alone, matches the oracle on the values the whole step feeds it."""
    from regions import split_regions
    from test_vulkan_kernels import run_artifact

    from poot.backends.vulkan.codegen import codegen_vulkan, compile_vulkan
    from poot.models import StepSpec, load_model

    dev, target = vk
    model, weights = load_model(fixture_path("llama"))
    g = model.trace(StepSpec.decode(kv_capacity=16, sampler=spec), weights.types)
    program = compile_vulkan(g, target)
    regions = split_regions(program.graph, _step_inputs(g, spec), weights)
    bare = compile_vulkan(model.trace(StepSpec.decode(kv_capacity=16), weights.types), target)
    bare_calls = sum(1 for o in bare.graph.func.regions[0].blocks[0].operations
                     if o.operation.name == "func.call")
    assert len(regions) > bare_calls      # the sampler's regions are there (both folded)
    for r in regions:
        got = run_artifact(dev, codegen_vulkan(r.graph, target), r.inputs)
        for k, want in r.want.items():
            want = np.asarray(want)
            if want.dtype.kind in "iub":
                np.testing.assert_array_equal(got[k].reshape(want.shape).astype(want.dtype),
                                              want, err_msg=f"{r.name} ({r.kind}) {k}")
            else:
                np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{r.name} ({r.kind}) {k}")


# --- on a CUDA device ---------------------------------------------------------------------

def _cuda():
    from poot.backends.cuda.runtime import device_available

    ok, why = device_available()
    if not ok:
        pytest.skip(f"no CUDA device: {why}")


def test_greedy_generation_on_cuda_equals_reference(tmp_path):
    _cuda()
    from poot.api import Driver, ModelHandle
    from poot.sampling_params import SamplingParams

    ref = reference("llama")
    h = ModelHandle.load(fixture_path("llama"), backend="cuda", kv_capacity=32,
                         cache_dir=tmp_path)
    done = Driver(h).complete([int(i) for i in ref["prompt_ids"]],
                              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert done.token_ids == [int(t) for t in ref["greedy_ids"]]


def test_random_fill_on_device_equals_host():
    _cuda()
    from poot.backends.cuda.runtime import CudaDevice
    from poot.backends.gpu.artifact import BufType
    from poot.models.random_init import CHUNK_ELEMS, RandomArray

    import ml_dtypes

    dev = CudaDevice()
    for dt, scale in ((np.float32, 0.5), (ml_dtypes.bfloat16, 0.02), (ml_dtypes.bfloat16, 0)):
        a = RandomArray((3, CHUNK_ELEMS // 2 + 5), dt, scale, seed=1, salt="x")
        want = np.asarray(a)
        host = np.dtype(np.uint16) if want.dtype.itemsize == 2 else want.dtype
        buf = dev.alloc(BufType(host.name, a.shape, a.nbytes))
        dev.upload(buf, a)
        np.testing.assert_array_equal(dev.download(buf), want.view(host))


def test_bench_cli_on_cuda(tmp_path, monkeypatch, capsys):
    _cuda()
    from poot.cli import main

    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("POOT_PIPELINE", raising=False)
    rc = main(["bench", "--backend", "cuda", "--model", str(fixture_path("llama_gguf_q4_1")),
               "--kv-capacity", "48", "--tokens", "8", "--runs", "1", "--prompt-tokens", "7",
               "--profile"])
    out = json.loads(capsys.readouterr().out)
    p = out["poot"]
    assert rc == 0 and p["decode_tokens_per_s"] > 0 and p["graph_kernel_nodes"] > 0
    assert p["replay_us_per_step"] > 0 and p["bytes_per_token"] > 0
    assert out["pipelined"] is True and p["pipelined"] is True     # CUDA overlaps: pipelined
    assert set(p["profile"]["by_kind"]) >= {"matmul", "attention"}
