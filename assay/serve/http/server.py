"""uvicorn on a listening socket: on the main thread for `assay serve`, on a background thread for tests and
notebooks.

Imports uvicorn only inside its functions: `assay serve` reports a missing one as a usage error.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from assay.core.errors import AssayError


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
