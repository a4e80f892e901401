"""The OpenAI-compatible HTTP API over the engine: /v1/completions and /v1/chat/completions (streaming
or not), /v1/models, /health and /metrics (Prometheus).

    engine = Engine.from_checkpoint("zoo/gla", EngineConfig(...)); engine.warm_up()
    app = create_app(engine, model_name="gla")     # FastAPI; its lifespan starts and stops the engine loop
    handle = start_in_thread(app)                  # or uvicorn.run(app, host="127.0.0.1", port=8000)

Two threads, each owning one thing. The engine thread (EngineLoop) alone calls engine.step(), in a
loop, sleeping on an event while nothing is unfinished. The event loop serves HTTP: it hands requests
over with engine.add_request / engine.abort (both thread-safe) and gets tokens back as TokenEvents,
which the engine thread puts on each request's asyncio.Queue with call_soon_threadsafe.

The parts, one concern each:
  protocol.py      request schemas, the field policy (nothing silently ignored), body parsing, SamplingParams
  detokenize.py    the incremental detokenizer (stop strings, held-back partial characters)
  responses.py     the response bodies of both routes and their log-probability formats
  middleware.py    the door: API key (401), request size (413), the X-Assay-Server header
  generation.py    one request's prompts and choices through the engine, disconnects, settling
  frontend.py      what the routes share: limits checked before any work, errors, the streamed response
  completions.py   /v1/completions (batches, n, echo, logprobs)
  chat.py          /v1/chat/completions (the model's chat template)
  app.py           the FastAPI app
  metrics.py       prometheus_client metrics (TTFT/TPOT histograms as vLLM exposes them), sums over replicas
  server.py        uvicorn on a listening socket
The engine thread is assay.serve.engine.loop; `assay serve`'s start-up is assay.serve.launch.
This package's public face; the names load on first use (`assay serve` checks its flags before FastAPI loads).
"""

from __future__ import annotations

from assay.core.lazy import lazy_exports

_EXPORTS = {
    "create_app": "assay.serve.http.app",
    "ServerMetrics": "assay.serve.http.metrics",
    "ChatCompletionRequest": "assay.serve.http.protocol",
    "CompletionRequest": "assay.serve.http.protocol",
    "ServerHandle": "assay.serve.http.server",
    "bind_socket": "assay.serve.http.server",
    "server_url": "assay.serve.http.server",
    "start_in_thread": "assay.serve.http.server",
    "uvicorn_server": "assay.serve.http.server",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
