"""The bridge between the asyncio front end and the engine thread.

The engine (:class:`~poot.engine.LLMEngine`) runs its loop on one background thread; the
front end only adds and aborts requests (both thread-safe and quick) and reads outputs. Each
request's outputs are handed to the event loop by the engine thread through
``loop.call_soon_threadsafe`` into an ``asyncio.Queue`` (the engine's ``sink`` hook), so the
event loop never waits on a step and no thread is parked per request.

A request waiting for its next output awaits its queue with no timer of its own: one
watchdog task per event loop (:func:`_watchdog`) wakes each waiting request every
``poll_s`` (sooner when its deadline comes first) to check its deadline, the engine's health
and its client. At 64 streams a timer a token was the front end's largest cost after HTTP
(``asyncio.wait_for`` arms and cancels one for every output).

``n`` > 1: the choices of a prompt share its KV blocks through the prefix cache. The first
choice is added alone; when its first output arrives its prompt has been prefilled and every
full block of the prompt is registered in the cache, and only then are the other ``n - 1``
added: they take those blocks (reference-counted, not copied) and each recomputes only the
prompt's last, partial block. A prompt shorter than one block (nothing to share), or an
engine without prefix caching, adds every choice at once.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from poot.sampling_params import SamplingParams
from poot.engine.output_processor import GUIDED_ERROR


class QueueFull(Exception):
    """More sequences are waiting than the server's queue allows (429)."""


class TooManySequences(Exception):
    """A request needs more sequences than the server can ever hold at once (a 400: it
    would never be served)."""


class EngineFault(Exception):
    """The engine stopped after a fault (its requests failed; 500, and the server reports
    itself unhealthy)."""


class ConstraintFailed(EngineFault):
    """The request's guided-decoding constraint failed while it ran (llguidance ran past a
    limit on it): the request's failure, a 400 naming its constraint field."""


class RequestTimeout(Exception):
    """The request ran past the server's request time limit (it was aborted)."""


class ClientGone(Exception):
    """The client disconnected (the request was aborted)."""


class ShuttingDown(Exception):
    """The server is stopping and the drain deadline passed (the request was aborted; 503)."""


#: the choice index of the item :meth:`AsyncEngine.abort_all` queues (no choice has it)
_STOP = -1
_WAKE = -2          # the watchdog's: check the deadline, the engine and the client


class _LoopBatch:
    """One event loop's share of an engine step's outputs, handed over in one
    ``call_soon_threadsafe`` (one wake-up of the loop a step instead of one an output: at 8
    streams on a 2-core machine the loop's Python took a core from the kernels' threads)."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def put_all(self, items: list[tuple["_Sink", Any]]) -> None:
        """Queue each ``(sink, output)`` on its sink's queue, on the loop (engine thread)."""
        try:
            self.loop.call_soon_threadsafe(_queue_all, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _queue_all(items: list[tuple["_Sink", Any]]) -> None:
    for sink, ev in items:
        sink.queue.put_nowait((sink.index, ev))


class _Sink:
    """Receives one request's outputs on the engine thread and queues them on the loop
    (:class:`_LoopBatch` for a whole step's, the engine's ``batch`` protocol)."""

    __slots__ = ("loop", "queue", "index", "batch")

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int,
                 batch: _LoopBatch | None = None):
        self.loop, self.queue, self.index = loop, queue, index
        self.batch = batch

    def put(self, ev: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, ev))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


async def _watchdog(owner: "AsyncEngine", loop: asyncio.AbstractEventLoop) -> None:
    """Wake the requests on ``loop`` that wait for an output when a check is due (their
    ``check_at``, every ``poll_s``, or their deadline): sleep until the earliest, or until a
    request that starts waiting nudges it with an earlier one. Runs while any request is
    live, then ends (the next :meth:`AsyncEngine.submit` on the loop starts another)."""
    nudge = owner._nudges[loop]
    try:
        while True:
            gens = [g for g in owner.live if g.loop is loop]
            if not gens:
                return
            now = time.monotonic()
            due = now + min(g.poll_s for g in gens)   # a busy one may wait by then
            for g in gens:
                at = min(g.check_at, g.deadline)
                if g.waiting and now >= at:
                    g.waiting = False
                    g.queue.put_nowait((_WAKE, None))
                elif at > now:
                    due = min(due, at)
            owner._due[loop] = due
            nudge.clear()
            try:
                await asyncio.wait_for(nudge.wait(), max(due - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                pass
    finally:
        if owner._watchdogs.get(loop) is asyncio.current_task():
            del owner._watchdogs[loop]
            owner._due.pop(loop, None)
            owner._nudges.pop(loop, None)


class AsyncEngine:
    """An :class:`~poot.engine.LLMEngine` (its loop running on its thread) as seen from the
    event loop: :meth:`generate` adds a request's sequences and yields their outputs.

    Args:
        engine: the engine; :meth:`start` starts its loop.
        max_queue: sequences allowed to wait beyond the engine's ``max_batch`` running ones
            (past that :meth:`generate` raises :class:`QueueFull`).
    """

    def __init__(self, engine, max_queue: int):
        self.engine = engine
        self.capacity = engine.config.max_batch + max_queue
        self.inflight = 0                 # sequences added (or about to be) and unfinished
        self.aborts = 0                   # sequences aborted by the front end
        self.live: set[Generation] = set()   # requests submitted and not closed
        self.stopping = False
        self._batches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._watchdogs: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}
        self._nudges: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        self._due: dict[asyncio.AbstractEventLoop, float] = {}   # each watchdog's next pass

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start ``loop``'s :func:`_watchdog` unless it runs."""
        task = self._watchdogs.get(loop)
        if task is None or task.done():
            self._nudges[loop] = asyncio.Event()
            self._watchdogs[loop] = loop.create_task(_watchdog(self, loop))

    def _waits(self, gen: "Generation") -> None:
        """``gen`` starts waiting: nudge its loop's watchdog if its check is due before the
        watchdog's next pass."""
        if min(gen.check_at, gen.deadline) < self._due.get(gen.loop, float("-inf")):
            self._nudges[gen.loop].set()

    def batch_for(self, loop: asyncio.AbstractEventLoop) -> _LoopBatch:
        """The :class:`_LoopBatch` every sink on ``loop`` shares."""
        b = self._batches.get(loop)
        if b is None:
            b = self._batches[loop] = _LoopBatch(loop)
        return b

    def start(self) -> None:
        """Start the engine loop on its thread."""
        self.engine.start()

    @property
    def fault(self) -> str | None:
        """Why the engine stopped (a step raised), or None while it runs."""
        f = self.engine.fault
        return None if f is None else f"{type(f).__name__}: {f}"

    def abort_all(self) -> int:
        """The server stops: every running request's :meth:`Generation.events` raises
        :class:`ShuttingDown` at once, and :meth:`submit` raises it from now on (call on
        the event loop). Returns the number of requests aborted."""
        self.stopping = True
        for gen in self.live:
            gen.queue.put_nowait((_STOP, None))
        return len(self.live)

    def _shareable(self, ids: Sequence[int]) -> bool:
        bm = self.engine.blocks
        return bool(bm.prefix_caching) and (len(ids) - 1) // bm.block_size >= 1

    def submit(self, request_id: str, prompts: Sequence[Sequence[int]],
               params: Sequence[SamplingParams], n: int, deadline: float,
               disconnected: Callable[[], Awaitable[bool]] | None = None,
               poll_s: float = 0.5, lora: str | None = None) -> "Generation":
        """Add a request's sequences now: ``params[p * n + j]`` on ``prompts[p]`` for every
        prompt ``p`` and choice ``j`` (call on the event loop). Raises :class:`QueueFull`
        (nothing added) when the queue cannot take them and :class:`EngineFault` when the
        engine stopped, :class:`ShuttingDown` after :meth:`abort_all`; returns the
        :class:`Generation` to read (and close). ``lora``: the
        LoRA adapter every sequence runs with (a :class:`~poot.models.lora.LoraError` when
        it was unloaded meanwhile)."""
        gen = Generation(self, request_id, prompts, params, n, deadline, disconnected, poll_s)
        gen.lora = lora
        gen._start()
        return gen


class Generation:
    """One request's sequences in the engine (made by :meth:`AsyncEngine.submit`).
    :meth:`events` yields ``(choice index, RequestOutput)`` until every choice finished;
    :meth:`close` (idempotent; call it in a ``finally``) aborts the unfinished ones and
    gives their places in the queue back."""

    def __init__(self, owner: AsyncEngine, request_id: str, prompts, params, n: int,
                 deadline: float, disconnected, poll_s: float):
        self.owner, self.request_id = owner, request_id
        self.prompts, self.params, self.n = prompts, params, n
        self.deadline, self.disconnected, self.poll_s = deadline, disconnected, poll_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.rids: dict[int, str] = {}
        self.unfinished: set[int] = set()
        self.deferred: dict[int, list[int]] = {}     # first choice of a prompt -> the rest
        self.reserved = 0
        self.lora: str | None = None
        #: awaiting its queue (the watchdog may wake it), and when its next check is due
        self.waiting = False
        self.check_at = time.monotonic() + poll_s

    def _start(self) -> None:
        owner, total = self.owner, len(self.params)
        if owner.stopping:
            raise ShuttingDown()
        if owner.fault is not None:
            raise EngineFault(owner.fault)
        if total > owner.capacity:
            raise TooManySequences(f"the request needs {total} sequences (n x prompts) and "
                                   f"this server holds at most {owner.capacity} at once")
        if owner.inflight + total > owner.capacity:
            raise QueueFull(f"{owner.inflight} sequences are running or waiting; this "
                            f"request needs {total} and the server takes {owner.capacity}")
        owner.inflight += total
        self.reserved = total
        owner.live.add(self)
        owner._watch(self.loop)
        try:
            for p, ids in enumerate(self.prompts):
                first = p * self.n
                self._add(first)
                rest = list(range(first + 1, first + self.n))
                if rest and owner._shareable(ids):
                    self.deferred[first] = rest
                else:
                    for i in rest:
                        self._add(i)
        except BaseException:
            self.close()
            if owner.fault is not None:
                raise EngineFault(owner.fault) from None
            raise

    def _add(self, i: int) -> None:
        rid = f"{self.request_id}-{i}"
        self.owner.engine.add_request(self.prompts[i // self.n], self.params[i], rid,
                                      sink=_Sink(self.loop, self.queue, i,
                                                 self.owner.batch_for(self.loop)),
                                      lora=self.lora)
        self.rids[i] = rid
        self.unfinished.add(i)

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """``(choice index, RequestOutput)`` as the engine produces them, until every choice
        finished. Raises :class:`RequestTimeout` past the deadline (``time.monotonic()``),
        :class:`ClientGone` when ``disconnected()`` says so (checked every ``poll_s`` while
        waiting), :class:`EngineFault` when the engine failed, :class:`ShuttingDown` when
        :meth:`AsyncEngine.abort_all` stopped it."""
        owner = self.owner
        while self.unfinished or self.deferred:
            if time.monotonic() >= self.deadline:
                raise RequestTimeout()
            if not self.queue.empty():
                i, ev = self.queue.get_nowait()
            else:                              # woken by an output or by the watchdog
                self.waiting = True
                owner._waits(self)
                try:
                    i, ev = await self.queue.get()
                finally:
                    self.waiting = False
            if i == _WAKE:
                self.check_at = time.monotonic() + self.poll_s
                if owner.fault is not None:
                    raise EngineFault(owner.fault)
                if self.disconnected is not None and await self.disconnected():
                    raise ClientGone()
                continue
            if i == _STOP:
                raise ShuttingDown()
            if i in self.deferred:
                for j in self.deferred.pop(i):
                    try:
                        self._add(j)
                    except Exception:  # noqa: BLE001  (the engine stopped meanwhile)
                        raise EngineFault(owner.fault or "the engine refused a request") \
                            from None
            if ev.finished:
                self.unfinished.discard(i)
                if ev.finish_reason == "error":
                    if (ev.error or "").startswith(GUIDED_ERROR):
                        raise ConstraintFailed(ev.error[len(GUIDED_ERROR):])
                    raise EngineFault(ev.error or owner.fault or "engine error")
            yield i, ev

    def ready(self) -> bool:
        """Whether :meth:`events` has an output to yield without waiting."""
        return not self.queue.empty()

    def close(self) -> None:
        """Abort the choices still running and release the request's place."""
        for i in sorted(self.unfinished):
            self.owner.engine.abort(self.rids[i])
            self.owner.aborts += 1
        self.unfinished.clear()
        self.deferred.clear()
        self.owner.inflight -= self.reserved
        self.reserved = 0
        self.owner.live.discard(self)


__all__ = ["AsyncEngine", "ClientGone", "EngineFault", "Generation", "QueueFull",
           "RequestTimeout", "ShuttingDown", "TooManySequences"]
