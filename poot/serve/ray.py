"""Scale-out with Ray Serve: N engine replicas behind one HTTP ingress, the same OpenAI routes.

    poot serve --ray --replicas 2 --model MODEL --port 8000

or from Python, on a Ray cluster you started (``ray start --head`` / ``ray.init``)::

    from ray import serve
    from poot.serve.ray import deployment
    from poot.serve import ServeConfig

    app = deployment({"path": "model.gguf", "backend": "cpu"}, ServeConfig(), replicas=2)
    serve.run(app, route_prefix="/")

Each replica is a Ray actor that loads the model (and compiles, or loads from the shared
compile cache, its steps) and serves the same FastAPI application as ``poot serve``
(:func:`poot.serve.app.build_app`) on its own engine thread. Ray Serve's proxy is the one
ingress; its router sends each request to the replica with the fewest requests in
progress of two (with two replicas: the less loaded one), and streams (SSE) pass through.
A replica whose engine stopped after a fault fails Ray's health check and is replaced.
Nothing here is cluster code: placement, routing, health and restarts are Ray Serve's.

Needs the ``ray`` extra (``pip install -e ".[serve,ray]"``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from poot.serve.config import ServeConfig
from poot.serve.loading import MissingExtra, load_and_warm

log = logging.getLogger("poot.serve")


def _ray():
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise MissingExtra(f"--ray needs the 'ray' extra ({e.name} is missing): "
                           f"pip install -e \".[serve,ray]\"") from None
    return ray, serve


class PootReplica:
    """One engine replica (the deployment's class): loads the model (a
    :class:`~poot.api.pooling.PoolingModel` when ``options["pooled"]`` says ``embed``/``score``,
    see :func:`poot.serve.loading.load_and_warm`), then serves
    :func:`poot.serve.app.build_app` for it."""

    def __init__(self, options: dict[str, Any], config: ServeConfig, warm_up: bool = True):
        self.config = config
        self.handle = load_and_warm(options, warm_up=warm_up)

    def __serve_build_asgi_app__(self):
        # lazy: FastAPI, prometheus_client, pydantic, Starlette
        from poot.serve.app import build_app

        return build_app(self.config, handle=self.handle)

    def check_health(self) -> None:
        """Ray Serve's health check: fails once the engine stopped after a fault (a pooling
        model: once its queue's thread died)."""
        pool = getattr(self.handle, "_queue", None)
        if getattr(self.handle, "task", None) in ("embed", "score"):
            if pool is not None and not pool.closed and not pool.thread.is_alive():
                raise RuntimeError("the pooled queue's thread stopped")
            return
        fault = self.handle.engine.fault
        if fault is not None:
            raise RuntimeError(f"the engine stopped after a fault: {fault}")


def deployment(options: dict[str, Any], config: ServeConfig, replicas: int = 1,
               warm_up: bool = True, num_cpus: float = 1.0,
               max_ongoing_requests: int | None = None):
    """A Ray Serve application of ``replicas`` :class:`PootReplica` copies loading
    ``ModelHandle.load(**options)`` (``options["path"]``: the model; ``options["pooled"]``:
    ``embed``/``score`` for an embedding model or cross-encoder). ``num_cpus``: CPUs
    Ray reserves per replica; ``max_ongoing_requests``: requests a replica takes at once
    (default: its batch plus its queue)."""
    _, serve = _ray()
    if max_ongoing_requests is None:
        max_ongoing_requests = (options.get("max_batch") or 8) * 2 + config.max_queue
    cls = serve.ingress()(PootReplica)
    dep = serve.deployment(cls, name="poot", num_replicas=replicas,
                           ray_actor_options={"num_cpus": num_cpus},
                           max_ongoing_requests=max_ongoing_requests,
                           health_check_period_s=10)
    return dep.bind(options, config, warm_up)


def serve_with_ray(options: dict[str, Any], config: ServeConfig, host: str, port: int,
                   replicas: int, warm_up: bool = True) -> int:
    """``poot serve --ray``: start a local Ray instance (this machine only; usage reporting
    off), deploy ``replicas`` replicas behind Ray Serve's HTTP proxy on ``host:port``, and
    serve until SIGTERM/SIGINT, then shut Ray down. Returns the exit status."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray, serve = _ray()
    cpus = os.cpu_count() or 1
    log.info("starting a local Ray instance and %d replica(s) (each loads the model)",
             replicas)
    ray.init(num_cpus=max(cpus, replicas), include_dashboard=False,
             _node_ip_address="127.0.0.1", logging_level=logging.WARNING,
             log_to_driver=True)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set())
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": host, "port": port})
        app = deployment(options, config, replicas, warm_up,
                         num_cpus=min(1.0, max(cpus, replicas) / replicas))
        serve.run(app, name="poot", route_prefix="/", blocking=False)
        log.info("ready: %d replica(s) of '%s' behind http://%s:%d", replicas,
                 config.served_model_name, host, port)
        while not stop.wait(1.0):
            pass
        log.info("stopping: draining the replicas")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    log.info("stopped")
    return 0


__all__ = ["PootReplica", "deployment", "serve_with_ray"]
