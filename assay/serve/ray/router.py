"""The router: the HTTP ingress under `--executor ray`, apart from the engines. It holds the routes (the
request checks, the tokenizer, the OpenAI shapes: assay.serve.http's app over a Frontend) and hands each
engine request to the engine replicas through a deployment handle (remote.RemoteEngine), so a replica
that dies takes no HTTP connection with it.

/health: ok, degraded (fewer live engine replicas than asked for) or unavailable (503), with the counts.
/metrics: the router's counts (HTTP outcomes, replicas lost, requests run again) plus every engine
replica's (metrics_board.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os


class FailoverMetrics:
    """assay_replica_losses_total, assay_requests_rerun_total{sent=none|tokens} and
    assay_replica_requests{replica=id}, in the router's registry."""

    def __init__(self, registry):
        from prometheus_client import Counter, Gauge

        self.losses = Counter("assay_replica_losses", "Engine replicas lost (died, or failed their health check) while serving.",
                              registry=registry)
        self.reruns = Counter("assay_requests_rerun", "Engine requests run again on another replica after theirs was lost, by whether "
                                                      "tokens had already been sent.", ["sent"], registry=registry)
        for sent in ("none", "tokens"):
            self.reruns.labels(sent)
        self.on_replicas = Gauge("assay_replica_requests", "Engine requests the router has running on each engine replica "
                                                           "(accepted there, not yet ended).", ["replica"], registry=registry)

    def rerun(self, sent: bool) -> None:
        self.reruns.labels("tokens" if sent else "none").inc()

    def on_replica(self, replica: str, count: int) -> None:
        if count:
            self.on_replicas.labels(replica).set(count)
        else:  # a replica with nothing running leaves the family (replicas come and go with new ids)
            self.on_replicas.remove(replica)


class Router:
    """The ingress deployment (build_application wraps it with serve.ingress)."""

    async def __init__(self, engines, request: dict, replicas: int, app_name: str, engine_deployment: str):
        import ray

        from assay.core.cli import quiet_libraries
        from assay.models.hf_checkpoint import checkpoint_dir
        from assay.serve.http.app import create_api
        from assay.serve.http.frontend import Frontend
        from assay.serve.http.metrics import ServerMetrics
        from assay.serve.ray import metrics_board
        from assay.serve.ray.exchange import ReplicaHeader
        from assay.serve.ray.remote import RemoteEngine
        from assay.serve.ray.watch import ReplicaWatch
        from assay.serve.runner.weights import load_tokenizer
        from assay.serve.settings import ServeRequest

        quiet_libraries()
        serve_request = ServeRequest(**request)
        folder = checkpoint_dir(serve_request.model)
        tokenizer = load_tokenizer(folder)
        facts = await engines.facts.remote()  # waits for the first engine replica
        metrics = ServerMetrics(None)
        failover = FailoverMetrics(metrics.registry)
        watch = ReplicaWatch(app_name, engine_deployment, replicas, on_loss=failover.losses.inc)
        remote = RemoteEngine(engines, facts, watch, on_rerun=failover.rerun, on_replica=failover.on_replica)
        model_name = serve_request.served_model_name or os.path.basename(folder)
        frontend = Frontend(remote, tokenizer, facts.limits, model_name, metrics, retry_after_s=1)
        board = metrics_board.board(ray)

        @contextlib.asynccontextmanager
        async def lifespan(_app):
            await watch.poll()  # the replicas before the first request
            task = asyncio.create_task(watch.run())
            try:
                yield
            finally:
                task.cancel()

        self._app = create_api(frontend, lambda: watch.health(remote.running_on), lifespan, api_key=serve_request.api_key,
                               max_request_bytes=serve_request.max_request_bytes,
                               metrics_text=lambda: metrics_board.scrape_all(board, metrics.snapshot()))
        self._app.add_middleware(ReplicaHeader)  # outermost: every response names the engine replica that ran it

    def __serve_build_asgi_app__(self):
        return self._app
