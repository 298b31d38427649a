"""The KV block manager: reference counts, the null block, prefix-cache keys and LRU
eviction."""

from __future__ import annotations

import pytest

from poot.engine.blocks import NULL_BLOCK, BlockManager, OutOfBlocks, block_keys


def test_allocate_release_and_null_block():
    bm = BlockManager(5, 4)
    assert bm.usable == 4 and bm.num_free() == 4
    a = bm.allocate(3)
    assert NULL_BLOCK not in a and len(set(a)) == 3
    with pytest.raises(OutOfBlocks, match="2 KV blocks wanted, 1 free of 4"):
        bm.allocate(2)
    assert bm.num_free() == 1                          # a failed allocation takes nothing
    bm.release(a + [NULL_BLOCK])                       # the null block is ignored
    assert bm.num_free() == 4
    with pytest.raises(ValueError, match="released more often"):
        bm.release([a[0]])
    bm.check()


def test_keys_chain_over_the_prefix():
    k1 = block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(k1) == 2                                # the partial block has no key
    # the second block's key depends on the first block's tokens
    k2 = block_keys([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert k1[1] != k2[1]
    # an extra salt (an adapter) separates equal tokens
    assert block_keys([1, 2, 3, 4], 4, extra="lora-a") != block_keys([1, 2, 3, 4], 4)
    # incremental keys continue the chain
    assert block_keys([5, 6, 7, 8], 4, parent=k1[0]) == k1[1:]


def test_prefix_hits_share_blocks_and_evict_lru():
    bm = BlockManager(6, 2)                            # 5 usable blocks
    keys = block_keys([1, 2, 3, 4, 5, 6], 2)           # 3 full blocks
    a = bm.allocate(3)
    for b, k in zip(a, keys):
        bm.register(b, k)
    assert bm.cached_prefix(keys) == a
    bm.take(a[:2])                                     # a second sequence shares two blocks
    assert bm.ref[a[0]] == 2 and bm.ref[a[2]] == 1
    bm.release(a)                                      # the first sequence ends
    assert bm.ref[a[0]] == 1 and bm.ref[a[2]] == 0
    st = bm.stats()
    assert (st.used, st.cached_free, st.free) == (2, 1, 2)
    # a cached block nobody holds is still found, and is evicted last-resort
    assert bm.cached_prefix(keys) == a
    new = bm.allocate(2)                               # the two never-used blocks
    assert a[2] not in new
    evicted = bm.allocate(1)                           # now the cached one goes
    assert evicted == [a[2]]
    assert bm.cached_prefix(keys) == a[:2]             # its key is forgotten
    bm.check()
    with pytest.raises(OutOfBlocks):
        bm.allocate(1)


def test_lru_order_and_no_caching():
    bm = BlockManager(4, 1)
    keys = block_keys([7, 8, 9], 1)
    blocks = bm.allocate(3)
    for b, k in zip(blocks, keys):
        bm.register(b, k)
    bm.release([blocks[1]])
    bm.release([blocks[0]])
    bm.release([blocks[2]])
    assert bm.allocate(1) == [blocks[1]]               # least recently released first
    off = BlockManager(4, 1, prefix_caching=False)
    b = off.allocate(1)
    off.register(b[0], keys[0])
    off.release(b)
    assert off.cached_prefix(keys) == []
    assert off.stats().cached_free == 0
