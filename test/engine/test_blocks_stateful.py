"""The KV block manager under any interleaving of what the engine does with it (admit a
sequence through the prefix cache, grow it a block at a time, register its full blocks,
release it), as a Hypothesis state machine against a model of who holds which block and
which tokens each block's K/V were computed from.

Invariants after every step: reference counts are never negative and equal the number of
live sequences holding the block; used + cached-free + free = total; the manager's own
consistency check; every prefix-cache key names a block holding exactly the tokens that key
chains over; a block handed out by ``allocate`` was held by nobody (eviction takes only
unreferenced blocks); a refused allocation takes nothing. At the end every sequence is
released and every block is free again.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, initialize,
                                 invariant, precondition, rule)

from poot.engine.blocks import NULL_BLOCK, BlockManager, OutOfBlocks, block_keys

BS = 2          # positions per block: small, so sequences span several blocks
# tokens from a tiny alphabet, and prompts that often share a prefix: prefix-cache hits
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=9)


class BlockMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(num_blocks=st.integers(2, 9), caching=st.booleans())
    def start(self, num_blocks, caching):
        self.bm = BlockManager(num_blocks, BS, prefix_caching=caching)
        self.live: dict[int, dict] = {}          # sequence id -> {"tokens", "blocks", "keys"}
        self.content: dict[int, tuple[int, ...]] = {}  # block -> the prefix its K/V hold
        self.next_id = 0

    # ---- the engine's operations ----------------------------------------------------------
    @rule(target=seqs, share=st.integers(0, 8), tail=TOKENS)
    def admit(self, share, tail):
        """``Scheduler._take_blocks`` (admission): cached prefix (all but the last token), then the rest."""
        prior = [s["tokens"] for s in self.live.values()]
        tokens = (prior[0][:share] if prior else []) + tail
        keys = block_keys(tokens[:-1], BS) if self.bm.prefix_caching else []
        hit = self.bm.cached_prefix(keys)
        for i, b in enumerate(hit):                 # a hit holds the tokens its key names
            assert self.content[b] == tuple(tokens[:(i + 1) * BS])
        self.bm.take(hit)
        need = self.bm.blocks_for(len(tokens)) - len(hit)
        if need > self.bm.num_free():
            before = (self.bm.num_free(), list(self.bm.ref))
            try:
                self.bm.allocate(need)
                raise AssertionError("allocate past the free blocks did not raise")
            except OutOfBlocks:
                pass
            assert (self.bm.num_free(), list(self.bm.ref)) == before   # took nothing
            self.bm.release(hit)
            return None
        new = self._allocate(need)
        sid = self.next_id
        self.next_id += 1
        self.live[sid] = {"tokens": tokens, "blocks": hit + new, "keys": keys[:len(hit)]}
        self._compute(sid)
        return sid

    @rule(sid=seqs, more=TOKENS)
    def grow(self, sid, more):
        """Decode: the sequence gets more tokens, a block at a time (``_grow``)."""
        seq = self.live.get(sid)
        if seq is None:
            return
        want = self.bm.blocks_for(len(seq["tokens"]) + len(more)) - len(seq["blocks"])
        if want > self.bm.num_free():
            return                                   # the engine would preempt: see release
        seq["blocks"] += self._allocate(want)
        seq["tokens"] = seq["tokens"] + more
        self._compute(sid)

    @rule(sid=consumes(seqs))
    def release(self, sid):
        """Finish, abort or preemption: the sequence's whole table is released."""
        seq = self.live.pop(sid, None)
        if seq is None:
            return
        self.bm.release(seq["blocks"] + [NULL_BLOCK])

    @precondition(lambda self: self.live)
    @rule()
    def over_release_is_refused(self):
        """A block released more often than taken is an error, and changes nothing."""
        free = [b for b in range(1, self.bm.num_blocks) if self.bm.ref[b] == 0]
        if not free:
            return
        before = list(self.bm.ref)
        try:
            self.bm.release([free[0]])
            raise AssertionError("over-release did not raise")
        except ValueError:
            pass
        assert self.bm.ref == before

    # ---- helpers --------------------------------------------------------------------------
    def _allocate(self, n: int) -> list[int]:
        held = {b for s in self.live.values() for b in s["blocks"]}
        cached_before = dict(self.bm._key_of)
        new = self.bm.allocate(n)
        assert len(set(new)) == n and NULL_BLOCK not in new
        for b in new:
            assert b not in held, f"block {b} handed out while a sequence holds it"
            if b in cached_before:                  # an eviction: its key is gone
                assert cached_before[b] not in self.bm._block_of or \
                    self.bm._block_of[cached_before[b]] != b
            self.content.pop(b, None)
        return new

    def _compute(self, sid: int) -> None:
        """The sequence's K/V are computed: its full blocks hold their prefixes and are
        registered under their chained keys (``_register``)."""
        seq = self.live[sid]
        tokens, blocks = seq["tokens"], seq["blocks"]
        for i, b in enumerate(blocks):
            if (i + 1) * BS <= len(tokens):
                self.content[b] = tuple(tokens[:(i + 1) * BS])
        full = len(tokens) // BS
        keys = block_keys(tokens[:full * BS], BS)
        for i in range(len(seq["keys"]), full):
            self.bm.register(blocks[i], keys[i])
        seq["keys"] = keys

    # ---- invariants -----------------------------------------------------------------------
    @invariant()
    def counts(self):
        bm = self.bm
        held = {}
        for s in self.live.values():
            for b in s["blocks"]:
                held[b] = held.get(b, 0) + 1
        assert all(r >= 0 for r in bm.ref)
        assert bm.ref[NULL_BLOCK] == 0
        for b in range(1, bm.num_blocks):
            assert bm.ref[b] == held.get(b, 0), (b, bm.ref[b], held.get(b, 0))
        stats = bm.stats()
        assert stats.used + stats.cached_free + stats.free == stats.total == bm.usable
        assert bm.num_free() == stats.cached_free + stats.free
        bm.check()

    @invariant()
    def keys_name_their_tokens(self):
        for key, b in self.bm._block_of.items():
            assert self.bm._key_of[b] == key
            prefix = self.content.get(b)
            assert prefix is not None and len(prefix) % BS == 0
            assert block_keys(prefix, BS)[-1] == key

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for sid in list(self.live):
            self.release(sid)
        st_ = self.bm.stats()
        assert st_.used == 0 and self.bm.num_free() == self.bm.usable
        self.bm.check()


BlockMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestBlockManagerStateful = BlockMachine.TestCase
