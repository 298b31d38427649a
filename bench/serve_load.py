"""Load benchmark of ``poot serve``: K concurrent streaming clients for M seconds.

    poot serve --port 8000 &                      # any model; wait until it says ready
    python bench/serve_load.py --url http://127.0.0.1:8000 --clients 16 --seconds 30

Each client sends streaming chat completions one after another (prompts from a fixed list,
``--max-tokens`` each, greedy by default) until M seconds have passed (``--token-prompts N``:
streaming completions of N random token ids each instead, ``ignore_eos`` so every reply has
``--max-tokens`` tokens, timed by the ``token_ids`` of each chunk: for a model served with
``--random-weights``, which has no tokenizer); requests still
running then finish (each has a time limit). Only loopback addresses are accepted: this
drives a server on this machine, nothing else. Prints one JSON object:

    requests, requests_per_s, output_tokens, output_tokens_per_s (usage's completion tokens
    over the wall time), ttft_s {p50, p99, mean} (request sent -> first content chunk),
    itl_s {p50, p99, mean} (gaps between content chunks), errors (must be 0), and the
    settings. ``--procs P`` spreads the clients over P processes (their results merged).
    ``--server-metrics`` adds the server's batching figures from /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import re
import socket
import sys
import time
from urllib.parse import urlparse

import httpx

PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.",
    "Explain photosynthesis in one paragraph.", "List three uses of copper.",
    "Why is the sky blue?", "Give me a recipe for pancakes.",
    "What does a compiler do?", "Tell me a short story about a robot.",
    "How do airplanes fly?", "What is the speed of light?",
    "Describe the water cycle.", "What is a prime number?",
    "Translate 'good morning' to Spanish.", "Who wrote Hamlet?",
    "What causes the seasons?", "Summarize the plot of Cinderella.",
]


def loopback_only(url: str) -> None:
    """Refuse a URL whose host does not resolve to loopback addresses only."""
    host = urlparse(url).hostname
    if not host:
        raise SystemExit(f"serve_load: not a URL: {url}")
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except socket.gaierror as e:
        raise SystemExit(f"serve_load: cannot resolve {host}: {e}") from None
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise SystemExit(f"serve_load: {host} is not a loopback address; this benchmark only "
                         f"drives a server on this machine")


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "mean": None}
    s = sorted(xs)

    def q(p):
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"p50": round(q(0.50), 5), "p99": round(q(0.99), 5),
            "mean": round(sum(s) / len(s), 5)}


async def one_request(client: httpx.AsyncClient, body: dict, timeout: float,
                      route: str = "/v1/chat/completions") -> dict:
    """One streaming request: TTFT, the gaps between content chunks (chunks that carry
    ``token_ids``, when the request asked for them), completion tokens."""
    t0 = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    tokens = 0
    async with client.stream("POST", route, json=body, timeout=timeout) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(f"stream error: {ev['error'].get('message')}")
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for ch in ev.get("choices", []):
                if ch.get("delta", {}).get("content") or ch.get("token_ids"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
        if not done:
            raise RuntimeError("stream ended without [DONE]")
    return {"ttft": None if first is None else first - t0, "gaps": gaps, "tokens": tokens}


async def client_loop(i: int, client: httpx.AsyncClient, args, stop_at: float, out: dict):
    n = i
    while time.perf_counter() < stop_at:
        body = {"model": args.model, "stream": True, "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                "stream_options": {"include_usage": True}}
        if args.token_prompts:
            route = "/v1/completions"
            rng = random.Random(n)
            body.update(prompt=[rng.randrange(1, args.token_id_max + 1)
                                for _ in range(args.token_prompts)],
                        ignore_eos=True, return_token_ids=True)
        else:
            route = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}]
        n += args.clients
        try:
            res = await one_request(client, body, args.request_timeout, route)
        except Exception as e:  # noqa: BLE001  (counted and reported)
            out["errors"].append(f"{type(e).__name__}: {e}"[:300])
            continue
        out["requests"] += 1
        out["tokens"] += res["tokens"]
        if res["ttft"] is not None:
            out["ttft"].append(res["ttft"])
        out["itl"] += res["gaps"]


def server_metrics(url: str, headers: dict) -> dict:
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    out = {}
    for name in ("poot_decode_steps_total", "poot_ragged_steps_total",
                 "poot_ahead_steps_total", "poot_engine_generated_tokens_total",
                 "poot_decode_batch_max", "poot_preemptions_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        if m:
            out[name] = float(m.group(1))
    return out


async def run_clients(args, first: int, count: int) -> dict:
    """Clients ``first .. first + count - 1`` of K for M seconds: their raw counts, TTFTs and
    gaps, and the wall time (one process's share of the load)."""
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=count + 4)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits) as c:
        out = {"requests": 0, "tokens": 0, "ttft": [], "itl": [], "errors": []}
        t0 = time.perf_counter()
        stop_at = t0 + args.seconds
        await asyncio.gather(*[client_loop(i, c, args, stop_at, out)
                               for i in range(first, first + count)])
        out["wall"] = time.perf_counter() - t0
    return out


def _process_share(args, first: int, count: int) -> dict:
    return asyncio.run(run_clients(args, first, count))


def run(args) -> dict:
    """The K clients, in ``--procs`` processes (K split as evenly as it goes), merged: the
    load generator's own Python must not be what limits a fast server."""
    if args.model is None:
        args.model = httpx.get(args.url + "/v1/models", timeout=30,
                               headers={"authorization": f"Bearer {args.api_key}"}
                               if args.api_key else {}).json()["data"][0]["id"]
    procs = min(args.procs, args.clients)
    shares = [(sum(args.clients // procs + (j < args.clients % procs) for j in range(i)),
               args.clients // procs + (i < args.clients % procs)) for i in range(procs)]
    if procs == 1:
        parts = [_process_share(args, 0, args.clients)]
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            parts = pool.starmap(_process_share, [(args, f, n) for f, n in shares])
    wall = max(x["wall"] for x in parts)
    req = sum(x["requests"] for x in parts)
    toks = sum(x["tokens"] for x in parts)
    errors = [e for x in parts for e in x["errors"]]
    return {"clients": args.clients, "procs": procs, "seconds": args.seconds,
            "wall_s": round(wall, 2), "max_tokens": args.max_tokens,
            "temperature": args.temperature, "token_prompts": args.token_prompts or None,
            "model": args.model, "requests": req,
            "requests_per_s": round(req / wall, 3),
            "output_tokens": toks,
            "output_tokens_per_s": round(toks / wall, 2),
            "ttft_s": percentiles([t for x in parts for t in x["ttft"]]),
            "itl_s": percentiles([g for x in parts for g in x["itl"]]),
            "errors": len(errors), "error_samples": errors[:5]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (loopback)")
    p.add_argument("--clients", "-k", type=int, default=16, help="concurrent clients (K)")
    p.add_argument("--seconds", "-m", type=float, default=30.0, help="how long new requests "
                   "are sent (M)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--model", default=None, help="default: the server's (GET /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--token-prompts", type=int, default=0, metavar="N",
                   help="completions of N random token ids with ignore_eos, instead of "
                        "chat prompts (a server with --random-weights)")
    p.add_argument("--token-id-max", type=int, default=999, metavar="ID",
                   help="with --token-prompts: ids drawn from 1..ID (default: 999)")
    p.add_argument("--procs", type=int, default=1, metavar="P",
                   help="run the K clients in P processes (default 1): one Python process "
                        "parsing every stream can be slower than a GPU server")
    p.add_argument("--server-metrics", action="store_true",
                   help="add the server's decode steps and batch figures for the run")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= 1024 or not 0 < args.seconds <= 3600:
        raise SystemExit("serve_load: --clients in [1, 1024], --seconds in (0, 3600]")
    if not 1 <= args.procs <= 64:
        raise SystemExit("serve_load: --procs in [1, 64]")
    if not 0 <= args.token_prompts <= 4096:
        raise SystemExit("serve_load: --token-prompts in [0, 4096]")
    loopback_only(args.url)
    before = server_metrics(args.url, {"authorization": f"Bearer {args.api_key}"}
                            if args.api_key else {}) if args.server_metrics else None
    res = run(args)
    if before is not None:
        after = server_metrics(args.url, {"authorization": f"Bearer {args.api_key}"}
                               if args.api_key else {})
        steps = sum(after.get(k, 0) - before.get(k, 0)
                    for k in ("poot_decode_steps_total", "poot_ragged_steps_total"))
        toks = after.get("poot_engine_generated_tokens_total", 0) - \
            before.get("poot_engine_generated_tokens_total", 0)
        # every step that samples (plain decode and ragged) counts: tokens per step is the
        # mean number of sequences a step advanced
        res["server"] = {"sampling_steps": steps, "generated_tokens": toks,
                         "mean_sampled_rows": round(toks / steps, 2) if steps else None,
                         "max_decode_batch": after.get("poot_decode_batch_max"),
                         "preemptions": after.get("poot_preemptions_total", 0) -
                         before.get("poot_preemptions_total", 0),
                         "ahead_steps": after.get("poot_ahead_steps_total", 0) -
                         before.get("poot_ahead_steps_total", 0)}
    print(json.dumps(res, indent=2))
    return 0 if res["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
