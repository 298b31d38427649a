"""The on-device sampling suffix (poot.graph.sampling), evaluated by the CPU oracle, against an
independent sort-based numpy reference written here."""

from __future__ import annotations

import numpy as np
import pytest

from poot.dialects.types import DType, TensorType
from poot.graph import sampling as S
from poot.graph.builder import Builder, BuilderError, TraceLimits
from poot.oracle import evaluate

F32 = np.float32
LIMITS = TraceLimits(max_values=1 << 16, max_ops=1 << 16, max_literal_bytes=1 << 16,
                     max_owned_bytes=1 << 34)
N = S.INPUTS  # role -> input name


# ---- the reference ---------------------------------------------------------------------------
def _sum32(a) -> np.float32:
    """A float sum as the graph's reduce computes it (f64 accumulation, f32 result)."""
    return F32(np.sum(np.asarray(a, dtype=np.float64)))


def ref_row(logits, T, k, tp, mp, rep, pres, freq, u, bias, counts):
    """One row: (chosen id, kept mask in id order, p, tie_at_cut). Sort-based filters."""
    V = logits.shape[0]
    x = (logits + bias).astype(F32)
    seen = counts > 0
    x = np.where(seen, np.where(x > 0, x / F32(rep), x * F32(rep)), x).astype(F32)
    x = (x - F32(freq) * counts.astype(F32)).astype(F32)
    x = (x - F32(pres) * seen.astype(F32)).astype(F32)
    if T < S.GREEDY_EPS:
        return int(np.argmax(x)), None, None, False
    z = (x / F32(T)).astype(F32)
    e = np.exp(z - z.max()).astype(F32)
    p = (e / _sum32(e)).astype(F32)
    order = np.argsort(-p, kind="stable")
    ps = p[order]
    n = V
    if mp > 0:
        n = int(np.sum(ps >= F32(mp) * ps[0]))
    if 0 < k < V:
        n = min(n, k)
    if tp < 1:
        M = _sum32(ps[:n])
        cum = np.cumsum(ps[:n].astype(np.float64)).astype(F32)
        hits = np.nonzero(cum >= F32(tp) * M)[0]
        if len(hits):
            n = int(hits[0]) + 1
    keep = np.zeros(V, bool)
    keep[order[:n]] = True
    tie = n < V and ps[n] == ps[n - 1]
    w = np.where(keep, p, F32(0))
    W = _sum32(w)
    cum = np.cumsum(w.astype(np.float64)).astype(F32)
    hit = np.nonzero(cum > F32(u) * W)[0]
    idx = int(hit[0]) if len(hit) else int(np.nonzero(w > 0)[0][-1])
    return idx, keep, p, tie


# ---- graph helpers ---------------------------------------------------------------------------
_GRAPHS: dict = {}


def graph(B, V, spec=S.SamplerSpec(), extra=False):
    key = (B, V, spec, extra)
    if key not in _GRAPHS:
        b = Builder(LIMITS)
        lg = b.input("logits", TensorType((B, V), DType.F32))
        si = S.declare_inputs(b, B, V, spec)
        r = S.sample(b, lg, si, spec)
        outs = r.outputs()
        if extra:
            d = S.distribution(b, S.process_logits(b, lg, si), si)
            outs["keep"] = d.keep
            outs["p"] = d.p
        _GRAPHS[key] = b.finish(outs)
    return _GRAPHS[key]


def defaults(B, V):
    return {N["temperature"]: np.ones(B, F32), N["top_k"]: np.zeros(B, np.int32),
            N["top_p"]: np.ones(B, F32), N["min_p"]: np.zeros(B, F32),
            N["repetition_penalty"]: np.ones(B, F32), N["presence_penalty"]: np.zeros(B, F32),
            N["frequency_penalty"]: np.zeros(B, F32), N["uniform"]: np.full(B, 0.5, F32),
            N["logit_bias"]: np.zeros((B, V), F32),
            N["token_counts"]: np.zeros((B, V), np.int32),
            N["allowed_tokens"]: np.full((B, S.mask_words(V)), 0xFFFF, np.int32)}


def run(g, logits, **kw):
    B, V = logits.shape
    inp = defaults(B, V)
    for role, v in kw.items():
        inp[N[role]] = np.asarray(v, dtype=inp[N[role]].dtype).reshape(inp[N[role]].shape)
    inp["logits"] = logits.astype(F32)
    names = {n for n, _ in g.inputs}
    return evaluate(g, {n: v for n, v in inp.items() if n in names}), inp


def ref_batch(logits, inp):
    rows = []
    for i in range(logits.shape[0]):
        rows.append(ref_row(logits[i], inp[N["temperature"]][i], inp[N["top_k"]][i],
                            inp[N["top_p"]][i], inp[N["min_p"]][i],
                            inp[N["repetition_penalty"]][i], inp[N["presence_penalty"]][i],
                            inp[N["frequency_penalty"]][i], inp[N["uniform"]][i],
                            inp[N["logit_bias"]][i], inp[N["token_counts"]][i]))
    return rows


def random_params(rng, B, V):
    pick = lambda xs: [xs[i] for i in rng.integers(0, len(xs), B)]  # noqa: E731
    counts = np.where(rng.random((B, V)) < 0.05, rng.integers(1, 6, (B, V)), 0)
    bias = np.where(rng.random((B, V)) < 0.01, rng.choice([-100, -5, 2, 5, 100], (B, V)), 0)
    u = rng.random(B).astype(F32)
    u[rng.random(B) < 0.1] = 0.0
    u[rng.random(B) < 0.1] = F32(1 - 2 ** -24)
    return dict(temperature=pick([0.0, 1e-6, 0.05, 0.3, 0.7, 1.0, 1.0, 1.5, 4.0]),
                top_k=pick([0, -1, 1, 2, 5, 40, 999, V, 5000, 0]),
                top_p=pick([1.0, 1.0, 0.95, 0.8, 0.5, 0.1, 1e-3]),
                min_p=pick([0.0, 0.0, 0.01, 0.1, 0.5, 1.0]),
                repetition_penalty=pick([1.0, 1.0, 1.3, 0.8, 2.0]),
                presence_penalty=pick([0.0, 0.0, 0.5, -0.5, 2.0]),
                frequency_penalty=pick([0.0, 0.0, 0.3, -0.2, 1.0]),
                uniform=u, logit_bias=bias, token_counts=counts)


# ---- tests -----------------------------------------------------------------------------------
def test_random_combinations_match_reference():
    B, V = 3, 1000
    g = graph(B, V, extra=True)
    rng = np.random.default_rng(1234)
    checked = skipped = 0
    for it in range(40):
        scale = [1.0, 3.0, 10.0][it % 3]
        logits = (rng.normal(size=(B, V)) * scale).astype(F32)
        if it % 5 == 0:  # a few exactly tied maxima
            logits[:, [7, 300, 999]] = logits.max() + 1
        out, inp = run(g, logits, **random_params(rng, B, V))
        for i, (idx, keep, p, tie) in enumerate(ref_batch(logits, inp)):
            if keep is not None:
                np.testing.assert_array_equal(out["p"][i], p)
                cut = p[keep].min()
                free = p == cut  # the threshold form keeps every token tied at the cut
                assert np.array_equal(out["keep"][i][~free], keep[~free]), (it, i)
                assert out["keep"][i][free].all()
                if tie and p[keep].min() > 0:
                    skipped += 1
                    continue
            assert out[S.OUTPUTS["token"]][i] == idx, (it, i, inp[N["temperature"]][i])
            checked += 1
    assert checked >= 110 and skipped <= 5


def test_extreme_thresholds_are_exact():
    """Top-k / top-p cuts down among subnormal probabilities, and neighbouring floats."""
    B, V = 3, 1000
    g = graph(B, V, extra=True)
    rng = np.random.default_rng(7)
    logits = np.stack([np.linspace(0, -110, V), np.linspace(0, -300, V),
                       np.full(V, 2.0)]).astype(F32)
    logits[2] += rng.integers(0, 4, V).astype(F32) * F32(2 ** -22)  # 1-ulp steps: ties
    rng.shuffle(logits[0])
    subnormal_cuts = 0
    for k in (1, 300, 340, 700, 900, 999):
        for tp in (1.0, 0.999999):
            out, inp = run(g, logits, top_k=[k] * 3, top_p=[tp] * 3,
                           uniform=rng.random(3))
            for i, (idx, keep, p, tie) in enumerate(ref_batch(logits, inp)):
                cut = p[keep].min()
                free = p == cut
                assert np.array_equal(out["keep"][i][~free], keep[~free]), (k, tp, i)
                assert out["keep"][i][free].all()
                if not (tie and cut > 0):
                    assert out[S.OUTPUTS["token"]][i] == idx
                subnormal_cuts += bool(0 < cut < np.finfo(F32).tiny)
    assert subnormal_cuts >= 3


def test_greedy_ties_lowest_id_and_ignores_filters():
    B, V = 3, 1000
    g = graph(B, V)
    logits = np.zeros((B, V), F32)
    logits[0, [5, 6, 900]] = 3.0
    logits[1, [999, 998]] = 1.0
    logits[2, :] = -1.0
    out, _ = run(g, logits, temperature=[0, 0, 0], top_k=[1, 1, 1], top_p=[0.01] * 3,
                 min_p=[0.9] * 3, uniform=[0.99] * 3)
    np.testing.assert_array_equal(out[S.OUTPUTS["token"]], [5, 998, 0])
    # bias and penalties apply before greedy
    counts = np.zeros((B, V), np.int32)
    counts[0, 5] = 1
    bias = np.zeros((B, V), F32)
    bias[1, 3] = 5.0
    out, _ = run(g, logits, temperature=[0, 0, 0], repetition_penalty=[1.5, 1, 1],
                 logit_bias=bias, token_counts=counts, presence_penalty=[0, 0, -0.5])
    np.testing.assert_array_equal(out[S.OUTPUTS["token"]], [6, 3, 0])


def test_history_update_and_nonfinite_flag():
    B, V = 3, 1000
    g = graph(B, V)
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(B, V)).astype(F32)
    logits[1, 17] = np.nan
    logits[2, 4] = np.inf
    counts = rng.integers(0, 3, (B, V)).astype(np.int32)
    out, _ = run(g, logits, temperature=[0.0, 0.0, 0.0], token_counts=counts)
    tok = out[S.OUTPUTS["token"]]
    assert tok.dtype == np.int32 and tok.shape == (B,)
    assert ((0 <= tok) & (tok < V)).all()
    want = counts.copy()
    want[np.arange(B), tok] += 1
    np.testing.assert_array_equal(out[S.OUTPUTS["history"]], want)
    np.testing.assert_array_equal(out[S.OUTPUTS["nonfinite"]], [False, True, True])


def test_empirical_distribution_matches_reference():
    """Stratified u: each token's count is within 1 of N * q; random u: a chi-square bound."""
    V, B = 48, 4000
    spec = S.SamplerSpec()
    g = graph(B, V, spec)
    rng = np.random.default_rng(11)
    row = rng.normal(size=V).astype(F32) * 1.5
    counts = np.zeros(V, np.int32)
    counts[[1, 2, 3]] = [1, 2, 5]
    params = dict(temperature=[0.8] * B, top_k=[20] * B, top_p=[0.9] * B, min_p=[0.02] * B,
                  repetition_penalty=[1.2] * B, frequency_penalty=[0.1] * B,
                  presence_penalty=[0.2] * B, token_counts=np.tile(counts, (B, 1)))
    logits = np.tile(row, (B, 1))
    _, keep, p, _ = ref_row(row, 0.8, 20, 0.9, 0.02, 1.2, 0.2, 0.1, 0.5, np.zeros(V, F32),
                            counts)
    q = np.where(keep, p, 0).astype(np.float64)
    q /= q.sum()
    u = ((np.arange(B) + 0.5) / B).astype(F32)
    out, _ = run(g, logits, uniform=u, **params)
    hist = np.bincount(out[S.OUTPUTS["token"]], minlength=V)
    assert np.all(np.abs(hist - B * q) <= 1.01), (hist, B * q)
    assert hist[~keep].sum() == 0
    out, _ = run(g, logits, uniform=rng.random(B).astype(F32), **params)
    hist = np.bincount(out[S.OUTPUTS["token"]], minlength=V)
    m = q > 0
    chi2 = np.sum((hist[m] - B * q[m]) ** 2 / (B * q[m]))
    assert hist[~m].sum() == 0 and chi2 < m.sum() + 6 * np.sqrt(2 * m.sum()), chi2


def test_logprobs_outputs():
    B, V = 3, 1000
    spec = S.SamplerSpec(logprobs=4)
    g = graph(B, V, spec)
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(B, V)).astype(F32) * 2
    logits[0, [10, 20]] = logits[0].max() + 1  # tie: lowest id first
    out, _ = run(g, logits, temperature=[0.7, 0.0, 1.0], uniform=[0.3, 0.3, 0.9])
    x = logits.astype(np.float64)
    lp = x - x.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    tok = out[S.OUTPUTS["token"]]
    np.testing.assert_allclose(out[S.OUTPUTS["logprob"]], lp[np.arange(B), tok], atol=1e-5)
    ids = np.argsort(-lp, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(out[S.OUTPUTS["top_ids"]], ids)
    np.testing.assert_allclose(out[S.OUTPUTS["top_logprobs"]],
                               np.take_along_axis(lp, ids, 1), atol=1e-5)
    assert out[S.OUTPUTS["top_ids"]][0, :2].tolist() == [10, 20]
    # not traced unless asked
    plain = graph(B, V)
    assert S.OUTPUTS["logprob"] not in dict(plain.outputs)


def test_feature_flags_drop_inputs():
    B, V = 2, 64
    spec = S.SamplerSpec(penalties=False, logit_bias=False, top_k=False, top_p=False,
                         min_p=False)
    g = graph(B, V, spec)
    names = [n for n, _ in g.inputs]
    assert names == ["logits", N["temperature"], N["uniform"], N["token_counts"]]
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(B, V)).astype(F32)
    out, inp = run(g, logits, uniform=[0.25, 0.75])
    for i, (idx, *_rest) in enumerate(ref_batch(logits, inp)):
        assert out[S.OUTPUTS["token"]][i] == idx
    assert g.op_count() < graph(B, V).op_count() / 3
    cost = S.trace_cost(B, V, spec)
    assert cost["ops"] == g.op_count()
    assert cost["values"] == cost["ops"] + 3  # + the three sampling inputs


def test_greedy_only_spec_traces_argmax_alone():
    """``stochastic=False``: no temperature/uniform inputs, no distribution; the token is the
    argmax of the processed logits (bias and penalties still apply), lowest id on ties."""
    B, V = 3, 64
    spec = S.SamplerSpec(top_k=False, top_p=False, min_p=False, stochastic=False)
    g = graph(B, V, spec)
    names = [n for n, _ in g.inputs]
    assert N["temperature"] not in names and N["uniform"] not in names
    assert N["logit_bias"] in names and N["repetition_penalty"] in names
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(B, V)).astype(F32)
    logits[2, 7] = logits[2, 40] = logits[2].max() + 1.0          # a tie: id 7 wins
    bias = np.zeros((B, V), F32)
    bias[1, 3] = 100.0
    out, inp = run(g, logits, logit_bias=bias, temperature=[0.0] * B)
    assert out[S.OUTPUTS["token"]].tolist() == [int(np.argmax(logits[0])), 3, 7]
    for i, (idx, *_rest) in enumerate(ref_batch(logits, inp)):   # the full sampler agrees
        assert out[S.OUTPUTS["token"]][i] == idx
    assert g.op_count() < graph(B, V, S.SamplerSpec(top_k=False, top_p=False, min_p=False)
                                ).op_count() / 2


def test_bad_shapes_are_builder_errors():
    b = Builder(LIMITS)
    lg = b.input("logits", TensorType((2, 8), DType.F32))
    si = S.declare_inputs(b, 2, 9)
    with pytest.raises(BuilderError, match="logit_bias"):
        S.sample(b, lg, si)
    with pytest.raises(BuilderError):
        S.SamplerSpec(logprobs=-1)


# ---- guided decoding: the allowed-tokens mask --------------------------------------------------
def pack_mask(allow: np.ndarray) -> np.ndarray:
    """bool [B, V] -> i32 [B, ceil(V/16)], 16 bits a word, bit t % 16 of word t // 16 (the
    layout written independently of poot: numpy's packbits, little bit order)."""
    B, V = allow.shape
    W = S.mask_words(V)
    pad = np.zeros((B, W * 16), bool)
    pad[:, :V] = allow
    return np.packbits(pad, axis=1, bitorder="little").view("<u2").astype(np.int32)


@pytest.mark.parametrize("V", [16, 1000, 1003])
def test_mask_unpacks_bit_for_bit(V):
    B = 3
    rng = np.random.default_rng(V)
    allow = rng.random((B, V)) < 0.3
    allow[1] = True
    allow[2] = False
    allow[2, [0, V - 1]] = True
    b = Builder(LIMITS)
    words = b.input("w", TensorType((B, S.mask_words(V)), DType.I32))
    g = b.finish({"allowed": S.allowed(b, words, V)})
    got = evaluate(g, {"w": pack_mask(allow)})["allowed"]
    np.testing.assert_array_equal(got, allow)


def test_guided_rows_sample_from_the_masked_distribution():
    """Every rule (bias, penalties, greedy, filters, inverse CDF) sees the masked logits: the
    sort-based reference on logits with disallowed ids at -inf picks the same token, always an
    allowed one; a row whose mask allows everything samples what the unguided sampler does."""
    B, V = 4, 1000
    spec = S.SamplerSpec(guided=True)
    g, plain = graph(B, V, spec), graph(B, V)
    rng = np.random.default_rng(21)
    checked = 0
    for it in range(30):
        logits = (rng.normal(size=(B, V)) * 3).astype(F32)
        allow = rng.random((B, V)) < [[0.5], [0.02], [0.002], [1.0]]
        allow[np.arange(B), rng.integers(0, V, B)] = True
        allow[1, int(np.argmax(logits[1]))] = False        # the unmasked argmax is not allowed
        params = random_params(rng, B, V)
        params["logit_bias"][0, ~allow[0]] = 100.0         # bias cannot unmask
        out, inp = run(g, logits, allowed_tokens=pack_mask(allow), **params)
        tok = out[S.OUTPUTS["token"]]
        assert allow[np.arange(B), tok].all(), it
        masked = np.where(allow, logits, -np.inf).astype(F32)
        for i, (idx, keep, p, tie) in enumerate(ref_batch(masked, inp)):
            if keep is not None and tie and p[keep].min() > 0:
                continue
            assert tok[i] == idx, (it, i)
            checked += 1
        free, _ = run(plain, logits, **params)
        assert free[S.OUTPUTS["token"]][3] == tok[3]
    assert checked >= 110


def test_guided_logprobs_see_the_mask():
    B, V = 2, 300
    spec = S.SamplerSpec(guided=True, logprobs=5)
    g = graph(B, V, spec)
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(B, V)).astype(F32)
    allow = np.zeros((B, V), bool)
    allow[0, [3, 50, 299]] = True
    allow[1] = True
    out, _ = run(g, logits, allowed_tokens=pack_mask(allow), temperature=[0.0, 0.0])
    x = np.where(allow[0], logits[0].astype(np.float64), -np.inf)
    lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    assert out[S.OUTPUTS["token"]][0] == int(np.argmax(x))
    np.testing.assert_allclose(out[S.OUTPUTS["top_logprobs"]][0, :3],
                               np.sort(lp[allow[0]])[::-1], atol=1e-5)
    assert set(out[S.OUTPUTS["top_ids"]][0, :3].tolist()) == {3, 50, 299}
    assert np.isneginf(out[S.OUTPUTS["top_logprobs"]][0, 3:]).all()
    np.testing.assert_allclose(out[S.OUTPUTS["logprob"]][0], lp.max(), atol=1e-5)
    assert not out[S.OUTPUTS["nonfinite"]].any()       # the flag is about the raw logits


def test_guided_spec_declares_the_mask_and_covers():
    assert "allowed_tokens" in S.SamplerSpec(guided=True).input_roles()
    assert "allowed_tokens" not in S.FULL.input_roles()
    assert S.input_type("allowed_tokens", 4, 49152).shape == (4, 3072)
    assert S.input_type("allowed_tokens", 1, 1003).shape == (1, 63)
    g = S.SamplerSpec(guided=True)
    assert S.covers(g, S.SamplerSpec()) and S.covers(g, S.GREEDY)
    assert not S.covers(S.FULL, S.SamplerSpec(stochastic=False, guided=True))


def test_sampler_program_depends_on_the_history_pool_only_with_penalties():
    """A sampler without penalties has no token-history pool, so engines of any batch size
    share its program (equal steps: one compile-cache key); with penalties the pool's rows
    (a sequence each plus the scratch row, in multiples of 8) are part of it, and engines of
    1, 2, 4 and 7 sequences share one pool shape."""
    from poot.api.model import target_for
    from poot.api.options import DEFAULT_COMPILE_OPTIONS
    from poot.compiler.cache import step_key
    from poot.engine.runner import SamplerProgram

    def key(st):
        return step_key(SamplerProgram(st), {}, st, target_for("cpu"), DEFAULT_COMPILE_OPTIONS)

    greedy = [S.SamplerStep(1, 1000, S.history_pool_rows(mb), S.GREEDY) for mb in (1, 8, 32)]
    assert {st.history_slots for st in greedy} == {1} and len({key(st) for st in greedy}) == 1
    assert [S.history_pool_rows(mb) for mb in (1, 2, 4, 7, 8, 15, 32)] == \
        [8, 8, 8, 8, 16, 16, 40]
    full = {mb: S.SamplerStep(1, 1000, S.history_pool_rows(mb), S.FULL) for mb in (2, 4, 8)}
    assert full[2] == full[4] and full[8].history_slots == 16 and full[2] != full[8]
    assert key(full[2]) == key(full[4]) != key(full[8])
