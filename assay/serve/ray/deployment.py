"""`assay serve --executor ray --replicas N`: a router in front of N engine replicas, on Ray Serve.

    app = build_application(request, replicas=2)     # a Ray Serve Application: the router bound to the engines
    serve.run(app, route_prefix="/")                  # Ray's proxy routes every HTTP request to the router

The router (router.py) is the ingress: the HTTP routes, the request checks and the tokenizer, one replica
that asks for no device. It calls the engine deployment through a deployment handle and streams each
request's tokens back through a generator handle; a request whose engine replica dies is run again on a
live one (remote.py). One engine replica per device: each is an actor holding one engine (its own slot
pool, its own engine thread) and asks Ray for one device: a GPU (num_gpus=1), a custom resource named
after another device type (e.g. {"neuron": 1}), or one CPU core for --device cpu. Ray restarts a replica
that dies or fails its health check. /metrics is the router's counts plus the sum over every engine
replica (metrics_board.py). Without --executor ray, `assay serve` stays one process and Ray is never
imported.
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
ENGINE_DEPLOYMENT = "assay-engine"
ROUTER_DEPLOYMENT = "assay-router"
# Requests the router holds at once (each is a few coroutines and a stream from an engine replica).
ROUTER_MAX_ONGOING = 4096


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


def build_application(request, replicas: int):
    """The Ray Serve application: the router (the ingress, one replica, no device) over `replicas` engine
    replicas, each asking for one device."""
    _, serve = _import_serve()
    from assay.serve.ray.engine_replica import EngineReplica
    from assay.serve.ray.router import Router

    if replicas < 1:
        raise AssayError(f"--replicas must be at least 1, got {replicas}")
    # Ray's own per-replica cap (default 5) would queue requests in the handle instead of the engine;
    # let each engine see what it can hold (slots + its queue + one more, which it refuses with 429).
    engines = serve.deployment(
        EngineReplica,
        name=ENGINE_DEPLOYMENT,
        num_replicas=replicas,
        ray_actor_options=replica_resources(request.device),
        max_ongoing_requests=request.max_seqs + request.max_waiting + 1,
        health_check_period_s=5,
    )
    router = serve.deployment(
        serve.ingress()(Router),
        name=ROUTER_DEPLOYMENT,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},  # it tokenizes and forwards; the devices are the engines'
        max_ongoing_requests=ROUTER_MAX_ONGOING,
    )
    # Replicas receive a plain dict (what they need to build their own engine), never live objects.
    settings = asdict(replace(request, host="", port=0))
    engine_settings = settings | {"api_key": None}  # the key is the router's alone
    return router.bind(engines.bind(engine_settings), settings, replicas, APP_NAME, ENGINE_DEPLOYMENT)


def replica_processes(server_pid: int, deployment: str = ENGINE_DEPLOYMENT) -> dict[str, int]:
    """{replica id (as X-Assay-Server names it): PID} of this machine's replicas of `deployment` under the
    `assay serve --executor ray` process server_pid, when that process started Ray itself (the replicas are
    its raylet's workers, so its descendants). A replica's id is in the name of the Serve log file it holds
    open (replica_<app>_<deployment>_<id>.log)."""
    import psutil

    prefix = f"replica_{APP_NAME}_{deployment}_"
    found = {}
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if not " ".join(child.cmdline()).startswith(f"ray::ServeReplica:{APP_NAME}:{deployment}"):
                continue
            names = [os.path.basename(f.path) for f in child.open_files()]
        except psutil.Error:  # exited meanwhile
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith(".log"):
                found[name[len(prefix):-len(".log")]] = child.pid
    return found


def serve_with_ray(request, replicas: int, announce=print) -> None:
    """Join RAY_ADDRESS (or start a local Ray instance), deploy, announce the URL, wait for SIGINT/SIGTERM,
    then shut Serve down (and the local instance, when this process started it)."""
    ray, serve = _import_serve()
    from assay.serve.ray import metrics_board
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
        board = metrics_board.board(ray)  # before the replicas, which report to it from their start; kept while serving
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


__all__ = ["build_application", "replica_processes", "replica_resources", "serve_with_ray"]
