"""Running the HTTP server: `assay serve`'s request and start-up, and uvicorn on a listening socket (on the
main thread for `assay serve`, on a background thread for tests and notebooks).

Imports neither FastAPI nor uvicorn at the top: `assay serve` reports a missing one as a usage error.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from assay.core.errors import AssayError
from assay.serve.middleware import DEFAULT_MAX_REQUEST_BYTES


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
    dtype: str = "float32"  # the weights' (--dtype): float32 or bfloat16; logits are float32 either way
    max_prefill_tokens: int | None = None  # None: the engine's default budget
    long_prefill_token_threshold: int | None = None  # None: the engine's default
    max_waiting: int = 256
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 4096
    max_len: Optional[int] = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: Optional[str] = None
    # Every /v1/* route needs `Authorization: Bearer <api_key>` (None: open). Kept out of repr, so out of logs.
    api_key: Optional[str] = field(default=None, repr=False)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a larger body is 413 before it is parsed


def default_buckets(max_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the first power of two >= max_seqs: every running count has a bucket."""
    widths = [1]
    while widths[-1] < max_seqs:
        widths.append(widths[-1] * 2)
    return tuple(widths)


def engine_config(request: ServeRequest):
    """The engine's flags, checked (with --dtype, and --max-len against the checkpoint's positions)."""
    from assay.serve.config import EngineConfig
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
        max_new_tokens=request.max_new_tokens, max_len=request.max_len, dtype=request.dtype,
        **({} if request.max_prefill_tokens is None else {"max_prefill_tokens": request.max_prefill_tokens}),
        **({} if request.long_prefill_token_threshold is None else {"long_prefill_token_threshold": request.long_prefill_token_threshold}),
    )
    config.validate()
    if request.max_len is not None:  # sizing imports torch: only when there is a --max-len to check
        from assay.serve.sizing import check_max_len

        check_max_len(request.model, request.max_len)
    return config


def load_engine(request: ServeRequest, config):
    """Engine.from_checkpoint: the weights in config.dtype (--dtype), cast before the first decode is traced."""
    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.engine import Engine

    from dataclasses import replace

    return Engine.from_checkpoint(checkpoint_dir(request.model), replace(config, dtype=request.dtype))


def check_request(request: ServeRequest) -> None:
    """The HTTP flags (engine_config checks the engine's)."""
    if not 0 <= request.port <= 65535:
        raise AssayError(f"--port must be in [0, 65535], got {request.port}")
    if request.max_request_bytes < 1024:
        raise AssayError(f"--max-request-bytes must be at least 1024, got {request.max_request_bytes}")
    if request.api_key is not None and (not request.api_key.strip() or any(c.isspace() for c in request.api_key)):
        raise AssayError("--api-key (or ASSAY_API_KEY) must be a non-empty string without spaces")


def _import_routes():
    try:
        import uvicorn  # noqa: F401 (only checked here; uvicorn_server imports it)

        from assay.serve import routes
    except ImportError as exc:
        raise AssayError(f"`assay serve` needs FastAPI and uvicorn ({exc.name} is missing): pip install 'assay[serve]'") from None
    return routes


def serve(request: ServeRequest, announce=print) -> None:
    """Load, warm up, listen, announce the URL, serve until SIGINT/SIGTERM, then stop the engine thread."""
    check_request(request)
    config = engine_config(request)  # bad flags fail here, before torch is imported and the model loads
    routes = _import_routes()
    from assay.models.hf_checkpoint import checkpoint_dir
    from assay.serve.adapters import adapter_dtype

    folder = checkpoint_dir(request.model)
    engine = load_engine(request, config)
    engine.warm_up()
    model_name = request.served_model_name or Path(folder).name
    app = routes.create_app(engine, model_name, api_key=request.api_key, max_request_bytes=request.max_request_bytes)
    sock = bind_socket(request.host, request.port)
    server = uvicorn_server(app)
    # The socket listens already: a client that connects before uvicorn's loop runs waits in the backlog.
    stats = engine.stats()
    slots = f"{config.max_seqs} slots" + (f" of {stats.memory.max_len} positions" if stats.memory.max_len else "")
    announce(
        f"serving {model_name} ({stats.model_type}, {adapter_dtype(engine.adapter)}, {config.mode}, {slots}, "
        f"{stats.warmup_compiles} widths compiled in {stats.warmup_s:.1f} s) at {server_url(sock)}"
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    announce("stopped")



@dataclass
class ServerHandle:
    """A uvicorn server running the app on a thread (tests, notebooks); `assay serve` runs it on the main thread."""

    url: str
    server: Any
    thread: threading.Thread

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def bind_socket(host: str, port: int):
    """A listening socket (port 0: the OS picks a free port), so the URL is known before uvicorn starts."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AssayError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def server_url(sock) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(app, log_level: str = "warning", graceful_shutdown_s: float = 10.0, http: str = "auto"):
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn re-raises a caught SIGINT/SIGTERM after its graceful shutdown, which would end the
            # process with a KeyboardInterrupt or signal status; `assay serve` treats either as "stop, exit 0".
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    # http: "auto" takes httptools when installed (ASGI 2.4: a disconnect surfaces as a failed write),
    # else h11 (ASGI 2.3: Starlette cancels the stream); both end in the same abort.
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_shutdown_s, lifespan="on", http=http)
    return Server(config)


def start_in_thread(app, host: str = "127.0.0.1", port: int = 0, ready_timeout_s: float = 60.0, http: str = "auto") -> ServerHandle:
    """Serve `app` from a background thread; returns once the server accepts connections."""
    sock = bind_socket(host, port)
    server = uvicorn_server(app, http=http)  # on a thread: uvicorn installs no signal handlers
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="assay-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the HTTP server did not start")
        time.sleep(0.02)
    return ServerHandle(server_url(sock), server, thread)
