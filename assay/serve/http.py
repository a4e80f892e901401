"""The OpenAI-compatible HTTP API over the engine: /v1/completions (streaming or not), /v1/models,
/health and /metrics (Prometheus text format).

    engine = Engine.from_checkpoint("zoo/gla", EngineConfig(...)); engine.warm_up()
    app = create_app(engine, model_name="gla")     # FastAPI; its lifespan starts and stops the engine loop
    uvicorn.run(app, host="127.0.0.1", port=8000)

Two threads, each owning one thing. The engine thread (EngineLoop) alone calls engine.step(), in a
loop, sleeping on an event while nothing is unfinished. The event loop serves HTTP: it hands requests
over with engine.add_request / engine.abort (both thread-safe) and gets tokens back as TokenEvents,
which the engine thread puts on each request's asyncio.Queue with call_soon_threadsafe.

vLLM is the reference for the wire format: errors are {"error": {"message", "type", "code"}};
a full waiting queue is 429 with Retry-After; malformed JSON and engine-rejected values are 400;
a body of the wrong shape or out-of-range fields is 422, with one readable line per problem.
A client that disconnects has its request aborted, so its slot returns to the pool at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from assay.core.errors import AssayError
from assay.core.metrics import percentile
from assay.serve.engine import Engine, QueueFull, TokenEvent

log = logging.getLogger("assay.serve")

# Outcomes counted in assay_requests_total{outcome=...}: the three finish reasons, and the refusals.
OUTCOMES = ("length", "stop", "abort", "rejected_queue_full", "rejected_invalid", "error")
SUMMARY_QUANTILES = (50, 95, 99)
# Put on a request's queue by its disconnect watcher: the client has gone.
_CLIENT_GONE = object()


class EngineFailed(RuntimeError):
    """engine.step() raised: a bug, not bad input. Every open request gets a 500; /health turns 503."""


# ---------------------------------------------------------------- the engine thread


class EngineLoop:
    """Steps the engine on one thread and routes each TokenEvent to the listener of its request."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._listeners: dict[str, Callable[[TokenEvent | EngineFailed], None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="assay-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request_id: str, listener: Callable, **request: Any) -> None:
        """Register the listener, then add the request (AssayError / QueueFull propagate, nothing stays registered)."""
        if not self.alive:
            raise EngineFailed("the engine is not running")
        with self._lock:
            self._listeners[request_id] = listener
        try:
            self.engine.add_request(request_id, **request)
        except BaseException:
            self.forget(request_id)
            raise
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Stop the request (its slot is freed at the next step) and drop its listener."""
        self.forget(request_id)
        self.engine.abort(request_id)
        self._wake.set()

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._listeners.pop(request_id, None)

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping.is_set():
            if not engine.has_unfinished():
                # add_request / abort set the event; the timeout only bounds how late a stop is noticed.
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                events = engine.step()
            except BaseException as exc:  # a bug in the engine: fail every open request loudly, stop stepping
                log.exception("engine.step() failed; the server stops taking requests")
                self.failure = exc
                with self._lock:
                    listeners, self._listeners = list(self._listeners.values()), {}
                for listener in listeners:
                    listener(EngineFailed(f"the engine failed: {type(exc).__name__}: {exc}"))
                return
            for event in events:
                with self._lock:
                    listener = self._listeners.pop(event.request_id, None) if event.finished else self._listeners.get(event.request_id)
                if listener is not None:
                    listener(event)


# ---------------------------------------------------------------- metrics


@dataclass
class ServerCounters:
    """What only the HTTP layer knows: outcomes (refusals included) and prompt/completion tokens served."""

    outcomes: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens


def _sample(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    label_text = ""
    if labels:
        label_text = "{" + ",".join(f'{key}="{val}"' for key, val in labels.items()) + "}"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = "NaN"
    elif isinstance(value, float) and math.isinf(value):
        text = "+Inf" if value > 0 else "-Inf"
    else:
        text = repr(float(value)) if isinstance(value, float) else str(int(value))
    return f"{name}{label_text} {text}"


def render_metrics(engine: Engine, counters: ServerCounters) -> str:
    """Prometheus text exposition format (version 0.0.4), written by hand: no client library needed."""
    stats = engine.stats()
    summary = stats.as_dict()
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float, dict | None]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(_sample(sample_name, value, labels) for sample_name, value, labels in samples)

    with counters.lock:
        outcomes = dict(counters.outcomes)
        prompt_tokens = counters.prompt_tokens
    metric("assay_requests_total", "counter", "HTTP completion requests by outcome (finish reason or refusal).",
           [("assay_requests_total", outcomes.get(outcome, 0), {"outcome": outcome}) for outcome in OUTCOMES])
    metric("assay_prompt_tokens_total", "counter", "Prompt tokens of the requests that were answered.",
           [("assay_prompt_tokens_total", prompt_tokens, None)])
    metric("assay_generated_tokens_total", "counter", "Tokens the engine generated (every request, aborted ones too).",
           [("assay_generated_tokens_total", summary["output_tokens"], None)])
    metric("assay_decode_steps_total", "counter", "Decode steps the engine ran.",
           [("assay_decode_steps_total", summary["decode_steps"], None)])
    metric("assay_compiles_total", "counter", "Decode-width compilations: at warm-up, and while serving (a request waited on them).",
           [("assay_compiles_total", summary["warmup_compiles"], {"phase": "warmup"}),
            ("assay_compiles_total", summary["compiles"], {"phase": "serving"})])
    metric("assay_compile_seconds_total", "counter", "Seconds spent compiling: warm-up wall time, and dynamo's compile time while serving.",
           [("assay_compile_seconds_total", float(summary["warmup_s"]), {"phase": "warmup"}),
            ("assay_compile_seconds_total", float(summary["compile_s"]), {"phase": "serving"})])
    metric("assay_running_requests", "gauge", "Requests holding a slot.", [("assay_running_requests", engine.num_running, None)])
    metric("assay_waiting_requests", "gauge", "Requests queued for a slot.", [("assay_waiting_requests", engine.num_waiting, None)])
    metric("assay_free_slots", "gauge", "Slots free in the pool.", [("assay_free_slots", engine.free_slots, None)])
    metric("assay_slots", "gauge", "Slots in the pool (--max-seqs).", [("assay_slots", engine.config.max_seqs, None)])
    metric("assay_state_bytes_per_sequence", "gauge", "Bytes of decoding state one slot holds.",
           [("assay_state_bytes_per_sequence", stats.memory.state_bytes_per_sequence, None)])
    for name, values, help_text in (
        ("assay_ttft_seconds", stats.ttfts(), "Time to first token: request added -> first token (queueing + prefill)."),
        ("assay_tpot_seconds", stats.tpots(), "Time per output token after the first, per request."),
    ):
        samples = [(name, percentile(values, q) if values else math.nan, {"quantile": str(q / 100)}) for q in SUMMARY_QUANTILES]
        samples += [(f"{name}_sum", float(sum(values)), None), (f"{name}_count", len(values), None)]
        metric(name, "summary", help_text, samples)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- requests and text


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """The fields of OpenAI's /v1/completions this server honours; other fields are ignored."""

    # strict: "16" is not a number of tokens and 1.0 is not a token id; a client that sends them has a bug.
    model_config = ConfigDict(extra="ignore", strict=True)
    model: Optional[str] = None
    prompt: Union[str, list[int]]
    max_tokens: int = Field(16, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    n: int = Field(1, ge=1, le=1)
    # vLLM's extensions: extra stop token ids, and generating past the end-of-text token.
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False


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


class IncrementalText:
    """Token ids in, text deltas out; stop strings cut the text (and are not part of it), as in vLLM.

    The whole text is re-decoded each token (byte-level BPE: a character may span tokens), a trailing
    incomplete character is held back, and so are the last len(longest stop) - 1 characters, which
    could still turn into a stop string.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.text = ""

    def add(self, token_id: int) -> tuple[str, bool]:
        """(new text to send, whether a stop string ended the text)."""
        self.ids.append(token_id)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            return self._take(max(cut, self.sent)), True
        stable = len(self.text.rstrip("\ufffd"))
        return self._take(max(self.sent, stable - self.hold)), False

    def flush(self) -> str:
        """The held-back rest, once the request finished without a stop string."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        delta = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return delta


def _error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status, headers=headers)


def _validation_message(errors: list[dict]) -> tuple[int, str]:
    """FastAPI's validation errors as (status, one readable line): 400 for a body that is not JSON, 422 otherwise."""
    problems = []
    for error in errors:
        if error.get("type") in ("json_invalid", "json_type"):
            return 400, f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}"
        location = [str(part) for part in error.get("loc", ()) if part != "body"]
        if location[:1] == ["prompt"] and error.get("type") != "missing":
            # A union reports one error per branch; what the user needs is the shape that is accepted.
            problems.append("prompt: expected a string or a list of token ids (integers)")
            continue
        where = ".".join(location) if location else "body"
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    unique = list(dict.fromkeys(problems))
    return 422, "; ".join(unique) if unique else "invalid request body"


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


# ---------------------------------------------------------------- the app


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
    tokenizer = engine.tokenizer  # loaded now, not on the first request (and never from two threads at once)
    eos_token_id = tokenizer.eos_token_id
    engine_loop = EngineLoop(engine)
    counters = ServerCounters()
    ids = itertools.count()

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
    app.state.counters = counters

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        status, message = _validation_message(list(exc.errors()))
        counters.count("rejected_invalid")
        return _error(status, message, "invalid_request_error")

    @app.get("/health")
    async def health():
        if not engine_loop.alive:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(render_metrics(engine, counters), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "assay"}]}

    def chunk(completion: _Completion, text: str, finish_reason: str | None) -> str:
        body = {
            "id": completion.request_id, "object": "text_completion", "created": completion.created, "model": model_name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        }
        return f"data: {json.dumps(body)}\n\n"

    def usage(completion: _Completion) -> dict:
        return {
            "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        }

    async def next_piece(completion: _Completion) -> tuple[str, bool] | None:
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
                engine_loop.abort(completion.request_id)
                completion.finish_reason = "stop"
                return delta, True
            if item.finished:
                completion.finish_reason = item.finish_reason
                return delta + completion.text.flush(), True
            return delta, False

    def settle(completion: _Completion) -> None:
        """However the request ended, once: abort it in the engine if it still runs (the client has gone or
        the handler was cancelled; its slot is freed at the next step), and count its outcome."""
        if completion.settled:
            return
        completion.settled = True
        if completion.finish_reason is None:
            engine_loop.abort(completion.request_id)
            completion.finish_reason = "abort"
        if completion.finish_reason != "error":  # errors were counted where they happened
            counters.count(completion.finish_reason, completion.prompt_tokens, completion.completion_tokens)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if body.model is not None and body.model != model_name:
            counters.count("rejected_invalid")
            return _error(404, f"the model {body.model!r} does not exist; this server serves {model_name!r}", "not_found_error")
        try:
            prompt = tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        except Exception as exc:  # a tokenizer that cannot encode the text is the caller's input, not a bug
            counters.count("rejected_invalid")
            return _error(400, f"the prompt could not be tokenized: {exc}", "invalid_request_error")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        stop_token_ids = tuple(body.stop_token_ids or ()) + (() if body.ignore_eos or eos_token_id is None else (eos_token_id,))
        request_id = f"cmpl-{uuid.uuid4().hex[:24]}-{next(ids)}"
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def listener(item) -> None:  # runs on the engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop has closed (server shutting down): nobody is listening
                pass

        completion = _Completion(request_id, int(time.time()), len(prompt), IncrementalText(tokenizer, stop), queue)
        try:
            engine_loop.submit(
                request_id, listener, prompt_tokens=prompt, max_tokens=body.max_tokens, temperature=body.temperature,
                seed=body.seed, stop_token_ids=stop_token_ids,
            )
        except QueueFull as exc:
            counters.count("rejected_queue_full")
            return _error(429, str(exc), "rate_limit_error", headers={"Retry-After": str(retry_after_s)})
        except AssayError as exc:
            counters.count("rejected_invalid")
            return _error(400, str(exc), "invalid_request_error")
        except EngineFailed as exc:
            counters.count("error")
            return _error(503, str(exc), "server_error")

        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _ClosingStream(
                _stream(completion, request, include_usage), on_close=lambda: settle(completion), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        pieces: list[str] = []
        watcher = asyncio.create_task(_watch_disconnect(request, queue))
        try:
            while True:
                piece = await next_piece(completion)
                if piece is None:
                    return JSONResponse({}, status_code=499)  # nobody reads it; the finally below aborts
                pieces.append(piece[0])
                if piece[1]:
                    break
        except EngineFailed as exc:
            completion.finish_reason = "error"
            counters.count("error")
            return _error(500, str(exc), "server_error")
        finally:
            watcher.cancel()
            settle(completion)
        return {
            "id": request_id, "object": "text_completion", "created": completion.created, "model": model_name,
            "choices": [{"index": 0, "text": "".join(pieces), "logprobs": None, "finish_reason": completion.finish_reason}],
            "usage": usage(completion),
        }

    async def _stream(completion: _Completion, request: Request, include_usage: bool):
        # Starlette also cancels a stream on disconnect (ASGI < 2.4) or fails its next write (2.4); the
        # watcher catches a client that leaves while its request is still queued and no token is written.
        watcher = asyncio.create_task(_watch_disconnect(request, completion.queue))
        try:
            while True:
                try:
                    piece = await next_piece(completion)
                except EngineFailed as exc:
                    completion.finish_reason = "error"
                    counters.count("error")
                    yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'server_error', 'code': 500}})}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                if piece is None:
                    return  # the client left while waiting; the finally aborts
                text, finished = piece
                yield chunk(completion, text, completion.finish_reason if finished else None)
                if finished:
                    if include_usage:
                        body = {"id": completion.request_id, "object": "text_completion", "created": completion.created,
                                "model": model_name, "choices": [], "usage": usage(completion)}
                        yield f"data: {json.dumps(body)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
        finally:
            # Also reached when the client disconnects mid-stream (the write fails or the task is cancelled).
            watcher.cancel()
            settle(completion)

    return app


# ---------------------------------------------------------------- running it


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


def uvicorn_server(app: FastAPI, log_level: str = "warning", graceful_shutdown_s: float = 10.0, http: str = "auto"):
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


__all__ = ["EngineLoop", "IncrementalText", "ServerHandle", "bind_socket", "create_app", "render_metrics", "start_in_thread"]
