"""An engine replica under Ray Serve: one engine and its thread, no HTTP. The router calls `generate` through
a deployment handle with stream=True and reads back what this replica yields:

    Accepted(replica)            first, once the engine has queued the request (the replica's id)
    [TokenEvent, ...]            then the events of the request's choices, as many as arrived since the last yield
    Refused(status, message)     instead of Accepted: the engine refused it (QueueFull 429, bad input 400)
    Failed(message)              the engine thread failed (a bug): the request ends with a 500

Cancelling the stream (the client left, a stop string) aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import AsyncIterator

from assay.core.errors import AssayError


@dataclass(frozen=True)
class Accepted:
    replica: str  # the Ray Serve replica id (what X-Assay-Server names)
    actor_id: str  # the replica's Ray actor id, as an ActorDiedError names it


@dataclass(frozen=True)
class Refused:
    status: int
    message: str


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass(frozen=True)
class EngineFacts:
    """What the router needs to check a request as the engine will (engine.request.new_request) and to answer
    with the engine's limits, without an engine of its own."""

    limits: object  # http.frontend.Limits
    config: object  # the engine's EngineConfig, as fitted to the checkpoint and the memory
    vocab_size: int
    slot_positions: int | None


class EngineReplica:
    """One engine behind a deployment handle (build_application makes it a Ray Serve deployment)."""

    def __init__(self, request: dict):
        import ray
        from ray import serve

        from assay.core.cli import quiet_libraries
        from assay.core.process import freeze_startup_heap
        from assay.serve.engine.loop import EngineLoop
        from assay.serve.http.frontend import Limits
        from assay.serve.http.metrics import ServerMetrics
        from assay.serve.launch import load_engine
        from assay.serve.ray import metrics_board
        from assay.serve.settings import ServeRequest, engine_config

        quiet_libraries()
        serve_request = ServeRequest(**request)
        # Ray hands the replica its device (CUDA_VISIBLE_DEVICES etc.), so "cuda" is this replica's own GPU.
        engine = load_engine(serve_request, engine_config(serve_request))
        engine.warm_up()
        freeze_startup_heap()  # as assay serve does (launch.py): no full collection over the compiled model's objects
        limits = Limits.of(engine, engine.tokenizer)
        self._facts = EngineFacts(limits, engine.config, engine.vocab_size, limits.slot_positions)
        self._loop = EngineLoop(engine)
        self._loop.start()
        # The HTTP outcomes are counted at the router; an engine replica's metrics are its engine's.
        metrics = ServerMetrics(engine)
        self._replica_id = str(serve.get_replica_context().replica_id.unique_id)
        self._actor_id = ray.get_runtime_context().get_actor_id()
        self._reporter = metrics_board.start_reporter(ray, metrics_board.board(ray), self._replica_id, metrics.snapshot)

    def __del__(self):
        reporter = getattr(self, "_reporter", None)
        if reporter is not None:
            reporter.set()
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.stop(timeout=5)

    def facts(self) -> EngineFacts:
        return self._facts

    def pid(self) -> int:
        return os.getpid()

    async def generate(self, request_id: str, prompt_tokens: list[int], params) -> AsyncIterator[object]:
        """Accepted (or Refused), then lists of TokenEvents until every choice finished (or Failed)."""
        from assay.serve.engine.config import QueueFull
        from assay.serve.engine.loop import EngineFailed
        from assay.serve.engine.request import choice_ids

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def listener(item) -> None:  # on the engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the replica's event loop has closed: nobody is listening
                pass

        ids = choice_ids(request_id, params.n)
        try:
            self._loop.submit(request_id, listener, prompt_tokens, params)
        except QueueFull as exc:
            yield Refused(429, str(exc))
            return
        except AssayError as exc:
            yield Refused(400, str(exc))
            return
        except EngineFailed as exc:
            yield Failed(str(exc))
            return
        open_ids = set(ids)
        try:
            yield Accepted(self._replica_id, self._actor_id)
            while open_ids:
                items = [await queue.get()]
                while not queue.empty():  # one message per burst of events, not one per token
                    items.append(queue.get_nowait())
                failure = next((item for item in items if isinstance(item, EngineFailed)), None)
                if failure is not None:
                    open_ids.clear()
                    yield Failed(str(failure))
                    return
                open_ids.difference_update(event.request_id for event in items if event.finished)
                yield items
        finally:
            for choice_id in open_ids:  # cancelled (or closed) before every choice finished
                self._loop.abort(choice_id)

    def check_health(self) -> None:
        # Ray Serve calls this periodically; a replica whose engine thread died is restarted.
        if not self._loop.alive:
            raise RuntimeError("the engine thread is not running")
