"""gpt-fast-style decode baseline: a hand-written Llama (random-init weights), a static KV
cache, the decode step under torch.compile(mode="reduce-overhead") (CUDA graphs), greedy argmax
on the GPU, batch 1. Prints/writes decode tok/s per (shape, dtype).

    python3 bench/gpu_run/baseline_torch.py OUT.json [smollm2:bf16 smollm2:f32 llama1b:bf16 ...]
"""
from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

DEV = "cuda"

SHAPES = {  # dim, layers, heads, kv_heads, ffn, vocab, rope_base
    "smollm2": (576, 30, 9, 3, 1536, 49152, 100000.0),
    "llama1b": (2048, 16, 32, 8, 8192, 128256, 500000.0),
    "llama8b": (4096, 32, 32, 8, 14336, 128256, 500000.0),
}


class Model(torch.nn.Module):
    def __init__(self, dim, layers, heads, kvh, ffn, vocab, base, cap, dtype):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kvh, dim // heads
        hd = self.hd
        g = lambda *s: torch.nn.Parameter(torch.randn(*s, dtype=dtype) * 0.02,  # noqa: E731
                                          requires_grad=False)
        self.emb = g(vocab, dim)
        self.wqkv = torch.nn.ParameterList([g((heads + 2 * kvh) * hd, dim) for _ in range(layers)])
        self.wo = torch.nn.ParameterList([g(dim, heads * hd) for _ in range(layers)])
        self.w13 = torch.nn.ParameterList([g(2 * ffn, dim) for _ in range(layers)])
        self.w2 = torch.nn.ParameterList([g(dim, ffn) for _ in range(layers)])
        self.n1 = [torch.ones(dim, dtype=dtype, device=DEV) for _ in range(layers)]
        self.n2 = [torch.ones(dim, dtype=dtype, device=DEV) for _ in range(layers)]
        self.nf = torch.ones(dim, dtype=dtype, device=DEV)
        self.kc = torch.zeros(layers, 1, kvh, cap, hd, dtype=dtype, device=DEV)
        self.vc = torch.zeros(layers, 1, kvh, cap, hd, dtype=dtype, device=DEV)
        inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=DEV).float() / hd))
        f = torch.outer(torch.arange(cap, device=DEV).float(), inv)
        self.cos, self.sin = f.cos().to(dtype), f.sin().to(dtype)
        self.cap, self.ffn, self.layers = cap, ffn, layers

    def rope(self, x, pos):
        c, s = self.cos[pos].view(1, 1, 1, -1), self.sin[pos].view(1, 1, 1, -1)
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(self, tok, pos):  # tok [1,1] int64, pos [1] int64
        x = self.emb[tok]                                       # [1,1,dim]
        mask = (torch.arange(self.cap, device=DEV) <= pos).view(1, 1, 1, -1)
        for i in range(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), self.n1[i], 1e-5)
            qkv = F.linear(h, self.wqkv[i])
            q, k, v = qkv.split([self.h * self.hd, self.kvh * self.hd, self.kvh * self.hd], -1)
            q = self.rope(q.view(1, 1, self.h, self.hd), pos).transpose(1, 2)
            k = self.rope(k.view(1, 1, self.kvh, self.hd), pos).transpose(1, 2)
            v = v.view(1, 1, self.kvh, self.hd).transpose(1, 2)
            self.kc[i].index_copy_(2, pos, k)
            self.vc[i].index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, self.kc[i], self.vc[i], attn_mask=mask,
                                               enable_gqa=True)
            x = x + F.linear(o.transpose(1, 2).reshape(1, 1, -1), self.wo[i])
            h = F.rms_norm(x, (x.shape[-1],), self.n2[i], 1e-5)
            a, b = F.linear(h, self.w13[i]).split([self.ffn, self.ffn], -1)
            x = x + F.linear(F.silu(a) * b, self.w2[i])
        x = F.rms_norm(x, (x.shape[-1],), self.nf, 1e-5)
        return torch.argmax(F.linear(x, self.emb), -1)        # tied head, greedy on device


def bench(name, dtype_s, cap=256, n=200):
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}[dtype_s]
    torch.manual_seed(0)
    with torch.device(DEV):
        m = Model(*SHAPES[name], cap=cap, dtype=dtype)
    step = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)
    tok = torch.zeros(1, 1, dtype=torch.long, device=DEV)
    t0 = time.perf_counter()
    with torch.no_grad():
        for p in range(3):                                     # compile + graph capture
            tok = step(tok, torch.tensor([p], device=DEV)).view(1, 1).clone()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        pos = [torch.tensor([p % cap], device=DEV) for p in range(n)]
        t = time.perf_counter()
        for p in range(n):
            tok = step(tok, pos[p]).view(1, 1).clone()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        tok.item()
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    r = {"shape": name, "dtype": dtype_s, "kv_capacity": cap, "steps": n,
         "tok_per_s": round(n / dt, 1), "ms_per_tok": round(1e3 * dt / n, 3),
         "weight_MB": round(nbytes / 1e6, 1), "GB_per_s": round(nbytes * n / dt / 1e9, 1),
         "compile_s": round(compile_s, 1)}
    print(json.dumps(r), flush=True)
    return r


if __name__ == "__main__":
    out = sys.argv[1]
    todo = sys.argv[2:] or ["smollm2:bf16", "smollm2:f32"]
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "runs": []}
    for spec in todo:
        name, dt = spec.split(":")
        try:
            res["runs"].append(bench(name, dt))
        except Exception as e:  # noqa: BLE001
            res["runs"].append({"shape": name, "dtype": dt, "error": f"{type(e).__name__}: {e}"[:800]})
            print(res["runs"][-1], flush=True)
        json.dump(res, open(out, "w"), indent=1)
