"""One HTTP request's dealings with the engine replicas, as the router's response headers report them:
X-Assay-Server names the engine replica that first accepted it, X-Assay-Reruns how many times it was run
again on another replica (sent only when it was, and known only for answers sent whole).

ReplicaHeader (pure ASGI, outermost) opens an Exchange per request; the RemoteEngine finds it through a
context variable when the route submits, and the response's headers wait until a replica has accepted
the request (or it failed), so a streamed response names its replica too.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextvars import ContextVar

# How long a response's headers wait for a replica to accept its request before going out without its name.
HEADER_WAIT_S = 60.0

_current: ContextVar[Exchange | None] = ContextVar("assay_exchange", default=None)


class Exchange:
    def __init__(self):
        self.server: str | None = None
        self.reruns = 0
        self.dispatched = 0  # engine requests sent for this HTTP request
        self._settled = asyncio.Event()

    def accepted(self, replica: str) -> None:
        if self.server is None:
            self.server = replica
        self._settled.set()

    def ended(self) -> None:
        self._settled.set()

    async def settled(self) -> None:
        if self.dispatched:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._settled.wait(), HEADER_WAIT_S)


def current() -> Exchange | None:
    """The Exchange of the HTTP request being handled (None outside one, e.g. in a test driving the engine)."""
    return _current.get()


class ReplicaHeader:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        exchange = Exchange()
        token = _current.set(exchange)

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                await exchange.settled()
                headers = list(message.get("headers", []))
                if exchange.server is not None:
                    headers.append((b"x-assay-server", exchange.server.encode()))
                if exchange.reruns:
                    headers.append((b"x-assay-reruns", str(exchange.reruns).encode()))
                message = dict(message, headers=headers)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            _current.reset(token)
