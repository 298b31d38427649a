"""Test-side helpers: tiny fixtures, and step graphs run on the CPU oracle with KV caches
carried between steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from poot.dialects.types import DType
from poot.models import StepSpec, contiguous_inputs
from poot.oracle import evaluate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny"


def fixture_path(name: str) -> Path:
    """The checkpoint of a tiny fixture: the HF folder, or model.gguf for GGUF fixtures."""
    folder = FIXTURES / name
    gguf = folder / "model.gguf"
    return gguf if gguf.exists() else folder


def reference(name: str) -> dict[str, np.ndarray]:
    """The fixture's reference.npz arrays (prompt_ids, prefill_logits, decode_logits, ...)."""
    with np.load(FIXTURES / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def empty_caches(graph) -> dict[str, np.ndarray]:
    """Zero-filled arrays for every ``kv.*`` input of ``graph``."""
    return {n: np.zeros(t.shape, t.dtype.numpy) for n, t in graph.inputs if n.startswith("kv.")}


def capacity_of(graph) -> int:
    """The positions one sequence holds in a step traced with one block a sequence (the
    pools' block size)."""
    return next(t.shape[1] for n, t in graph.inputs if n.startswith("kv."))


def step_feed(graph, tokens, positions, slots) -> dict[str, np.ndarray]:
    """tokens/positions [B, T] and per-sequence slots [B] as the inputs of ``graph`` (a step
    with one block a sequence: :func:`poot.models.contiguous_inputs`)."""
    return contiguous_inputs(capacity_of(graph), tokens, positions, slots)


def run_step(graph, weights, tokens, positions, slots, caches):
    """Evaluate one step. tokens/positions [B, T], slots [B]. Returns (outputs, new caches)."""
    inputs = {**step_feed(graph, tokens, positions, slots), **caches}
    out = evaluate(graph, inputs, weights)
    return out, {k: v for k, v in out.items() if k.startswith("kv.")}


def prefill_then_decode(model, weights, ids, n_prefill: int, capacity: int = 16,
                        n_slots: int = 1, slot: int = 0, kv_dtype=None):
    """Prefill ``ids[:n_prefill]`` then decode the rest one token per step in ``slot``.

    ``kv_dtype``: the pools' dtype (None: the model's default, f16 for a GGUF checkpoint).
    Returns (prefill logits [n_prefill, V], decode logits [len(ids) - n_prefill, V]).
    """
    ids = [int(i) for i in ids]
    pre = model.trace(StepSpec.prefill(n_prefill, kv_capacity=capacity, kv_slots=n_slots,
                                       kv_dtype=kv_dtype), weights.types)
    dec = model.trace(StepSpec.decode(kv_capacity=capacity, kv_slots=n_slots,
                                      kv_dtype=kv_dtype), weights.types)
    out, caches = run_step(pre, weights, [ids[:n_prefill]], [list(range(n_prefill))], [slot],
                           empty_caches(pre))
    rows = []
    for p in range(n_prefill, len(ids)):
        o, caches = run_step(dec, weights, [[ids[p]]], [[p]], [slot], caches)
        rows.append(o["logits"][0, 0])
    return out["logits"][0], np.stack(rows) if rows else np.zeros((0,) + out["logits"].shape[2:])


def compiled_steps_match_oracle(name: str, compile_step, tol: float = 1e-4,
                                kv_dtype=DType.F32) -> None:
    """Prefill 6 prompt tokens, then decode the 7th, each step compiled by
    ``compile_step(graph) -> program`` (``.run(inputs, params)``, ``.params``), with the KV
    caches carried from the compiled program's own outputs; logits and caches must match
    the oracle within ``tol`` (rtol and atol)."""
    from poot.models import load_model

    model, weights = load_model(fixture_path(name))
    ids = [int(i) for i in reference(name)["prompt_ids"]]
    n = 6
    caches = None
    for spec, toks, pos in ((StepSpec.prefill(n, kv_capacity=16, kv_slots=1,
                                              kv_dtype=kv_dtype), ids[:n], list(range(n))),
                            (StepSpec.decode(kv_capacity=16, kv_slots=1, kv_dtype=kv_dtype),
                             ids[n:n + 1], [n])):
        g = model.trace(spec, weights.types)
        inputs = {**step_feed(g, [toks], [pos], [0]), **(caches or empty_caches(g))}
        prog = compile_step(g)
        got = prog.run(inputs, {k: weights[k] for k, _ in prog.params})
        want = evaluate(g, inputs, weights)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol, err_msg=k)
        caches = {k: v for k, v in got.items() if k.startswith("kv.")}
