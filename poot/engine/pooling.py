"""Pooled steps on a device: embeddings and cross-encoder scores for whole inputs at once.

:class:`PoolingRunner` owns the runtime :class:`~poot.runtime.Session` of one loaded model
and its pooled entries (:class:`~poot.models.pooling.PoolSpec`), one per (batch bucket,
token bucket), each compiled through the compile cache the first time it is needed. A call
takes a list of inputs (token ids, optionally segment ids), sorts them by length, cuts them
into batches of at most ``max_batch`` rows, pads each batch to its buckets (idle rows have
length 0 and are not read back) and runs one step per batch. No KV cache exists: nothing is
kept between calls except the weights and the compiled programs.

:class:`PoolQueue` is the scheduler the server (and :class:`~poot.api.pooling.PoolingModel`) goes
through: one thread per model forms each step from rows of any waiting requests, so
concurrent callers share steps.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from typing import Callable, Sequence

import numpy as np

from poot.engine.runner import RunnerBase, decode_buckets, smallest_bucket
from poot.errors import PootError
from poot.models.pooling import PoolSpec

#: The smallest token bucket (shorter inputs are padded to it).
MIN_TOKEN_BUCKET = 16
#: Rows that may wait in a :class:`PoolQueue` by default.
DEFAULT_MAX_PENDING_ROWS = 4096


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


class PoolingRunner(RunnerBase):
    """The pooled steps of one model on one device (module doc).

    Args:
        model, weights: a family instance with ``trace_pooled`` and its bound weights (no
            LM head needed).
        device, compile_step, on_compile, storage_type: as
            :class:`~poot.engine.runner.RunnerBase`'s.
        max_batch: rows per step at most. max_tokens: tokens per row at most.
        pooling, normalize, outputs: the :class:`PoolSpec` fields every entry uses.
    """

    def __init__(self, model, weights, device, compile_step: Callable, max_batch: int,
                 max_tokens: int, pooling: str, normalize: bool, outputs: str = "embeddings",
                 on_compile: Callable[[str], None] | None = None,
                 storage_type: Callable | None = None):
        super().__init__(model, weights, device, compile_step, on_compile, storage_type)
        self.batch_buckets = decode_buckets(max_batch)
        self.tok_buckets = token_buckets(max_tokens)
        self.max_batch, self.max_tokens = max_batch, max_tokens
        self.pooling, self.normalize, self.outputs = pooling, normalize, outputs
        self._entries: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()
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
            prog = self._compile(f"pooled[B={batch},T={tokens}]", self.model,
                                 self.weights.types, spec,
                                 lambda: self.model.trace_pooled(spec, self.weights.types))
            e = self._entries[key] = self.session.add_entry(prog)
        return e

    def bucket(self, n: int, buckets: Sequence[int]) -> int:
        """The smallest of ``buckets`` (:attr:`batch_buckets` or :attr:`tok_buckets`)
        holding ``n``; ValueError past the largest."""
        return smallest_bucket(n, buckets)

    def warm_up(self, batches: Sequence[int] = (), tokens: Sequence[int] = ()) -> None:
        """Compile (or load) the entries of ``batches`` x ``tokens`` (default: the largest
        batch bucket and the smallest token bucket)."""
        for b in batches or (self.batch_buckets[-1],):
            for t in tokens or (self.tok_buckets[0],):
                self.entry(b, t)

    def step(self, rows: Sequence[Sequence[int]],
             token_types: Sequence[Sequence[int] | None] | None = None) -> np.ndarray:
        """One pooled step over 1..``max_batch`` rows: f32 [n, H] embeddings (or [n, L]
        scores) in the order given. The batch is padded to its batch bucket and to the token
        bucket of its longest row. Rows: 1..``max_tokens`` token ids (ValueError otherwise);
        ``token_types``: per-row segment ids of the same lengths, or None (all 0) for the
        whole batch or for a row. Thread-safe (one step runs at a time)."""
        n, lens = len(rows), [len(r) for r in rows]
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"a step takes 1..{self.max_batch} rows, got {n}")
        if min(lens) < 1 or max(lens) > self.max_tokens:
            raise ValueError(f"every row needs 1..{self.max_tokens} tokens")
        t = self.bucket(max(lens), self.tok_buckets)
        bsz = self.bucket(n, self.batch_buckets)
        tokens = np.zeros((bsz, t), np.int32)
        types = np.zeros((bsz, t), np.int32)
        lengths = np.zeros(bsz, np.int32)
        for j, r in enumerate(rows):
            tokens[j, :lens[j]] = r
            if token_types is not None and token_types[j] is not None:
                types[j, :lens[j]] = token_types[j]
            lengths[j] = lens[j]
        positions = np.broadcast_to(np.arange(t, dtype=np.int32), (bsz, t)).copy()
        feed = {"tokens": tokens, "positions": positions, "lengths": lengths}
        with self._lock:
            e = self.entry(bsz, t)
            if "token_types" in e.input_names:
                feed["token_types"] = types
            out = self.session.step(e, feed, read=[self.outputs])[self.outputs]
            self.steps += 1
        return np.array(out[:n], np.float32)

    def run(self, rows: Sequence[Sequence[int]],
            token_types: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """The pooled output of every row, in the order given: f32 [n, H] embeddings (or
        [n, L] scores), rows sorted by length and cut into steps of ``max_batch`` (this
        call's rows only; :class:`PoolQueue` batches across callers). Arguments and errors
        as :meth:`step`'s."""
        n = len(rows)
        if n == 0:
            return np.zeros((0, 0), np.float32)
        order = sorted(range(n), key=lambda i: len(rows[i]))
        results = np.zeros((n, 0), np.float32)
        for s in range(0, n, self.max_batch):
            idx = order[s:s + self.max_batch]
            out = self.step([rows[i] for i in idx],
                            None if token_types is None else [token_types[i] for i in idx])
            if results.shape[1] == 0:
                results = np.zeros((n, out.shape[1]), np.float32)
            results[idx] = out
        return results


class PoolQueueFull(PootError):
    """A request would take the rows waiting in a :class:`PoolQueue` past its bound (the
    server answers 429 ``queue_full``)."""


class _Request:
    """A submitted request: its rows, the indices not yet taken into a step, the outputs
    so far and its future."""

    def __init__(self, rows, types, future: Future):
        self.rows, self.types, self.future = rows, types, future
        self.waiting = list(range(len(rows)))
        self.left = len(rows)                # rows whose output has not come back
        self.out: list[np.ndarray | None] = [None] * len(rows)


class PoolQueue:
    """One scheduler thread that runs the pooled steps of every caller of one
    :class:`PoolingRunner`, filling each step with rows of any waiting requests.

    A step is formed from the oldest waiting row: its token bucket ``t``, then every
    waiting row (requests in arrival order, rows in order) whose bucket is at most ``t``,
    up to ``max_batch`` rows; rows of one request may span steps. A request's future gets
    f32 [n, H] (or [n, L]) once all its rows ran; cancelling the future drops its rows not
    yet run. A step that raises fails the requests of its rows.

    Counters (read by the server's metrics): ``requests`` submitted, ``rows`` run,
    ``dropped`` rows of cancelled requests, ``steps``, ``pending_rows`` waiting now, and
    ``fill[k]``: steps that ran k rows.

    Args:
        runner: the :class:`PoolingRunner`.
        max_pending_rows: rows that may wait; past it :meth:`submit` raises
            :class:`PoolQueueFull` (a request is always admitted into an empty queue).
    """

    def __init__(self, runner: PoolingRunner, max_pending_rows: int = DEFAULT_MAX_PENDING_ROWS):
        self.runner, self.max_pending_rows = runner, max_pending_rows
        self.cond = threading.Condition()
        self.pending: deque[_Request] = deque()
        self.pending_rows = self.requests = self.rows = self.dropped = self.steps = 0
        self.fill = [0] * (runner.max_batch + 1)
        self.closed = self.paused = False
        self.thread = threading.Thread(target=self._loop, name="poot-pool", daemon=True)
        self.thread.start()

    def submit(self, rows: Sequence[Sequence[int]],
               token_types: Sequence[Sequence[int]] | None = None,
               bounded: bool = True) -> Future:
        """Queue ``rows`` (token-id lists, 1..``max_tokens`` each; ``token_types``: segment
        ids of the same lengths, or None) and return a :class:`concurrent.futures.Future`
        of their f32 [n, H] outputs in order. Raises ValueError for an empty or bad row,
        :class:`PoolQueueFull` (``bounded`` only) when the rows would exceed the bound,
        PootError once the queue is closed."""
        lens = [len(r) for r in rows]
        if not lens or min(lens) < 1 or max(lens) > self.runner.max_tokens:
            raise ValueError(f"a request needs rows of 1..{self.runner.max_tokens} tokens")
        req = _Request(rows, token_types, Future())
        with self.cond:
            if self.closed:
                raise PootError("the pooled queue is closed")
            if bounded and self.pending_rows and \
                    self.pending_rows + len(rows) > self.max_pending_rows:
                raise PoolQueueFull(f"{self.pending_rows} rows are waiting; this request "
                                    f"has {len(rows)} and the queue takes "
                                    f"{self.max_pending_rows}")
            self.pending.append(req)
            self.pending_rows += len(rows)
            self.requests += 1
            self.cond.notify_all()
        return req.future

    def run(self, rows: Sequence[Sequence[int]],
            token_types: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """:meth:`submit` (unbounded) and wait: f32 [n, H], or [0, 0] for no rows."""
        if not rows:
            return np.zeros((0, 0), np.float32)
        return self.submit(rows, token_types, bounded=False).result()

    def pause(self, paused: bool = True) -> None:
        """Hold (or, with False, resume) the steps not yet begun; requests still queue."""
        with self.cond:
            self.paused = paused
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the thread after the step in progress; waiting requests fail (PootError)."""
        with self.cond:
            self.closed = True
            left, self.pending = list(self.pending), deque()
            self.pending_rows = 0
            self.cond.notify_all()
        for req in left:
            _settle(req.future, exc=PootError("the pooled queue was closed"))
        if threading.current_thread() is not self.thread:
            self.thread.join(60)

    def _take(self) -> list[tuple[_Request, int]]:
        """The next step's (request, row) pairs (called holding the lock)."""
        for req in [r for r in self.pending if r.future.cancelled()]:
            self.pending.remove(req)
            self.pending_rows -= len(req.waiting)
            self.dropped += len(req.waiting)
        if not self.pending:
            return []
        bucket = lambda req, i: self.runner.bucket(len(req.rows[i]), self.runner.tok_buckets)
        t = bucket(self.pending[0], self.pending[0].waiting[0])
        picked: list[tuple[_Request, int]] = []
        for req in self.pending:
            keep = []
            for i in req.waiting:
                if len(picked) < self.runner.max_batch and bucket(req, i) <= t:
                    picked.append((req, i))
                else:
                    keep.append(i)
            req.waiting = keep
        self.pending = deque(r for r in self.pending if r.waiting)
        self.pending_rows -= len(picked)
        return picked

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or (self.pending and not self.paused))
                if self.closed:
                    return
                picked = self._take()
            if not picked:
                continue
            try:
                out = self.runner.step([r.rows[i] for r, i in picked],
                                       [None if r.types is None else r.types[i]
                                        for r, i in picked])
            except Exception as e:  # noqa: BLE001  (fails the requests of this step)
                failed = {id(r): r for r, _ in picked}.values()
                with self.cond:          # their rows still waiting are dropped with them
                    for r in failed:
                        self.pending_rows -= len(r.waiting)
                        r.waiting = []
                    self.pending = deque(r for r in self.pending if r.waiting)
                for r in failed:
                    _settle(r.future, exc=e)
                continue
            with self.cond:
                self.steps += 1
                self.rows += len(picked)
                self.fill[len(picked)] += 1
            for j, (r, i) in enumerate(picked):
                r.out[i] = out[j]
                r.left -= 1
                if r.left == 0:
                    _settle(r.future, np.stack(r.out))


def _settle(fut: Future, value=None, exc: BaseException | None = None) -> None:
    """Complete ``fut`` unless it was cancelled or already completed."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)
    except InvalidStateError:
        pass


__all__ = ["DEFAULT_MAX_PENDING_ROWS", "MIN_TOKEN_BUCKET", "PoolQueue", "PoolQueueFull",
           "PoolingRunner", "token_buckets"]
