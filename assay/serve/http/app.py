"""The FastAPI app: /v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health and
/metrics, behind the door's middleware (API key, request size).

What the routes share is `Frontend` (frontend.py); each request is a `Generation` (generation.py) whose
tokens arrive on its own asyncio.Queue; the two generating routes are completions.py and chat.py.
"""

from __future__ import annotations

import contextlib
from typing import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from assay.serve.http import chat, completions
from assay.serve.engine.engine import Engine
from assay.serve.engine.loop import EngineLoop
from assay.serve.http.frontend import Frontend
from assay.serve.http.metrics import CONTENT_TYPE, ServerMetrics
from assay.serve.http.middleware import DEFAULT_MAX_REQUEST_BYTES, ApiKey, BodyLimit, ServerHeader
from assay.serve.http.openapi import BODIES, describe, responses
from assay.serve.http.protocol import RequestError


def create_app(
    engine: Engine, model_name: str, retry_after_s: int = 1, server_id: str | None = None, api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, metrics_text: Callable[[], Awaitable[bytes]] | None = None,
) -> FastAPI:
    """The FastAPI app over a warmed-up engine. Its lifespan starts the engine thread and stops it.

    server_id (e.g. a Ray Serve replica's id) is sent back in an X-Assay-Server header on every response.
    api_key: every /v1/* route needs `Authorization: Bearer <api_key>`. metrics_text: what /metrics
    answers instead of this app's own metrics (Ray Serve: the sum over every replica).
    """
    engine_loop = EngineLoop(engine)
    metrics = ServerMetrics(engine)
    frontend = Frontend.of_engine(engine, engine_loop, model_name, metrics, retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()

    def health() -> tuple[int, dict]:
        return (200, {"status": "ok"}) if engine_loop.alive else (503, {"status": "unavailable"})

    app = create_api(frontend, health, lifespan, server_id=server_id, api_key=api_key, max_request_bytes=max_request_bytes,
                     metrics_text=metrics_text)
    app.state.engine = engine
    app.state.engine_loop = engine_loop
    return app


def create_api(
    frontend: Frontend, health: Callable[[], tuple[int, dict]], lifespan, server_id: str | None = None, api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, metrics_text: Callable[[], Awaitable[bytes]] | None = None,
) -> FastAPI:
    """The routes over a Frontend, whatever generates its tokens (frontend.engine_loop: the local engine
    thread, or engine replicas elsewhere); health() -> (status, body) answers /health."""
    metrics, model_name = frontend.metrics, frontend.model_name
    app = FastAPI(title="assay serve", lifespan=lifespan)
    # Added innermost first: the key is checked before the body is read, the size before it is parsed.
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, on_refuse=metrics.count)
    if api_key:
        app.add_middleware(ApiKey, api_key=api_key, on_refuse=metrics.count)
    if server_id is not None:
        app.add_middleware(ServerHeader, server_id=server_id)
    app.state.metrics = metrics
    app.state.frontend = frontend

    @app.get("/health")
    async def health_route():
        status, body = health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics_route():
        return Response(await metrics_text() if metrics_text else metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "assay"}]}

    def generating(handle):
        async def route(request: Request):
            try:
                return await handle(frontend, await request.body(), request)
            except RequestError as exc:
                return frontend.error(exc)

        route.__name__ = handle.__module__.rsplit(".", 1)[-1]  # the operation's name in /openapi.json
        return route

    for path, handle in (("/v1/completions", completions.handle), ("/v1/chat/completions", chat.handle)):
        app.post(path, responses=responses(BODIES[path][1]))(generating(handle))
    describe(app)  # /openapi.json with the request bodies the routes validate by hand

    return app
