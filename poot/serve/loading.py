"""Loading the model a server serves: :func:`load_and_warm` (what ``poot serve`` and each Ray
replica load), the samplers it warms, and :class:`MissingExtra` (an optional extra's package
is not installed)."""

from __future__ import annotations

from dataclasses import replace

from poot.api import DEFAULT_MAX_BATCH, ModelHandle
from poot.api.pooling import PoolingModel
from poot.engine.runner import decode_buckets
from poot.errors import PootError
from poot.graph.sampling import FULL, LOGPROB_WIDTHS


class MissingExtra(PootError):
    """A package of an optional extra is not installed."""


def serve_samplers() -> tuple:
    """The sampler specs ``poot serve`` warms for every decode bucket: the full sampler
    (temperature, top-k/p, min-p, penalties, logit bias: it also serves greedy rows) and the
    same with the widest log-probs and guided decoding's token mask (any request). ``poot
    compile --serve`` compiles these, so that a machine without MLIR serves from the cache."""
    return (FULL, replace(FULL, logprobs=max(LOGPROB_WIDTHS), guided=True))


def load_and_warm(options: dict, warm_up: bool = True, progress=None):
    """Load the model (``ModelHandle.load(**options)``) and, with ``warm_up``, compile (or
    load from the compile cache) every decode bucket with the greedy and full samplers, so
    that no plain request waits on a compile; the full one with log-probs and guided
    decoding's mask (which serves any request) keeps compiling in the compile workers after
    this returns, and a request that needs it before they finish waits for it. With ``options["pooled"]`` set (``embed`` /
    ``score``, :func:`poot.api.pooling.pooled_task`): a :class:`~poot.api.pooling.PoolingModel`
    instead, warmed for every batch and token bucket."""
    opts = dict(options)
    if opts.pop("pooled", None):
        pm = PoolingModel.load(opts["path"], opts["backend"], max_batch=opts["max_batch"],
                               max_tokens=opts["kv_capacity"], use_cache=opts["use_cache"],
                               progress=progress, warm_up=warm_up)
        if warm_up:                  # every bucket: no request waits on a compile
            pm.runner.warm_up(pm.runner.batch_buckets, pm.runner.tok_buckets)
        return pm
    specs = serve_samplers()
    buckets = decode_buckets(opts.get("max_batch") or DEFAULT_MAX_BATCH[opts["backend"]])
    handle = ModelHandle.load(opts.pop("path"), progress=progress,
                              warm_samplers=specs if warm_up else (),
                              warm_batches=buckets if warm_up else (1,),
                              warm_ragged=warm_up, **opts)
    if warm_up:                      # ready with the full sampler; the other compiles on
        handle.finish_compiling(now=specs[:1])
    return handle


def require_serve_extra() -> None:
    """Raise :class:`MissingExtra` unless the ``serve`` extra's packages import."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise MissingExtra(f"poot serve needs the 'serve' extra ({e.name} is missing): "
                           f"pip install -e \".[serve]\"") from None


__all__ = ["MissingExtra", "load_and_warm", "require_serve_extra", "serve_samplers"]
