"""The KV block manager: allocation, reference counts and the prefix cache of the paged KV pool.

Every layer's K and V pools have ``num_blocks`` blocks of ``block_size`` positions
(``poot.models.StepSpec``); one block id names the same block in all of them. Block 0 is the
*null block*: never handed out, it is what idle batch rows and unused block-table entries point
at (its content is never visible: attention masks it away).

Reference counts: a block is held by every sequence whose block table lists it. A block whose
count drops to 0 is free again; if it is a *cached* full block (below) it stays where it is
until it is needed for something else, evicted least-recently-used.

Prefix caching (vLLM's automatic prefix caching, SGLang's radix cache, flattened to block
granularity): a block whose ``block_size`` positions all hold computed K/V of a sequence's
tokens is identified by a key chained to its prefix::

    key_0 = H(ROOT, extra, tokens[0:bs]),  key_i = H(key_{i-1}, extra, tokens[i*bs:(i+1)*bs])

(``H`` = SHA-256, ``extra`` e.g. an adapter id). The key names the K/V content exactly (a
block's K/V depend on every token before it, which the chain covers), so a new sequence
whose first ``k * bs`` tokens have keys in the cache reuses those ``k`` blocks and computes
only the rest. SHA-256 rather than Python's ``hash``: a collision would hand one user's cache to
another (vLLM moved to SHA-256 for the same reason).

Not thread-safe: the engine thread owns it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from poot.errors import PootError

#: The block idle rows and unused block-table entries point at (never allocated).
NULL_BLOCK = 0
_ROOT = b"poot-prefix-v1"


class OutOfBlocks(PootError):
    """An allocation asked for more blocks than are free (the scheduler preempts first)."""


def block_keys(token_ids: Sequence[int], block_size: int, extra: str = "",
               parent: bytes | None = None) -> list[bytes]:
    """The chained keys of the *full* blocks of ``token_ids`` (module doc): one 32-byte key
    per ``block_size`` tokens, the trailing partial block has none. ``parent``: the key of the
    block before ``token_ids[0]`` (None: they start at position 0)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    n = len(ids) // block_size
    keys, prev = [], parent if parent is not None else _ROOT
    salt = extra.encode()
    for i in range(n):
        h = hashlib.sha256(prev)
        h.update(len(salt).to_bytes(4, "little"))
        h.update(salt)
        h.update(ids[i * block_size:(i + 1) * block_size].tobytes())
        prev = h.digest()
        keys.append(prev)
    return keys


@dataclass
class BlockStats:
    """Counters for ``stats()``: blocks in use (referenced), cached-free (evictable), free;
    prefix-cache queries and hits in blocks (tokens = blocks * block_size)."""

    used: int
    cached_free: int
    free: int
    total: int
    query_blocks: int
    hit_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.query_blocks if self.query_blocks else 0.0


class BlockManager:
    """Blocks of one paged KV pool (module doc).

    Args:
        num_blocks: blocks in the pool, the null block included (>= 2).
        block_size: positions per block.
        prefix_caching: keep and reuse full blocks by key.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks (one is the null block), got "
                             f"{num_blocks}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        self.ref = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))      # never cached, or evicted
        self._evictable: OrderedDict[int, None] = OrderedDict()   # cached, refcount 0 (LRU)
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self.query_blocks = 0
        self.hit_blocks = 0

    # ---- capacity -----------------------------------------------------------------------
    @property
    def usable(self) -> int:
        """Blocks a sequence could ever hold (all but the null block)."""
        return self.num_blocks - 1

    def num_free(self) -> int:
        """Blocks an allocation may take now (free, plus cached blocks nobody holds)."""
        return len(self._free) + len(self._evictable)

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` positions."""
        return -(-n_tokens // self.block_size)

    # ---- prefix cache -------------------------------------------------------------------
    def cached_prefix(self, keys: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``keys`` (no references taken; counts
        a query of ``len(keys)`` blocks and its hits)."""
        out = []
        if self.prefix_caching:
            for k in keys:
                b = self._block_of.get(k)
                if b is None:
                    break
                out.append(b)
        self.query_blocks += len(keys)
        self.hit_blocks += len(out)
        return out

    def register(self, block: int, key: bytes) -> None:
        """Record that ``block`` (held by the caller) now holds the full block ``key``. A key
        already cached in another block keeps that block (this one stays uncached)."""
        if not self.prefix_caching or block in self._key_of or key in self._block_of:
            return
        self._key_of[block] = key
        self._block_of[key] = block

    # ---- references ---------------------------------------------------------------------
    def take(self, blocks: Sequence[int]) -> None:
        """Add a reference to each of ``blocks`` (cached blocks found by
        :meth:`cached_prefix`): a cached free block stops being evictable."""
        for b in blocks:
            if self.ref[b] == 0:
                self._evictable.pop(b, None)
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks with one reference each: free blocks first, then cached free
        blocks least recently used (their keys are forgotten). Raises :class:`OutOfBlocks`
        (nothing taken) when fewer than ``n`` are available."""
        if n > self.num_free():
            raise OutOfBlocks(f"{n} KV blocks wanted, {self.num_free()} free of "
                              f"{self.usable}")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self._evictable.popitem(last=False)
                key = self._key_of.pop(b)
                del self._block_of[key]
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each of ``blocks`` (a finished, aborted or preempted
        sequence's table): unreferenced cached blocks become evictable (most recently used
        last), others free. The null block is ignored."""
        for b in blocks:
            if b == NULL_BLOCK:
                continue
            if self.ref[b] <= 0:
                raise ValueError(f"KV block {b} released more often than taken")
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self._key_of:
                    self._evictable[b] = None
                    self._evictable.move_to_end(b)
                else:
                    self._free.append(b)

    def stats(self) -> BlockStats:
        used = sum(1 for r in self.ref[1:] if r > 0)
        return BlockStats(used=used, cached_free=len(self._evictable), free=len(self._free),
                          total=self.usable, query_blocks=self.query_blocks,
                          hit_blocks=self.hit_blocks)

    def check(self) -> None:
        """Consistency (tests): every block is exactly one of used, evictable, free."""
        used = {b for b in range(1, self.num_blocks) if self.ref[b] > 0}
        ev, fr = set(self._evictable), set(self._free)
        assert not (used & ev) and not (used & fr) and not (ev & fr)
        assert used | ev | fr == set(range(1, self.num_blocks))
        assert ev <= set(self._key_of)


__all__ = ["BlockManager", "BlockStats", "NULL_BLOCK", "OutOfBlocks", "block_keys"]
