"""``n`` > 1: the choices share the prompt's KV blocks (reference-counted, not copied) and
each equals the request run alone (greedy: the same tokens; seeded: choice j is the request
with seed + j)."""

from __future__ import annotations

import threading
import time

import httpx

def wait_until(cond, limit: float = 30.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "gave up waiting"
        time.sleep(0.01)


# a prompt of 3 full 32-position blocks and a partial one on the tiny model
PROMPT = list(range(3, 103))
N = 4


def test_n_choices_share_prompt_blocks(server, tiny, gate):
    eng = tiny.engine
    bs = eng.blocks.block_size
    full = (len(PROMPT) - 1) // bs
    assert full == 3
    # a prompt no earlier request had: its blocks are not cached when the request comes
    prompt = [255 - i for i in range(len(PROMPT))]
    body = {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 20,
            "ignore_eos": True}
    hits = eng.stats().prefix_cache_hit_tokens
    # the engine pauses after choice 0's first token; the server then adds the others
    gate.close_after_token = True
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", httpx.post(
        server.url + "/v1/completions", json={**body, "n": N}, timeout=60)), daemon=True)
    t.start()
    wait_until(lambda: not gate.open_.is_set() and eng.stats().waiting == N - 1)
    assert len(eng.running) == 1
    # run until all N choices decode together, then pause to look at their block tables
    gate.close_if = lambda outs: len(eng.running) == N and all(
        s.status == "running" for s in eng.running)
    gate.open()
    wait_until(lambda: not gate.open_.is_set())
    seqs = list(eng.running)
    shared = seqs[0].blocks[:full]
    for s in seqs:
        assert s.blocks[:full] == shared              # the same physical blocks ...
    for b in shared:
        assert eng.blocks.ref[b] == N                 # ... referenced by every choice
    tails = {s.blocks[full] for s in seqs}
    assert len(tails) == N                            # the partial block is each one's own
    gate.open()
    t.join(60)
    r = out["r"].json()
    alone = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["index"] for c in r["choices"]] == list(range(N))
    assert all(c["text"] == alone["choices"][0]["text"] for c in r["choices"])
    # the N - 1 later choices found the prompt's full blocks in the cache
    assert eng.stats().prefix_cache_hit_tokens - hits >= (N - 1) * full * bs
    assert r["usage"]["prompt_tokens"] == len(prompt)
    assert eng.stats().kv_blocks_used == 0


def test_n_seeded_choices_equal_single_requests(server):
    body = {"model": "tiny", "prompt": PROMPT, "temperature": 0.9, "max_tokens": 8,
            "ignore_eos": True, "seed": 11}
    many = httpx.post(server.url + "/v1/completions", json={**body, "n": 3},
                      timeout=60).json()
    for j in range(3):
        one = httpx.post(server.url + "/v1/completions", json={**body, "seed": 11 + j},
                         timeout=60).json()
        assert many["choices"][j]["text"] == one["choices"][0]["text"]
    assert len({c["text"] for c in many["choices"]}) == 3
