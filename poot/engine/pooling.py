"""Pooled steps on a device: embeddings and cross-encoder scores for whole inputs at once.

:class:`PoolingRunner` owns the executor :class:`~poot.executor.Engine` of one loaded model
and its pooled entries (:class:`~poot.models.pooling.PoolSpec`), one per (batch bucket,
token bucket), each compiled through the compile cache the first time it is needed. A call
takes a list of inputs (token ids, optionally segment ids), sorts them by length, cuts them
into batches of at most ``max_batch`` rows, pads each batch to its buckets (idle rows have
length 0 and are not read back) and runs one step per batch. No KV cache exists: nothing is
kept between calls except the weights and the compiled programs.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np

from poot.engine.runner import decode_buckets
from poot.executor import Engine
from poot.models.pooling import PoolSpec

#: The smallest token bucket (shorter inputs are padded to it).
MIN_TOKEN_BUCKET = 16


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token lengths a pooled step is compiled for: powers of two from
    :data:`MIN_TOKEN_BUCKET` below ``max_tokens``, then ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out, t = [], MIN_TOKEN_BUCKET
    while t < max_tokens:
        out.append(t)
        t *= 2
    return tuple(out + [max_tokens])


class PoolingRunner:
    """The pooled steps of one model on one device (module doc).

    Args:
        model, weights: a family instance with ``trace_pooled`` and its bound weights (no
            LM head needed).
        device: the executor device.
        compile_step: ``(key_model, weight_types, spec, trace) -> Program``, as
            :class:`~poot.engine.runner.ModelRunner`'s.
        max_batch: rows per step at most. max_tokens: tokens per row at most.
        pooling, normalize, outputs: the :class:`PoolSpec` fields every entry uses.
        on_compile: called with an entry's name before it is compiled or loaded.
    """

    def __init__(self, model, weights, device, compile_step: Callable, max_batch: int,
                 max_tokens: int, pooling: str, normalize: bool, outputs: str = "embeddings",
                 on_compile: Callable[[str], None] | None = None):
        self.model, self.weights = model, weights
        self.compile_step = compile_step
        self.batch_buckets = decode_buckets(max_batch)
        self.tok_buckets = token_buckets(max_tokens)
        self.max_batch, self.max_tokens = max_batch, max_tokens
        self.pooling, self.normalize, self.outputs = pooling, normalize, outputs
        self.on_compile = on_compile
        self.engine = Engine(device)
        self._uploaded = False
        self._entries: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()
        self.compile_s: dict[str, float] = {}
        self.steps = 0

    def spec(self, batch: int, tokens: int) -> PoolSpec:
        """The :class:`PoolSpec` of the entry of ``batch`` rows x ``tokens`` tokens."""
        return PoolSpec(batch, tokens, self.pooling, self.normalize, self.outputs)

    def entry(self, batch: int, tokens: int):
        """The entry of exactly ``batch`` x ``tokens`` (compiled or found on first use)."""
        key = (batch, tokens)
        e = self._entries.get(key)
        if e is None:
            spec = self.spec(batch, tokens)
            name = f"pooled[B={batch},T={tokens}]"
            if self.on_compile:
                self.on_compile(name)
            t0 = time.perf_counter()
            prog = self.compile_step(self.model, self.weights.types, spec,
                                     lambda: self.model.trace_pooled(spec, self.weights.types))
            self.compile_s[name] = time.perf_counter() - t0
            if not self._uploaded:       # after the first compile: refusals come first
                self.engine.load_weights(self.weights.arrays, self.weights.types)
                self._uploaded = True
            e = self._entries[key] = self.engine.add_entry(prog)
        return e

    def bucket(self, n: int, buckets: Sequence[int]) -> int:
        for b in buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")

    def warm_up(self, batches: Sequence[int] = (), tokens: Sequence[int] = ()) -> None:
        """Compile (or load) the entries of ``batches`` x ``tokens`` (default: the largest
        batch bucket and the smallest token bucket)."""
        for b in batches or (self.batch_buckets[-1],):
            for t in tokens or (self.tok_buckets[0],):
                self.entry(b, t)

    def run(self, rows: Sequence[Sequence[int]],
            token_types: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """The pooled output of every row, in the order given: f32 [n, H] embeddings (or
        [n, L] scores). Each row is 1..``max_tokens`` token ids (the caller checks ids and
        lengths; ValueError here otherwise); ``token_types``: per-row segment ids of the same
        lengths (None: all 0). Thread-safe (one call runs at a time)."""
        n = len(rows)
        if n == 0:
            return np.zeros((0, 0), np.float32)
        lens = [len(r) for r in rows]
        if min(lens) < 1 or max(lens) > self.max_tokens:
            raise ValueError(f"every row needs 1..{self.max_tokens} tokens")
        order = sorted(range(n), key=lambda i: lens[i])
        results: list[np.ndarray | None] = [None] * n
        with self._lock:
            for s in range(0, n, self.max_batch):
                idx = order[s:s + self.max_batch]
                t = self.bucket(max(lens[i] for i in idx), self.tok_buckets)
                bsz = self.bucket(len(idx), self.batch_buckets)
                e = self.entry(bsz, t)
                tokens = np.zeros((bsz, t), np.int32)
                types = np.zeros((bsz, t), np.int32)
                lengths = np.zeros(bsz, np.int32)
                for j, i in enumerate(idx):
                    tokens[j, :lens[i]] = rows[i]
                    if token_types is not None:
                        types[j, :lens[i]] = token_types[i]
                    lengths[j] = lens[i]
                positions = np.broadcast_to(np.arange(t, dtype=np.int32), (bsz, t)).copy()
                feed = {"tokens": tokens, "positions": positions, "lengths": lengths}
                if "token_types" in e.input_names:
                    feed["token_types"] = types
                out = self.engine.step(e, feed, read=[self.outputs])[self.outputs]
                self.steps += 1
                for j, i in enumerate(idx):
                    results[i] = np.array(out[j], np.float32)
        return np.stack(results)


__all__ = ["MIN_TOKEN_BUCKET", "PoolingRunner", "token_buckets"]
