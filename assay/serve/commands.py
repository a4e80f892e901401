"""`assay serve`: flags in, an engine warmed up, the OpenAI-compatible HTTP server until SIGINT/SIGTERM."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import backend_option, device_option, quiet_libraries
from assay.core.checks import check_checkpoint
from assay.core.errors import AssayError


@dataclass(frozen=True)
class ServeRequest:
    model: str
    device: str = "cpu"
    backend: str = "inductor"
    max_seqs: int = 64
    buckets: Optional[str] = None  # "1,2,4,8"; None: powers of two up to max_seqs
    no_buckets: bool = False
    eager: bool = False
    state_dtype: str = "float32"
    max_waiting: int = 256
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 4096
    max_len: Optional[int] = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: Optional[str] = None


def default_buckets(max_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the first power of two >= max_seqs: every running count has a bucket."""
    widths = [1]
    while widths[-1] < max_seqs:
        widths.append(widths[-1] * 2)
    return tuple(widths)


def engine_config(request: ServeRequest):
    from assay.serve.engine import EngineConfig
    from assay.serve.scheduler import parse_buckets

    if request.no_buckets and request.buckets is not None:
        raise AssayError("--buckets and --no-buckets exclude each other")
    if request.no_buckets:
        buckets = None
    elif request.buckets is not None:
        buckets = parse_buckets(request.buckets)
    else:
        buckets = default_buckets(request.max_seqs)
    config = EngineConfig(
        max_seqs=request.max_seqs, buckets=buckets, eager=request.eager, device=request.device, backend=request.backend,
        state_dtype=request.state_dtype, max_waiting=request.max_waiting, max_prompt_tokens=request.max_prompt_tokens,
        max_new_tokens=request.max_new_tokens, max_len=request.max_len,
    )
    config.validate()
    return config


def _import_http():
    try:
        from assay.serve import http
    except ImportError as exc:
        raise AssayError(f"`assay serve` needs FastAPI and uvicorn ({exc.name} is missing): pip install 'assay[serve]'") from None
    return http


def serve(request: ServeRequest, announce=print) -> None:
    """Load, warm up, listen, announce the URL, serve until SIGINT/SIGTERM, then stop the engine thread."""
    http = _import_http()
    if not 0 <= request.port <= 65535:
        raise AssayError(f"--port must be in [0, 65535], got {request.port}")
    config = engine_config(request)  # bad flags fail here, before the model loads
    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.engine import Engine

    folder = checkpoint_dir(request.model)
    engine = Engine.from_checkpoint(folder, config)
    engine.warm_up()
    model_name = request.served_model_name or Path(folder).name
    app = http.create_app(engine, model_name)
    sock = http.bind_socket(request.host, request.port)
    server = http.uvicorn_server(app)
    # The socket listens already: a client that connects before uvicorn's loop runs waits in the backlog.
    stats = engine.stats()
    announce(
        f"serving {model_name} ({stats.model_type}, {config.mode}, {config.max_seqs} slots, "
        f"{stats.warmup_compiles} widths compiled in {stats.warmup_s:.1f} s) at {http.server_url(sock)}"
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    announce("stopped")


def serve_command(
    model: str = typer.Option(..., "--model", help="checkpoint folder (GLA or Qwen3; config.json, weights, tokenizer)"),
    device: str = device_option(),
    backend: str = backend_option(help="torch.compile backend of the decode step"),
    max_seqs: int = typer.Option(64, "--max-seqs", help="slots in the pool: sequences decoded together"),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="decode widths, e.g. 1,2,4,8 (default: powers of two up to --max-seqs)"),
    no_buckets: bool = typer.Option(False, "--no-buckets", help="decode at the exact running count (each new count compiles)"),
    eager: bool = typer.Option(False, "--eager", help="no torch.compile: exact, reproducible logits"),
    state_dtype: str = typer.Option("float32", "--state-dtype", help="dtype of each slot's state: float32 or bfloat16"),
    max_waiting: int = typer.Option(256, "--max-waiting", help="requests queued for a slot before new ones get 429"),
    max_prompt_tokens: int = typer.Option(8192, "--max-prompt-tokens", help="longest prompt accepted"),
    max_new_tokens: int = typer.Option(4096, "--max-new-tokens", help="largest max_tokens accepted"),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="KV-cache models: positions per slot (default prompt + new tokens)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 for every interface)"),
    port: int = typer.Option(8000, "--port", help="port to listen on (0: a free port, printed)"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="the name clients pass as model (default: the folder name)"),
    executor: str = typer.Option("local", "--executor", help="local (this process) or ray (Ray Serve replicas)"),
    replicas: int = typer.Option(1, "--replicas", help="--executor ray: engine replicas, one device each"),
):
    """Serve a checkpoint over an OpenAI-compatible HTTP API (/v1/completions, /health, /metrics)."""
    # The checkpoint (config, weights header, tokenizer: the HTTP API takes and returns text) before
    # anything is imported or loaded.
    check_checkpoint(model)
    quiet_libraries()
    request = ServeRequest(
        model=model, device=device, backend=backend, max_seqs=max_seqs, buckets=buckets, no_buckets=no_buckets, eager=eager,
        state_dtype=state_dtype, max_waiting=max_waiting, max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
        max_len=max_len, host=host, port=port, served_model_name=served_model_name,
    )
    announce = lambda line: print(line, flush=True)  # noqa: E731
    if executor == "ray":
        from assay.serve.ray_deployment import serve_with_ray

        serve_with_ray(request, replicas, announce=announce)
    elif executor == "local":
        if replicas != 1:
            raise AssayError("--replicas needs --executor ray (a local server is one engine)")
        serve(request, announce=announce)
    else:
        raise AssayError(f"unknown --executor {executor!r}: local or ray")
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
