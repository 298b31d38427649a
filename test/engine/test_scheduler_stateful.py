"""The engine's scheduler under any interleaving of add / abort / step, on the tiny Q4_1
llama GGUF fixture (it has a tokenizer: stop strings apply) with a KV pool too small for its
batch (3 blocks of 32 positions for up to 4 sequences of up to 64), so admission waits and
running sequences are preempted and recomputed. A Hypothesis state machine checks that no request is lost or duplicated and
that every request ends exactly once.

After every step: each request added is finished, or in exactly one of the engine's
queues (pending adds, waiting, running), once; a waiting request holds no KV block; block
reference counts equal the running sequences' tables; outputs name only known requests and
none follows its request's final output. At the end the engine is run dry: every request
finished exactly once (``length`` or ``stop`` -- ``abort`` where aborted before it ended --
with at most ``max_tokens`` tokens) and no block is in use.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from model_steps import fixture_path  # noqa: E402
from poot.sampling_params import InvalidRequest, SamplingParams  # noqa: E402
from poot.engine import ContextOverflow  # noqa: E402

CONTEXT, BATCH, POOL = 64, 4, 3
_HANDLE = None


def _engine():
    """One engine for every example (loading compiles, or reads the compile cache); each
    example starts with it idle and leaves it idle."""
    global _HANDLE
    if _HANDLE is None:
        from poot.api import ModelHandle

        _HANDLE = ModelHandle.load(fixture_path("llama_gguf_q4_1"), kv_capacity=CONTEXT,
                                   max_batch=BATCH, prefill_chunk=16, kv_blocks=POOL)
    eng = _HANDLE.engine
    assert not eng.has_unfinished() and eng.blocks.stats().used == 0
    return eng


class SchedulerMachine(RuleBasedStateMachine):
    rids = Bundle("rids")

    def __init__(self):
        super().__init__()
        self.eng = _engine()
        self.vocab = self.eng.vocab
        self.added: dict[str, SamplingParams] = {}
        self.final: dict[str, object] = {}
        self.aborted: set[str] = set()
        self.preempted_before = self.eng.preemptions

    @rule(target=rids, prompt=st.lists(st.integers(3, 255), min_size=1, max_size=40),
          max_tokens=st.integers(1, 24), seed=st.none() | st.integers(0, 2 ** 32),
          stop=st.sampled_from([(), ("a",), ("\n", "the")]))
    def add(self, prompt, max_tokens, seed, stop):
        max_tokens = min(max_tokens, CONTEXT - len(prompt))
        params = SamplingParams(temperature=0.0 if seed is None else 0.8, seed=seed,
                                max_tokens=max_tokens, ignore_eos=True, stop=list(stop))
        rid = self.eng.add_request(prompt, params)
        assert rid not in self.added
        self.added[rid] = params
        return rid

    @rule(prompt=st.lists(st.integers(0, 300), min_size=0, max_size=70))
    def add_refused(self, prompt):
        """A request that can never run is refused in the caller and never appears."""
        bad = not prompt or max(prompt) >= self.vocab or len(prompt) + 8 > CONTEXT
        if not bad:
            return
        with pytest.raises((InvalidRequest, ContextOverflow)):
            self.eng.add_request(prompt, SamplingParams(max_tokens=8))

    @rule(rid=rids)
    def abort(self, rid):
        """Abort, whatever the request's state (an unknown or finished id is ignored)."""
        self.eng.abort(rid)
        if rid not in self.final:
            self.aborted.add(rid)

    @rule(n=st.integers(1, 4))
    def step(self, n):
        for _ in range(n):
            self._collect(self.eng.step())

    def _collect(self, outs) -> None:
        for out in outs:
            rid = out.request_id
            assert rid in self.added, f"output for unknown request {rid}"
            assert rid not in self.final, f"output for {rid} after its final output"
            if out.finished:
                self.final[rid] = out

    # ---- invariants -----------------------------------------------------------------------
    @invariant()
    def every_request_is_somewhere_once(self):
        eng = self.eng
        queued = [s.id for s in list(eng._adds) + list(eng.waiting) + list(eng.running)]
        assert len(queued) == len(set(queued)), f"a request queued twice: {queued}"
        assert set(queued) | set(self.final) == set(self.added), "a request was lost"
        assert not set(queued) & set(self.final), "a finished request is still queued"

    @invariant()
    def blocks_match_the_tables(self):
        eng = self.eng
        assert all(not s.blocks for s in eng.waiting), "a waiting request holds blocks"
        held = [0] * eng.blocks.num_blocks
        for s in eng.running:
            for b in s.blocks:
                held[b] += 1
        assert eng.blocks.ref[1:] == held[1:]
        eng.blocks.check()

    def teardown(self):
        eng = self.eng
        for _ in range(2000):
            if not eng.has_unfinished():
                break
            self._collect(eng.step())
        assert not eng.has_unfinished(), "the engine did not run dry"
        assert set(self.final) == set(self.added)
        for rid, out in self.final.items():
            params = self.added[rid]
            if out.finish_reason == "abort":
                assert rid in self.aborted
            else:
                assert out.finish_reason in ("length", "stop"), (rid, out.finish_reason)
            assert len(out.output_ids) <= params.max_tokens
            if out.finish_reason == "length":
                assert len(out.output_ids) == params.max_tokens
        assert eng.blocks.stats().used == 0
        eng.blocks.check()


SchedulerMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25,
                                              deadline=None,
                                              suppress_health_check=list(HealthCheck))
TestSchedulerStateful = SchedulerMachine.TestCase


def test_the_pool_forces_preemption():
    """The machine's pool is small enough to preempt: four 30-token prompts that each grow
    past one block cannot all keep their blocks."""
    eng = _engine()
    before = eng.preemptions
    rids = [eng.add_request(list(range(3 + i, 33 + i)),
                            SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
            for i in range(4)]
    done = {o.request_id for o in eng.run_until_done() if o.finished}
    assert done == set(rids)
    assert eng.preemptions > before
    assert eng.blocks.stats().used == 0
