"""`assay serve`'s start-up: the engine loaded and warmed up, the HTTP app on a listening socket, served until
SIGINT/SIGTERM.

Imports neither FastAPI nor uvicorn at the top: `assay serve` reports a missing one as a usage error.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from assay.core.errors import AssayError
from assay.serve.http.server import bind_socket, server_url, uvicorn_server
from assay.serve.settings import ServeRequest, check_request, engine_config


def load_engine(request: ServeRequest, config):
    """Engine.from_checkpoint: the weights in config.dtype (--dtype), cast before the first decode is traced."""
    from dataclasses import replace

    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.engine.engine import Engine

    return Engine.from_checkpoint(checkpoint_dir(request.model), replace(config, dtype=request.dtype))


def _import_app():
    try:
        importlib.import_module("uvicorn")  # only checked here; uvicorn_server imports it

        from assay.serve.http.app import create_app
    except ImportError as exc:
        raise AssayError(f"`assay serve` needs FastAPI and uvicorn ({exc.name} is missing): pip install 'assay[serve]'") from None
    return create_app


def serve(request: ServeRequest, announce=print) -> None:
    """Load, warm up, listen, announce the URL, serve until SIGINT/SIGTERM, then stop the engine thread."""
    check_request(request)
    config = engine_config(request)  # bad flags fail here, before torch is imported and the model loads
    create_app = _import_app()
    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.runner.weights import weights_dtype

    folder = checkpoint_dir(request.model)
    engine = load_engine(request, config)
    engine.warm_up()
    model_name = request.served_model_name or Path(folder).name
    app = create_app(engine, model_name, api_key=request.api_key, max_request_bytes=request.max_request_bytes)
    sock = bind_socket(request.host, request.port)
    server = uvicorn_server(app)
    # The socket listens already: a client that connects before uvicorn's loop runs waits in the backlog.
    stats = engine.stats()
    slots = f"{config.max_seqs} slots" + (f" of {stats.memory.max_len} positions" if stats.memory.max_len else "")
    announce(
        f"serving {model_name} ({stats.model_type}, {weights_dtype(engine.slot_model)}, {config.mode}, {slots}, "
        f"{stats.warmup_compiles} widths compiled in {stats.warmup_s:.1f} s) at {server_url(sock)}"
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    announce("stopped")
