"""gpt-fast-style decode baseline: a hand-written Llama (random-init weights), a static KV
cache, the decode step under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), greedy
argmax on the GPU, batch ``batch`` (B sequences decoding in lockstep at the same position, one
static [B, kv_heads, capacity, head_dim] cache per layer; tokens/s counts all B rows).
``poot bench --baseline gpt-fast`` calls :func:`run_baseline` in its own process after poot;
run alone it measures named shapes:

    python3 bench/gpu_run/baseline_torch.py OUT.json [smollm2:bf16 llama1b:bf16 llama8b:bf16]

Protocol (the same as ``poot bench``): the prompt (``prompt_tokens`` synthetic ids) is fed
through the decode step one token at a time (not timed: gpt-fast's prefill is a separate
compile that poot's decode numbers do not include either), then ``new_tokens`` greedy steps
are timed, the token fed back on the device; ``runs`` timed runs, the best reported.

The K/V cache is one ``[B, kv_heads, capacity, head_dim]`` buffer per layer (registered with
``register_buffer``, as gpt-fast's ``KVCache`` and ``../shared/bench/batched_baseline.py``
do), written in place with ``index_copy_``. Until 2026-12-05 it was one
``[layers, B, kv_heads, capacity, head_dim]`` plain tensor attribute written through a
per-layer view (``kc[i].index_copy_``): torch.compile functionalizes a write through a view of
a graph input as a scatter into the whole base, so every layer's write could re-materialize
the cache of all layers, and a plain attribute is not a parameter or buffer (the static
inputs of CUDA graph trees). That version measured 7,519 tok/s on the Llama-3.2-1B shape at
B = 64 where the shared script measured 33,407, its step time growing with
B * layers^2 (``bench/results/gpu_baseline.md``).

Bytes per token: the weights one step reads (every matrix; the embedding table once when it
is the tied head, one row when not) + the K/V of the mean context of the timed steps in the
cache dtype: ``layers * 2 * ctx * kv_heads * head_dim * itemsize``. Roofline fraction: bytes
per token * tokens/s / 4.26e12 (the H200's measured copy bandwidth).
"""
from __future__ import annotations

import json
import sys
import time

ROOFLINE_BPS = 4.26e12

SHAPES = {  # hidden, layers, heads, kv_heads, ffn, vocab, rope_theta, tied
    "smollm2": dict(hidden=576, layers=30, heads=9, kv_heads=3, ffn=1536, vocab=49152,
                    rope_theta=100000.0, tied=True),
    "llama1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256,
                    rope_theta=500000.0, tied=True),
    "llama8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                    rope_theta=500000.0, tied=False),
}


def _model(shape: dict, cap: int, dtype, batch: int = 1):
    import torch
    import torch.nn.functional as F

    dev = "cuda"

    class Layer(torch.nn.Module):
        """One block's weights (parameters) and its norms and K/V cache (buffers: static
        addresses to CUDA graphs; see the module docstring)."""

        def __init__(self, g, hidden, heads, kv_heads, hd, ffn):
            super().__init__()
            self.wqkv = g((heads + 2 * kv_heads) * hd, hidden)
            self.wo = g(hidden, heads * hd)
            self.w13 = g(2 * ffn, hidden)
            self.w2 = g(hidden, ffn)
            self.register_buffer("n1", torch.ones(hidden, dtype=dtype, device=dev))
            self.register_buffer("n2", torch.ones(hidden, dtype=dtype, device=dev))
            self.register_buffer("kc", torch.zeros(batch, kv_heads, cap, hd, dtype=dtype,
                                                   device=dev))
            self.register_buffer("vc", torch.zeros(batch, kv_heads, cap, hd, dtype=dtype,
                                                   device=dev))

    class Model(torch.nn.Module):
        def __init__(self, hidden, layers, heads, kv_heads, ffn, vocab, rope_theta, tied,
                     head_dim=None):
            super().__init__()
            hd = head_dim or hidden // heads
            self.h, self.kvh, self.hd = heads, kv_heads, hd

            def g(*s):  # N(0, 1/fan_in): activations stay O(1) (poot's random init too)
                return torch.nn.Parameter(torch.randn(*s, dtype=dtype) / s[-1] ** 0.5,
                                          requires_grad=False)
            self.emb = g(vocab, hidden)
            self.head = self.emb if tied else g(vocab, hidden)
            self.tied = tied
            self.blocks = torch.nn.ModuleList(Layer(g, hidden, heads, kv_heads, hd, ffn)
                                              for _ in range(layers))
            self.register_buffer("nf", torch.ones(hidden, dtype=dtype, device=dev))
            self.b = batch
            inv = 1.0 / (rope_theta ** (torch.arange(0, hd, 2, device=dev).float() / hd))
            f = torch.outer(torch.arange(cap, device=dev).float(), inv)
            self.register_buffer("cos", f.cos().to(dtype))
            self.register_buffer("sin", f.sin().to(dtype))
            self.cap, self.ffn, self.layers = cap, ffn, layers

        def reset_cache(self):
            for blk in self.blocks:
                blk.kc.zero_()
                blk.vc.zero_()

        def rope(self, x, pos):
            c, s = self.cos[pos].view(1, 1, 1, -1), self.sin[pos].view(1, 1, 1, -1)
            x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

        def forward(self, tok, pos):  # tok [B,1] int64, pos [1] int64
            nb = self.b
            x = self.emb[tok]                                       # [B,1,dim]
            mask = (torch.arange(self.cap, device=dev) <= pos).view(1, 1, 1, -1)
            for blk in self.blocks:
                h = F.rms_norm(x, (x.shape[-1],), blk.n1, 1e-5)
                qkv = F.linear(h, blk.wqkv)
                q, k, v = qkv.split([self.h * self.hd, self.kvh * self.hd, self.kvh * self.hd],
                                    -1)
                q = self.rope(q.view(nb, 1, self.h, self.hd), pos).transpose(1, 2)
                k = self.rope(k.view(nb, 1, self.kvh, self.hd), pos).transpose(1, 2)
                v = v.view(nb, 1, self.kvh, self.hd).transpose(1, 2)
                blk.kc.index_copy_(2, pos, k)                       # a whole buffer, no view
                blk.vc.index_copy_(2, pos, v)
                o = F.scaled_dot_product_attention(q, blk.kc, blk.vc, attn_mask=mask,
                                                   enable_gqa=True)
                x = x + F.linear(o.transpose(1, 2).reshape(nb, 1, -1), blk.wo)
                h = F.rms_norm(x, (x.shape[-1],), blk.n2, 1e-5)
                a, b = F.linear(h, blk.w13).split([self.ffn, self.ffn], -1)
                x = x + F.linear(F.silu(a) * b, blk.w2)
            x = F.rms_norm(x, (x.shape[-1],), self.nf, 1e-5)
            return torch.argmax(F.linear(x, self.head), -1)     # greedy on device

    with torch.device(dev):
        return Model(**shape)


def _kernels_per_step(step, tok, pos) -> int | None:
    """CUDA kernels one replayed step launches (torch.profiler over one step); None when the
    profiler reports none (kernels inside a CUDA graph are not always traced)."""
    import torch

    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step(tok, pos)
            torch.cuda.synchronize()
        n = sum(1 for e in prof.events()
                if str(getattr(e, "device_type", "")).endswith("CUDA")
                and not e.name.startswith(("Memcpy", "Memset", "cudaGraph")))
        return n or None
    except Exception:  # noqa: BLE001  (a profiler that cannot run here: report none)
        return None


def run_baseline(shape: dict, dtype: str = "bf16", prompt_tokens: int = 32,
                 new_tokens: int = 128, kv_capacity: int = 512, runs: int = 3,
                 batch: int = 1) -> dict:
    """Measure the baseline on ``shape`` (keys of :data:`SHAPES` entries; ``head_dim``
    optional) at ``batch`` sequences. Returns decode tok/s (all rows), us per step, kernels
    per step, bytes per step, roofline fraction, compile seconds (see the module
    docstring)."""
    import torch

    dt = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}[dtype]
    if prompt_tokens + new_tokens > kv_capacity:
        raise ValueError(f"{prompt_tokens} + {new_tokens} tokens exceed the KV capacity "
                         f"{kv_capacity}")
    torch.manual_seed(0)
    shape = dict(shape)
    m = _model(shape, kv_capacity, dt, batch)
    step = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)
    pos = [torch.tensor([p], device="cuda") for p in range(kv_capacity)]
    t0 = time.perf_counter()
    with torch.no_grad():
        tok = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
        for p in range(3):                                     # compile + graph capture
            tok = step(tok, pos[p]).view(batch, 1).clone()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        best = None
        for _ in range(runs):
            m.reset_cache()
            tok = (torch.arange(batch, device="cuda") % 97 + 17).view(batch, 1)
            for p in range(prompt_tokens):                      # the prompt, untimed
                tok = step(tok, pos[p]).view(batch, 1).clone()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for p in range(prompt_tokens, prompt_tokens + new_tokens):
                tok = step(tok, pos[p]).view(batch, 1).clone()
            torch.cuda.synchronize()
            dt_s = time.perf_counter() - t
            best = dt_s if best is None else min(best, dt_s)
        kernels = _kernels_per_step(step, tok, pos[prompt_tokens])
    hd = shape.get("head_dim") or shape["hidden"] // shape["heads"]
    item = torch.tensor([], dtype=dt).element_size()
    weights = sum(p.numel() * p.element_size() for p in m.parameters())  # head counted once
    if not shape["tied"]:
        weights -= m.emb.numel() * item - shape["hidden"] * item         # one embedding row
    ctx = prompt_tokens + new_tokens / 2
    kv = shape["layers"] * 2 * ctx * shape["kv_heads"] * hd * item * batch
    tps = batch * new_tokens / best
    return {"impl": "gpt-fast-style torch.compile(reduce-overhead)", "torch": torch.__version__,
            "dtype": dtype, "kv_capacity": kv_capacity, "prompt_tokens": prompt_tokens,
            "batch": batch, "new_tokens": new_tokens, "decode_tokens_per_s": tps,
            "us_per_token": 1e6 * batch / tps, "us_per_step": 1e6 * best / new_tokens,
            "dispatches_per_token": kernels, "weight_bytes": int(weights),
            "kv_bytes_read": int(kv), "bytes_per_token": int(weights + kv),
            "roofline_fraction": (weights + kv) * tps / batch / ROOFLINE_BPS,
            "compile_s": compile_s}


if __name__ == "__main__":
    import torch

    out = sys.argv[1]
    todo = sys.argv[2:] or ["smollm2:bf16"]
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "runs": []}
    for spec in todo:                       # shape:dtype[:batch]
        name, dt, *b = spec.split(":")
        try:
            r = run_baseline(SHAPES[name], dt, batch=int(b[0]) if b else 1)
            res["runs"].append({"shape": name, **r})
        except Exception as e:  # noqa: BLE001
            res["runs"].append({"shape": name, "dtype": dt,
                                "error": f"{type(e).__name__}: {e}"[:800]})
        print(json.dumps(res["runs"][-1]), flush=True)
        json.dump(res, open(out, "w"), indent=1)
