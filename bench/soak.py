"""Soak and fault test of ``poot serve``: it starts the server on 127.0.0.1 (a free port),
drives it with K clients for a fixed time mixing well-behaved streams with faults, and checks
that the server comes back to where it started.

    python bench/soak.py --seconds 90 --clients 8            # the tiny chat fixture
    python bench/soak.py --model MODEL.gguf --kv-capacity 256 --seconds 120

Each client sends requests one after another until the time is up (or ``--max-requests``
in all), each one of: a streamed chat completion read to the end (greedy or seeded
sampling, stop strings sometimes); a stream the client drops after a few chunks
(``disconnect``); a stream read slowly (``slow``: a pause between chunks); a non-streamed
request the client gives up on after a fraction of a second (``abort``); a malformed or
out-of-range request (``bad``), which must get an OpenAI-shaped 4xx. The KV pool is smaller
than the batch needs (``--kv-blocks``), so sequences are preempted under the load.

Checks: every stream read to the end is well formed (a first chunk with the assistant role,
content deltas, one chunk with a finish reason, ``[DONE]`` last, one id); every bad request
got a 4xx with an ``error`` object; once the load stops the engine runs dry and no KV block
is in use (``/metrics``); the server's resident memory is back within ``--rss-slack-mb`` of
its level after the warm-up (the same mix for ``--warmup`` seconds, so lazily compiled
batch sizes and samplers are loaded before the baseline); greedy replies to fixed prompts
equal those before the soak. Prints one JSON report (requests by outcome, errors by kind,
RSS before/after, blocks in use after, the checks) and exits 1 if a check failed.
Everything goes to the loopback address of the server it started, and it stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL = "soak"
PROMPTS = ["hello there", "tell me a story", "what is 2 + 2?", "list three colors",
           "abc abc abc", "why?", "the quick brown fox", "write a poem about the sea"]
#: (body, why) pairs the server must refuse with a 4xx
BAD = [
    (b'{"model": "soak", "messages": [', "invalid JSON"),
    (b'[1, 2, 3]', "not an object"),
    ({"model": MODEL}, "no messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 5},
     "temperature out of range"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "frobnicate": 1},
     "unknown field"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10 ** 6},
     "past the context"),
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, "unknown model"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "unknown role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "guided_regex": "["},
     "bad regex"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 10 ** 4},
     "n too large"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": [""]},
     "empty stop string"),
]
KINDS = ("stream", "disconnect", "slow", "abort", "bad")


# ---- the server -----------------------------------------------------------------------------

class Server:
    """``poot serve`` as a child process on 127.0.0.1; stderr kept (last lines) on a thread."""

    def __init__(self, model: str, args: list[str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "poot.cli", "serve", "--model", model, "--host",
             "127.0.0.1", "--port", "0", "--served-model-name", MODEL, *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            del self.lines[:-200]

    def wait_ready(self, limit: float) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit("soak: poot serve exited:\n" + "\n".join(self.lines[-30:]))
            if not self.url:
                m = next((re.search(r"listening on (http://\S+?);?\s", ln + " ")
                          for ln in self.lines if "listening on" in ln), None)
                self.url = m.group(1).rstrip(";") if m else ""
            if self.url:
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise SystemExit(f"soak: the server was not ready within {limit} s:\n" +
                         "\n".join(self.lines[-30:]))

    def rss_mb(self) -> float:
        """Resident memory of the server process (``VmRSS``), MiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
        return round(kb / 1024, 1)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {m.group(1): float(m.group(2)) for m in
                re.finditer(r"^(poot_[a-z_]+) ([-+0-9.e]+)$", text, re.M)}

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# ---- requests -------------------------------------------------------------------------------

def chat_body(rng: random.Random, stream: bool, max_tokens: int) -> dict:
    body = {"model": MODEL, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
    if rng.random() < 0.5:
        body.update(temperature=0.8, seed=rng.randrange(1 << 30))
    else:
        body["temperature"] = 0
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(["a", "the", "\n", "e "])]
    if stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    return body


def check_stream(lines: list[str]) -> str | None:
    """None for a well-formed chat stream, else what is wrong with it."""
    events = [ln for ln in lines if ln]
    if not events or events[-1] != "data: [DONE]":
        return "no [DONE] at the end"
    chunks = []
    for ev in events[:-1]:
        if not ev.startswith("data: "):
            return f"not an SSE data line: {ev[:60]!r}"
        try:
            chunks.append(json.loads(ev[6:]))
        except ValueError:
            return f"not JSON: {ev[:60]!r}"
    if "data: [DONE]" in events[:-1]:
        return "[DONE] before the end"
    choice_chunks = [c for c in chunks if c.get("choices")]
    if not choice_chunks:
        return "no chunk with a choice"
    if any(c.get("object") != "chat.completion.chunk" for c in chunks):
        return "a chunk that is not a chat.completion.chunk"
    if len({c.get("id") for c in chunks}) != 1:
        return "chunks of several ids"
    if choice_chunks[0]["choices"][0].get("delta", {}).get("role") != "assistant":
        return "the first chunk has no assistant role"
    finished = [c for c in choice_chunks if c["choices"][0].get("finish_reason")]
    if len(finished) != 1 or finished[0] is not choice_chunks[-1]:
        return "not exactly one finish_reason, on the last choice chunk"
    if any(not isinstance(c["choices"][0].get("delta", {}).get("content", ""), str)
           for c in choice_chunks):
        return "a delta whose content is not a string"
    return None


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()
        self.errors: Counter = Counter()
        self.samples: list[str] = []

    def add(self, outcome: str, error: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if error:
                self.errors[error.split(":")[0]] += 1
                if len(self.samples) < 10:
                    self.samples.append(error)


def one_request(client: httpx.Client, rng: random.Random, kind: str, stats: Stats,
                max_tokens: int, abort_tokens: int) -> None:
    url = "/v1/chat/completions"
    try:
        if kind == "bad":
            body, why = rng.choice(BAD)
            r = client.post(url, **({"content": body} if isinstance(body, bytes) else
                                    {"json": body}),
                            headers={"content-type": "application/json"})
            err = r.json().get("error") if r.headers.get("content-type", "").startswith(
                "application/json") else None
            if 400 <= r.status_code < 500 and isinstance(err, dict) and err.get("message"):
                stats.add("bad_refused")
            else:
                stats.add("bad_wrong", f"bad request ({why}) got {r.status_code}: "
                          f"{r.text[:120]}")
            return
        if kind == "abort":
            body = chat_body(rng, False, max_tokens)
            body.update(max_tokens=abort_tokens, ignore_eos=True)   # long enough to abort
            try:
                client.post(url, json=body,
                            timeout=rng.uniform(0.005, 0.1))
                stats.add("abort_completed")
            except httpx.TimeoutException:
                stats.add("aborted")
            return
        with client.stream("POST", url, json=chat_body(rng, True, max_tokens)) as r:
            if r.status_code in (429, 503):
                r.read()
                stats.add("busy")
                return
            if r.status_code != 200:
                r.read()
                stats.add("stream_error", f"status {r.status_code}: {r.text[:120]}")
                return
            lines = []
            drop_after = rng.randint(1, 4) if kind == "disconnect" else None
            for line in r.iter_lines():
                lines.append(line)
                if drop_after is not None and sum(1 for ln in lines if ln) >= drop_after:
                    stats.add("disconnected")
                    return
                if kind == "slow" and line:
                    time.sleep(rng.uniform(0.02, 0.15))
        bad = check_stream(lines)
        stats.add(f"{kind}_ok" if bad is None else "stream_malformed",
                  None if bad is None else f"malformed stream: {bad}")
    except httpx.HTTPError as e:
        stats.add("transport_error", f"{type(e).__name__}: {e}")


def drive(url: str, clients: int, seconds: float, max_requests: int, seed: int,
          max_tokens: int, abort_tokens: int) -> Stats:
    """``clients`` threads sending the request mix until ``seconds`` pass or
    ``max_requests`` were sent in all. The clients' first requests take the kinds in
    turn (client k's i-th: ``KINDS[k + i * clients]``, modulo), so every kind is sent
    once each client has sent ``ceil(len(KINDS) / clients)`` requests, however slow the
    machine; the rest are drawn at random."""
    stats, budget, lock = Stats(), [max_requests], threading.Lock()
    end = time.monotonic() + seconds
    rounds = -(-len(KINDS) // clients)

    def client_loop(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        sent = 0
        with httpx.Client(base_url=url, timeout=60) as client:
            while time.monotonic() < end:
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                if sent < rounds:
                    kind = KINDS[(k + sent * clients) % len(KINDS)]
                else:
                    kind = rng.choices(KINDS, weights=(4, 2, 1, 2, 2))[0]
                sent += 1
                one_request(client, rng, kind, stats, rng.randint(1, max_tokens), abort_tokens)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)
    return stats


def greedy_replies(url: str, max_tokens: int) -> list[tuple[str, str]]:
    out = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for p in PROMPTS[:4]:
            r = client.post("/v1/chat/completions", json={
                "model": MODEL, "temperature": 0, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": p}]})
            r.raise_for_status()
            c = r.json()["choices"][0]
            out.append((c["message"]["content"], c["finish_reason"]))
    return out


def wait_idle(server: Server, limit: float) -> dict[str, float]:
    """The server's metrics once nothing runs, waits or is in flight (at most ``limit`` s)."""
    end = time.monotonic() + limit
    while True:
        m = server.metrics()
        busy = sum(m.get(k, 0) for k in ("poot_num_requests_running",
                                          "poot_num_requests_waiting",
                                          "poot_server_sequences_in_flight"))
        if not busy or time.monotonic() > end:
            return m
        time.sleep(0.2)


def default_model(folder: str) -> str:
    """The server tests' tiny Q4_1 GGUF with a chat template (``test/driver``)."""
    sys.path.insert(0, str(ROOT / "test" / "driver"))
    from chat_fixture import chat_gguf

    return str(chat_gguf(Path(folder)))


def soak(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="poot-soak-") as tmp:
        model = args.model or default_model(tmp)
        pool = ["--kv-blocks", str(args.kv_blocks)] if args.kv_blocks else []
        server = Server(model, ["--kv-capacity", str(args.kv_capacity), "--max-batch",
                                str(args.max_batch), *pool, "--prefill-chunk", "16",
                                "--drain-timeout", "5"])
        try:
            t_start = time.monotonic()
            server.wait_ready(args.ready_timeout)
            ready_s = time.monotonic() - t_start
            before = greedy_replies(server.url, args.greedy_tokens)
            abort_tokens = args.kv_capacity - 40
            warm = drive(server.url, args.clients, args.warmup, args.max_requests, args.seed + 1,
                         args.max_tokens, abort_tokens)
            wait_idle(server, 60)
            rss_before = server.rss_mb()
            t0 = time.monotonic()
            stats = drive(server.url, args.clients, args.seconds, args.max_requests, args.seed,
                          args.max_tokens, abort_tokens)
            wall = time.monotonic() - t0
            m = wait_idle(server, 60)
            time.sleep(1.0)
            rss_after = server.rss_mb()
            after = greedy_replies(server.url, args.greedy_tokens)
        finally:
            status = server.stop()
    used = m.get("poot_kv_blocks_used")
    busy = {k: m.get(k) for k in ("poot_num_requests_running", "poot_num_requests_waiting",
                                  "poot_server_sequences_in_flight")}
    checks = {
        "streams_well_formed": stats.outcomes["stream_malformed"] == 0,
        "bad_requests_refused_4xx": stats.outcomes["bad_wrong"] == 0,
        "no_transport_or_server_errors": not (stats.outcomes["transport_error"] or
                                              stats.outcomes["stream_error"]),
        "engine_idle_after": not any(busy.values()),
        "no_kv_blocks_leaked": used == 0,
        "rss_back_to_baseline": rss_after <= rss_before + args.rss_slack_mb,
        "greedy_unchanged": before == after,
        "server_exited_0": status == 0,
        "completed_streams": stats.outcomes["stream_ok"] + stats.outcomes["slow_ok"] > 0,
    }
    return {
        "ok": all(checks.values()), "checks": checks,
        "seconds": round(wall, 1), "clients": args.clients, "ready_s": round(ready_s, 1),
        "requests": sum(stats.outcomes.values()),
        "outcomes": dict(sorted(stats.outcomes.items())),
        "errors": dict(sorted(stats.errors.items())), "error_samples": stats.samples,
        "warmup_requests": sum(warm.outcomes.values()),
        "rss_mb": {"before": rss_before, "after": rss_after, "slack": args.rss_slack_mb},
        "kv_blocks_used_after": used, "kv_blocks_total": m.get("poot_kv_blocks_total"),
        "preemptions": m.get("poot_preemptions_total", m.get("poot_preemptions")),
        "server_aborted_sequences": m.get("poot_aborted_sequences_total"),
        "idle_after": busy, "greedy_replies": len(before),
        "settings": {"model": args.model or "tiny chat fixture", "max_batch": args.max_batch,
                     "kv_blocks": args.kv_blocks, "kv_capacity": args.kv_capacity,
                     "max_tokens": args.max_tokens, "seed": args.seed},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a .gguf or HF folder with a chat template (default: the "
                                    "server tests' tiny chat fixture)")
    ap.add_argument("--seconds", type=float, default=60.0, help="soak time (default 60)")
    ap.add_argument("--warmup", type=float, default=5.0, help="warm-up time before the RSS "
                                                                "baseline (default 5)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-requests", type=int, default=20000, help="at most this many "
                                                                    "requests in each phase")
    ap.add_argument("--max-tokens", type=int, default=48, help="largest max_tokens asked")
    ap.add_argument("--greedy-tokens", type=int, default=24)
    ap.add_argument("--kv-capacity", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--kv-blocks", type=int, default=5,
                    help="KV pool blocks (default 5: fewer than the batch can use; 0: the "
                         "server's default, every batch place a full context)")
    ap.add_argument("--rss-slack-mb", type=float, default=64.0)
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    report = soak(args)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
