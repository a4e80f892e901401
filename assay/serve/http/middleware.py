"""Pure ASGI middleware at the server's door, before any route runs (Starlette's BaseHTTPMiddleware would
wrap receive and get in the way of streaming and disconnects):

  ApiKey        every /v1/* route answers 401 without `Authorization: Bearer KEY`; /health and /metrics stay open
  BodyLimit     a request body over max_bytes is 413, before any of it is parsed (Content-Length first, then
                by counting what arrives, so a chunked body cannot get past it)
  ServerHeader  every response names the server (a Ray Serve replica) that answered, in X-Assay-Server

The key is compared in constant time and appears in no message, log line or metric.
"""

from __future__ import annotations

import hmac
import json
from typing import Callable

from assay.serve.http.responses import error_body

# A request body larger than this is refused (413) before it is parsed (--max-request-bytes): room for a
# prompt of 8,192 token ids at about 6 bytes each in JSON many times over.
DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
# Methods whose requests carry no body to limit.
_NO_BODY_METHODS = (b"GET", b"HEAD", b"OPTIONS", b"DELETE")


async def _send_error(send, status: int, message: str, kind: str, headers: list | None = None) -> None:
    body = json.dumps(error_body(status, message, kind)).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or []),
    ]})
    await send({"type": "http.response.body", "body": body})


class ApiKey:
    def __init__(self, app, api_key: str, on_refuse: Callable[[str], None] = lambda outcome: None, prefix: str = "/v1"):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.on_refuse = on_refuse
        self.prefix = prefix

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (scope["path"] == self.prefix or scope["path"].startswith(self.prefix + "/")):
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                self.on_refuse("rejected_unauthorized")
                what = "no Authorization header" if not given else "the Authorization header does not carry the server's key"
                await _send_error(send, 401, f"{what}: send 'Authorization: Bearer <key>' (the key given to assay serve "
                                             "by --api-key or ASSAY_API_KEY)", "authentication_error",
                                  [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app, max_bytes: int, on_refuse: Callable[[str], None] = lambda outcome: None):
        self.app = app
        self.max_bytes = max_bytes
        self.on_refuse = on_refuse

    async def _refuse(self, send, size: str) -> None:
        self.on_refuse("rejected_too_large")
        await _send_error(send, 413, f"the request body is {size}; this server accepts at most {self.max_bytes} bytes "
                                     "(--max-request-bytes)", "invalid_request_error")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method", "GET").encode() in _NO_BODY_METHODS:
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, f"{int(declared)} bytes (Content-Length)")
        # Read the whole body here, counting: the app then gets it in one message, and receive() after it
        # goes to the server as before (disconnects).
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body was complete: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._refuse(send, f"over {self.max_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ServerHeader:
    def __init__(self, app, server_id: str):
        self.app = app
        self.header = (b"x-assay-server", server_id.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), self.header])
            await send(message)

        await self.app(scope, receive, send_with_header)
