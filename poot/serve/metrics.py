"""Prometheus metrics (``GET /metrics``, ``prometheus-client``), one registry per app.

Counted by the front end: requests by route and status, prompt and generated tokens,
time to first token, inter-token latency and request time (histograms), sequences aborted.
Read from the engine when scraped: sequences running and waiting (the queue), KV blocks used,
cached, free and total, the prefix-cache hit rate, decode steps, tokens generated, the
largest decode batch so far and preemptions -- generated tokens / decode steps above 1 and a
largest batch above 1 is the engine batching. With a pooling model (embeddings, rerank),
read from its :class:`~poot.engine.pooling.PoolQueue` instead: requests, rows run, rows
dropped (client gone), pooled steps, rows waiting, and a histogram of the rows each step ran
(rows / steps above a request's size is requests sharing steps).
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                   HistogramMetricFamily)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2,
                    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
                    320.0, 640.0)


class _EngineCollector:
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, source: Callable[[], Any]):
        self.source = source

    def describe(self):
        return []

    def collect(self):
        state = self.source()
        if state is not None and state.pool is not None:
            yield from _pooled(state.pool)
        if state is None or state.aengine is None:
            return
        st = state.aengine.engine.stats()
        gauges = {
            "poot_num_requests_running": ("sequences in the running batch", st.running),
            "poot_num_requests_waiting": ("sequences waiting for a place (the queue)",
                                          st.waiting),
            "poot_server_sequences_in_flight": ("sequences added by the server and not "
                                                "finished", state.aengine.inflight),
            "poot_kv_blocks_used": ("KV blocks referenced by sequences", st.kv_blocks_used),
            "poot_kv_blocks_cached": ("free KV blocks holding cached prefixes",
                                      st.kv_blocks_cached),
            "poot_kv_blocks_free": ("free KV blocks", st.kv_blocks_free),
            "poot_kv_blocks_total": ("KV blocks in the pool", st.kv_blocks_total),
            "poot_prefix_cache_hit_rate": ("cached blocks hit / blocks looked up",
                                           st.prefix_cache_hit_rate),
            "poot_decode_batch_max": ("the largest decode batch run so far",
                                      st.max_decode_batch),
            "poot_engine_healthy": ("1 while the engine runs, 0 after a fault",
                                    0 if state.aengine.fault else 1),
            "poot_spec_acceptance_rate": ("speculative decoding: proposed tokens accepted / "
                                          "proposed", st.spec_acceptance_rate),
            "poot_spec_mean_accepted_length": ("speculative decoding: tokens a verify step "
                                               "yields per sequence (1 + accepted / steps)",
                                               st.spec_mean_accepted_length),
        }
        for name, (doc, v) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=float(v))
        counters = {
            "poot_decode_steps": ("decode steps run (decode rows only)", st.decode_steps),
            "poot_prefill_steps": ("prefill chunks run as steps of their own", st.prefill_steps),
            "poot_ragged_steps": ("ragged steps run (decode rows and prompt chunks in one step)",
                                  st.ragged_steps),
            "poot_ahead_steps": ("steps issued before the step in flight was read although "
                                 "their rows differ from its rows", st.ahead_steps),
            "poot_engine_generated_tokens": ("tokens sampled by the engine",
                                             st.generated_tokens),
            "poot_preemptions": ("sequences preempted for lack of KV blocks", st.preemptions),
            "poot_prefix_cache_hit_tokens": ("prompt tokens served from the prefix cache",
                                             st.prefix_cache_hit_tokens),
            "poot_spec_draft_tokens": ("speculative decoding: tokens proposed",
                                       st.spec_draft_tokens),
            "poot_spec_accepted_tokens": ("speculative decoding: proposed tokens accepted",
                                          st.spec_accepted_tokens),
            "poot_spec_verify_steps": ("speculative decoding: verify steps run",
                                       st.spec_verify_steps),
        }
        for name, (doc, v) in counters.items():
            yield CounterMetricFamily(name, doc, value=float(v))


def _pooled(q):
    """The metrics of a :class:`~poot.engine.pooling.PoolQueue` ``q``."""
    yield GaugeMetricFamily("poot_pooled_rows_waiting", "inputs/documents waiting for a "
                            "pooled step", value=float(q.pending_rows))
    for name, doc, v in (("poot_pooled_requests", "embeddings/rerank requests queued",
                          q.requests),
                         ("poot_pooled_rows", "inputs/documents run in pooled steps", q.rows),
                         ("poot_pooled_rows_dropped", "inputs/documents dropped unrun "
                          "(client gone)", q.dropped),
                         ("poot_pooled_steps", "pooled steps run", q.steps)):
        yield CounterMetricFamily(name, doc, value=float(v))
    fill, buckets, acc = list(q.fill), [], 0
    for k, n in enumerate(fill):
        acc += n
        if k and (k & (k - 1) == 0 or k == len(fill) - 1):    # powers of two, max_batch
            buckets.append((str(float(k)), acc))
    buckets.append(("+Inf", acc))
    yield HistogramMetricFamily("poot_pooled_step_rows", "rows per pooled step",
                                buckets=buckets,
                                sum_value=float(sum(k * n for k, n in enumerate(fill))))


class Metrics:
    """The server's metrics; ``state()`` returns the server state the engine gauges are read
    from (None while loading)."""

    def __init__(self, state: Callable[[], Any]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("poot_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("poot_prompt_tokens", "prompt tokens of served requests",
                                     registry=r)
        self.generation_tokens = Counter("poot_generation_tokens",
                                         "tokens generated for served requests", registry=r)
        self.aborted = Counter("poot_aborted_sequences", "sequences aborted by the server "
                               "(client gone, time limit, shutdown)", registry=r)
        self.ttft = Histogram("poot_time_to_first_token_seconds", "arrival to first token, "
                              "per choice", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("poot_inter_token_latency_seconds", "time between successive "
                             "tokens of a choice", buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("poot_request_duration_seconds", "arrival to the last byte of "
                             "generation requests", buckets=_REQUEST_BUCKETS, registry=r)
        r.register(_EngineCollector(state))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "Metrics"]
