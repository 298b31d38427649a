"""The front end's wait for outputs (:class:`poot.serve.engine_client.Generation`): a waiting
request awaits its queue with no timer of its own, and one watchdog task per event loop
wakes it to check its deadline, the engine's health and its client. Run against a stand-in
engine whose outputs the test hands over as the engine thread would (through the sink)."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from poot.engine.output_processor import RequestOutput
from poot.sampling_params import SamplingParams
from poot.serve.engine_client import (AsyncEngine, ClientGone, EngineFault, RequestTimeout,
                                      _watchdog)


class StandInEngine:
    """What :class:`AsyncEngine` uses of an engine: adds record their sinks, nothing runs."""

    def __init__(self):
        self.config = types.SimpleNamespace(max_batch=4)
        self.blocks = types.SimpleNamespace(prefix_caching=False, block_size=16)
        self.fault = None
        self.sinks: dict[str, object] = {}
        self.aborted: list[str] = []

    def add_request(self, ids, params, rid, sink=None, lora=None):
        self.sinks[rid] = sink

    def abort(self, rid):
        self.aborted.append(rid)


def _submit(aeng, deadline_s, poll_s, disconnected=None):
    return aeng.submit("r", [[1, 2, 3]], [SamplingParams(max_tokens=4)], 1,
                       time.monotonic() + deadline_s,
                       disconnected=disconnected, poll_s=poll_s)


async def _drain(gen):
    return [ev async for _, ev in gen.events()]


def test_outputs_arrive_in_order_and_the_watchdog_ends_with_the_requests():
    async def main():
        eng = StandInEngine()
        aeng = AsyncEngine(eng, max_queue=4)
        gen = _submit(aeng, 30.0, 0.05)
        sink = eng.sinks["r-0"]
        task = asyncio.create_task(_drain(gen))
        await asyncio.sleep(0.12)             # waiting through two watchdog wake-ups
        for k in range(3):
            sink.put(RequestOutput("r-0", [k]))
        sink.put(RequestOutput("r-0", [3], finished=True, finish_reason="length"))
        got = await asyncio.wait_for(task, 5)
        gen.close()
        watchdog = aeng._watchdogs.get(asyncio.get_running_loop())
        if watchdog is not None:
            await asyncio.wait_for(watchdog, 5)   # ends once nothing is live
        return got, aeng

    got, aeng = asyncio.run(main())
    assert [ev.token_ids for ev in got] == [[0], [1], [2], [3]]
    assert got[-1].finished and not aeng.live and not aeng._watchdogs


def test_a_waiting_request_times_out_at_its_deadline_not_at_its_poll():
    """No output ever comes: the watchdog wakes the request at its deadline (0.2 s), well
    before its 30 s poll, and it raises RequestTimeout."""
    async def main():
        aeng = AsyncEngine(StandInEngine(), max_queue=4)
        gen = _submit(aeng, 0.2, 30.0)
        try:
            with pytest.raises(RequestTimeout):
                await asyncio.wait_for(_drain(gen), 10)
        finally:
            gen.close()

    asyncio.run(main())


def test_a_gone_client_and_an_engine_fault_end_a_waiting_request():
    async def main():
        eng = StandInEngine()
        aeng = AsyncEngine(eng, max_queue=4)
        calls = []

        async def gone():
            calls.append(1)
            return len(calls) >= 2            # connected at the first check, gone at the next

        gen = _submit(aeng, 30.0, 0.05, disconnected=gone)
        with pytest.raises(ClientGone):
            await asyncio.wait_for(_drain(gen), 10)
        gen.close()
        assert len(calls) == 2 and eng.aborted == ["r-0"]
        gen = _submit(aeng, 30.0, 0.05)
        eng.fault = RuntimeError("device lost")
        with pytest.raises(EngineFault, match="device lost"):
            await asyncio.wait_for(_drain(gen), 10)
        gen.close()

    asyncio.run(main())


def test_the_watchdog_skips_requests_that_are_not_waiting():
    """A request busy elsewhere (not awaiting its queue) gets no wake-up put in its queue:
    wake-ups never pile up behind outputs."""
    async def main():
        aeng = AsyncEngine(StandInEngine(), max_queue=4)
        gen = _submit(aeng, 30.0, 0.01)
        gen.check_at = 0.0                     # overdue, but not waiting
        task = asyncio.get_running_loop().create_task(_watchdog(aeng, gen.loop))
        await asyncio.sleep(0.05)
        assert gen.queue.empty()
        gen.close()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
