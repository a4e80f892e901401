"""`assay serve`'s start-up: the engine loaded and warmed up, the HTTP app on a listening socket, served until
SIGINT/SIGTERM. Each stage is a line on the "assay.serve" log (the command prints it on stderr): what is
loaded, the slot pool's size before it is allocated, each width as it compiles; the URL goes to stdout.

Imports neither torch, FastAPI nor uvicorn at the top: the first line comes before them, and `assay serve`
reports a missing FastAPI or uvicorn as a usage error.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import replace
from pathlib import Path

from assay.core.checks import inspect_checkpoint
from assay.core.cli import quiet_libraries
from assay.core.errors import AssayError
from assay.core.process import freeze_startup_heap
from assay.serve.engine.config import EngineConfig
from assay.serve.engine.scheduler import warm_up_widths
from assay.serve.http.server import bind_socket, server_url, uvicorn_server
from assay.serve.settings import ServeRequest, check_request, engine_config

log = logging.getLogger("assay.serve")


def load_engine(request: ServeRequest, config):
    """Engine.from_checkpoint: the weights in config.dtype (--dtype), cast before the first decode is traced."""
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


def decode_mode(config: EngineConfig) -> str:
    """How the engine decodes, in words: eager, or compiled at which widths."""
    if config.eager:
        return "eager decode"
    if config.buckets is None:
        return f"decode compiled with {config.backend} at each new running count (--no-buckets)"
    widths = warm_up_widths(config.buckets, config.max_seqs)
    return f"decode compiled with {config.backend} at {len(widths)} widths ({', '.join(map(str, widths))}) before serving"


def serve(request: ServeRequest, announce=print) -> None:
    """Load, warm up, listen, announce the URL, serve until SIGINT/SIGTERM, then stop the engine thread."""
    check_request(request)
    config = engine_config(request)  # bad flags fail here, before torch is imported and the model loads
    state = inspect_checkpoint(request.model, weights=False, tokenizer=False)
    log.info(f"loading {state.folder} ({state.config.get('model_type', 'unknown model type')}): {config.dtype} weights"
             f"{f' (linears quantized to {config.quantize})' if config.quantize else ''} on {config.device}, {decode_mode(config)}")
    quiet_libraries()
    create_app = _import_app()
    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.runner.weights import weights_dtype

    folder = checkpoint_dir(request.model)
    start = time.perf_counter()
    engine = load_engine(request, config)
    log.info(f"loaded the weights and the slot pool in {time.perf_counter() - start:.1f} s")
    engine.warm_up()
    # Out of the collector's reach from now on: a full collection over the compiled model's objects paused a request.
    frozen = freeze_startup_heap()
    log.debug(f"froze {frozen:,} start-up objects (gc.freeze)")
    model_name = request.served_model_name or Path(folder).name
    app = create_app(engine, model_name, api_key=request.api_key, max_request_bytes=request.max_request_bytes)
    sock = bind_socket(request.host, request.port)
    server = uvicorn_server(app)
    # The socket listens already: a client that connects before uvicorn's loop runs waits in the backlog.
    stats = engine.stats()
    slots = f"{config.max_seqs} slots" + (f" of {stats.memory.max_len} positions" if stats.memory.max_len else "")
    # Eager: how to get the compiled bucket mode; compiled: what compiling cost.
    compiled = (f"eager; --compile for the {decode_mode(replace(config, eager=False))}" if config.eager
                else f"{config.mode}, {stats.warmup_compiles} widths{prefill_graphs(stats)} compiled in {stats.warmup_s:.1f} s")
    announce(f"serving {model_name} ({stats.model_type}, {weights_dtype(engine.slot_model)}, {slots}, {compiled}) at {server_url(sock)}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    announce("stopped")


def prefill_graphs(stats) -> str:
    """What the announcement says of the prefill's graphs compiled at warm-up (a dense KV model's; none: nothing)."""
    return f" and the prefill's {stats.prefill_warmup_compiles} graphs" if stats.prefill_warmup_compiles else ""
