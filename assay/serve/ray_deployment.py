"""`assay serve --executor ray --replicas N`: the same engine and HTTP app in N Ray Serve replicas.

    app = build_application(request, replicas=2)     # a Ray Serve Application (deployment bound to its args)
    serve.run(app, route_prefix="/")                  # Ray's proxy routes /v1/completions to the replicas

One replica per device: each replica is an actor holding one engine (its own slot pool, its own engine
thread) and asks Ray for one device: a GPU (num_gpus=1), a custom resource named after another device
type (e.g. {"neuron": 1}), or one CPU core for --device cpu. Each replica's engine answers 429 when its
own queue is full; Ray's router spreads requests over replicas by their queue lengths. /health comes
from whichever replica Ray routes it to (every response carries X-Assay-Server, the replica's id);
/metrics is the sum over every replica (ray_metrics.py). Without --executor ray, `assay serve` stays one
process and Ray is never imported.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import asdict, replace

from assay.core.errors import AssayError
from assay.core.net import free_port

RESOURCE_NAME = {"cuda": "num_gpus"}  # other accelerators are custom resources named after the device type
APP_NAME = "assay"


def _import_serve():
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise AssayError(f"--executor ray needs Ray Serve ({exc.name} is missing): pip install 'ray[serve]'") from None
    return ray, serve


def replica_resources(device: str) -> dict:
    """ray_actor_options asking for one device of the given type."""
    device_type = device.split(":", 1)[0]
    if device_type == "cpu":
        return {"num_cpus": 1}
    if device_type in RESOURCE_NAME:
        return {"num_cpus": 0, RESOURCE_NAME[device_type]: 1}
    return {"num_cpus": 0, "resources": {device_type: 1}}


class EngineReplica:
    """One engine behind the HTTP app, inside a Ray Serve replica (wrapped by build_application)."""

    def __init__(self, request: dict):
        from assay.core.cli import quiet_libraries
        from assay.models.hf_checkpoint import checkpoint_dir
        from assay.serve.http.app import create_app
        from assay.serve.launch import load_engine
        from assay.serve.settings import ServeRequest, engine_config

        quiet_libraries()
        serve_request = ServeRequest(**request)
        # Ray hands the replica its device (CUDA_VISIBLE_DEVICES etc.), so "cuda" is this replica's own GPU.
        folder = checkpoint_dir(serve_request.model)
        engine = load_engine(serve_request, engine_config(serve_request))
        engine.warm_up()
        from ray import serve

        import ray

        from assay.serve import ray_metrics

        replica_id = str(serve.get_replica_context().replica_id.unique_id)
        board = ray_metrics.board(ray)
        self._app = create_app(
            engine, serve_request.served_model_name or os.path.basename(folder), server_id=replica_id,
            api_key=serve_request.api_key, max_request_bytes=serve_request.max_request_bytes,
            metrics_text=lambda: ray_metrics.scrape_all(board),
        )
        self._reporter = ray_metrics.start_reporter(ray, board, replica_id, self._app.state.metrics.snapshot)

    def __del__(self):
        reporter = getattr(self, "_reporter", None)
        if reporter is not None:
            reporter.set()

    def __serve_build_asgi_app__(self):
        return self._app

    def check_health(self) -> None:
        # Ray Serve calls this periodically; a replica whose engine thread died is restarted.
        if not self._app.state.engine_loop.alive:
            raise RuntimeError("the engine thread is not running")


def build_application(request, replicas: int):
    """The Ray Serve application: `replicas` copies of EngineReplica, each asking for one device."""
    _, serve = _import_serve()
    if replicas < 1:
        raise AssayError(f"--replicas must be at least 1, got {replicas}")
    # Ray's own per-replica cap (default 5) would queue requests in the router instead of the engine;
    # let each engine see what it can hold (slots + its queue + one more, which it refuses with 429).
    max_ongoing = request.max_seqs + request.max_waiting + 1
    deployment = serve.deployment(
        serve.ingress()(EngineReplica),
        name="assay-engine",
        num_replicas=replicas,
        ray_actor_options=replica_resources(request.device),
        max_ongoing_requests=max_ongoing,
        health_check_period_s=5,
    )
    # Replicas receive a plain dict (what they need to build their own engine), never live objects.
    return deployment.bind(asdict(replace(request, host="", port=0)))


def serve_with_ray(request, replicas: int, announce=print) -> None:
    """Join RAY_ADDRESS (or start a local Ray instance), deploy, announce the URL, wait for SIGINT/SIGTERM,
    then shut Serve down (and the local instance, when this process started it)."""
    ray, serve = _import_serve()
    from assay.serve import ray_metrics
    from assay.serve.settings import check_request, engine_config

    check_request(request)
    engine_config(request)  # bad flags fail before Ray starts
    application = build_application(request, replicas)
    # Ray's proxy takes a fixed port; for --port 0 pick a free one now (the proxy binds it a moment later).
    port = request.port or free_port(request.host)
    started_here = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    stop = threading.Event()
    board = None
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        board = ray_metrics.board(ray)  # before the replicas, which report to it from their start; kept while serving
        serve.start(http_options={"host": request.host, "port": port}, proxy_location="HeadOnly")
        serve.run(application, name=APP_NAME, route_prefix="/")
        host = f"[{request.host}]" if ":" in request.host else request.host
        announce(f"serving {os.path.basename(os.path.normpath(request.model))} on Ray Serve ({replicas} replicas) at http://{host}:{port}")
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            serve.shutdown()
            if board is not None:
                ray.kill(board)
        finally:
            if started_here:
                ray.shutdown()
    announce("stopped")


__all__ = ["EngineReplica", "build_application", "replica_resources", "serve_with_ray"]
