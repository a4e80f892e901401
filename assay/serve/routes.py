"""The FastAPI app: /v1/completions (streaming or not), /v1/models, /health and /metrics.

One `Completions` object per app holds what the routes share (the engine loop, the tokenizer, the
metrics); each request is a `_Completion` whose tokens arrive on its own asyncio.Queue, put there from
the engine thread with call_soon_threadsafe. A client that disconnects has its request aborted, so its
slot returns to the pool at the next step; a full waiting queue is 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from assay.core.errors import AssayError
from assay.serve.engine import Engine, QueueFull
from assay.serve.engine_loop import EngineFailed, EngineLoop
from assay.serve.metrics import CONTENT_TYPE, ServerMetrics
from assay.serve.protocol import (
    SSE_DONE,
    CompletionRequest,
    IncrementalText,
    completion_body,
    error_body,
    sse,
    usage,
    validation_message,
)

# Put on a request's queue by its disconnect watcher: the client has gone.
_CLIENT_GONE = object()


def _error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind), status_code=status, headers=headers)


class _ClosingStream(StreamingResponse):
    """Closes the body generator however the response ends, so its finally (the abort) runs at once
    rather than whenever the generator is garbage-collected (ASGI 2.4 servers end with a raised send),
    then calls on_close: a generator cancelled before its first step has no finally to run."""

    def __init__(self, content, on_close: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self.on_close()


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to go (the body is read already, so receive() only ever reports a disconnect).

    A task of its own rather than request.is_disconnected() polls: those cancel-scope polls can deliver
    a stray cancellation into the awaiting handler under anyio on asyncio.
    """
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait(_CLIENT_GONE)
            return


@dataclass
class _Completion:
    request_id: str
    created: int
    prompt_tokens: int
    text: IncrementalText
    queue: asyncio.Queue
    completion_tokens: int = 0
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"; None while it runs
    settled: bool = False


class Completions:
    """/v1/completions over one engine loop: submit, collect or stream the tokens, settle once."""

    def __init__(self, engine_loop: EngineLoop, tokenizer, model_name: str, metrics: ServerMetrics, retry_after_s: int):
        self.engine_loop = engine_loop
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.model_name = model_name
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self._ids = itertools.count()

    def body(self, completion: _Completion, text: str | None, finish_reason: str | None = None, with_usage: bool = False) -> dict:
        used = usage(completion.prompt_tokens, completion.completion_tokens) if with_usage else None
        return completion_body(completion.request_id, completion.created, self.model_name, text, finish_reason, used)

    async def handle(self, body: CompletionRequest, request: Request):
        if body.model is not None and body.model != self.model_name:
            self.metrics.count("rejected_invalid")
            return _error(404, f"the model {body.model!r} does not exist; this server serves {self.model_name!r}", "not_found_error")
        try:
            prompt = self.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        except Exception as exc:  # a tokenizer that cannot encode the text is the caller's input, not a bug
            self.metrics.count("rejected_invalid")
            return _error(400, f"the prompt could not be tokenized: {exc}", "invalid_request_error")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        eos = () if body.ignore_eos or self.eos_token_id is None else (self.eos_token_id,)
        request_id = f"cmpl-{uuid.uuid4().hex[:24]}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def listener(item) -> None:  # runs on the engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop has closed (server shutting down): nobody is listening
                pass

        completion = _Completion(request_id, int(time.time()), len(prompt), IncrementalText(self.tokenizer, stop), queue)
        try:
            self.engine_loop.submit(
                request_id, listener, prompt_tokens=prompt, max_tokens=body.max_tokens, temperature=body.temperature,
                seed=body.seed, stop_token_ids=tuple(body.stop_token_ids or ()) + eos,
            )
        except QueueFull as exc:
            self.metrics.count("rejected_queue_full")
            return _error(429, str(exc), "rate_limit_error", headers={"Retry-After": str(self.retry_after_s)})
        except AssayError as exc:
            self.metrics.count("rejected_invalid")
            return _error(400, str(exc), "invalid_request_error")
        except EngineFailed as exc:
            self.metrics.count("error")
            return _error(503, str(exc), "server_error")

        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _ClosingStream(
                self._stream(completion, request, include_usage), on_close=lambda: self._settle(completion),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await self._collect(completion, request)

    async def _collect(self, completion: _Completion, request: Request):
        pieces: list[str] = []
        watcher = asyncio.create_task(_watch_disconnect(request, completion.queue))
        try:
            while True:
                piece = await self._next_piece(completion)
                if piece is None:
                    return JSONResponse({}, status_code=499)  # nobody reads it; the finally below aborts
                pieces.append(piece[0])
                if piece[1]:
                    break
        except EngineFailed as exc:
            completion.finish_reason = "error"
            self.metrics.count("error")
            return _error(500, str(exc), "server_error")
        finally:
            watcher.cancel()
            self._settle(completion)
        return self.body(completion, "".join(pieces), completion.finish_reason, with_usage=True)

    async def _stream(self, completion: _Completion, request: Request, include_usage: bool):
        # Starlette also cancels a stream on disconnect (ASGI < 2.4) or fails its next write (2.4); the
        # watcher catches a client that leaves while its request is still queued and no token is written.
        watcher = asyncio.create_task(_watch_disconnect(request, completion.queue))
        try:
            while True:
                try:
                    piece = await self._next_piece(completion)
                except EngineFailed as exc:
                    completion.finish_reason = "error"
                    self.metrics.count("error")
                    yield sse(error_body(500, str(exc), "server_error"))
                    yield SSE_DONE
                    return
                if piece is None:
                    return  # the client left while waiting; the finally aborts
                text, finished = piece
                yield sse(self.body(completion, text, completion.finish_reason if finished else None))
                if finished:
                    if include_usage:
                        yield sse(self.body(completion, None, with_usage=True))
                    yield SSE_DONE
                    return
        finally:
            # Also reached when the client disconnects mid-stream (the write fails or the task is cancelled).
            watcher.cancel()
            self._settle(completion)

    async def _next_piece(self, completion: _Completion) -> tuple[str, bool] | None:
        """The next (text delta, finished) of the request; None when its client has gone."""
        while True:
            item = await completion.queue.get()
            if item is _CLIENT_GONE:
                return None
            if isinstance(item, EngineFailed):
                raise item
            completion.completion_tokens += 1 if item.token_id >= 0 else 0
            if item.finished and item.finish_reason == "abort":
                completion.finish_reason = "abort"
                return completion.text.flush(), True
            delta, stopped = completion.text.add(item.token_id)
            if stopped:
                # A stop string ended the text before the engine did: free the slot now, answer "stop".
                self.engine_loop.abort(completion.request_id)
                completion.finish_reason = "stop"
                return delta, True
            if item.finished:
                completion.finish_reason = item.finish_reason
                return delta + completion.text.flush(), True
            return delta, False

    def _settle(self, completion: _Completion) -> None:
        """However the request ended, once: abort it in the engine if it still runs (the client has gone or
        the handler was cancelled; its slot is freed at the next step), and count its outcome."""
        if completion.settled:
            return
        completion.settled = True
        if completion.finish_reason is None:
            self.engine_loop.abort(completion.request_id)
            completion.finish_reason = "abort"
        if completion.finish_reason != "error":  # errors were counted where they happened
            self.metrics.count(completion.finish_reason, completion.prompt_tokens)


class _ServerHeader:
    """Pure ASGI middleware: every response names the server (replica) that answered, in X-Assay-Server.
    (Starlette's BaseHTTPMiddleware would wrap receive and get in the way of streaming and disconnects.)"""

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


def create_app(engine: Engine, model_name: str, retry_after_s: int = 1, server_id: str | None = None) -> FastAPI:
    """The FastAPI app over a warmed-up engine. Its lifespan starts the engine thread and stops it.

    server_id (e.g. a Ray Serve replica's id) is sent back in an X-Assay-Server header on every response.
    """
    engine_loop = EngineLoop(engine)
    metrics = ServerMetrics(engine)
    # The tokenizer loads now, not on the first request (and never from two threads at once).
    completions = Completions(engine_loop, engine.tokenizer, model_name, metrics, retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()

    app = FastAPI(title="assay serve", lifespan=lifespan)
    if server_id is not None:
        app.add_middleware(_ServerHeader, server_id=server_id)
    app.state.engine = engine
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        status, message = validation_message(list(exc.errors()))
        metrics.count("rejected_invalid")
        return _error(status, message, "invalid_request_error")

    @app.get("/health")
    async def health():
        if not engine_loop.alive:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_route():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "assay"}]}

    @app.post("/v1/completions")
    async def completions_route(body: CompletionRequest, request: Request):
        return await completions.handle(body, request)

    return app
