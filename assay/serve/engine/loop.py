"""The engine thread: it alone calls engine.step(), in a loop, sleeping on an event while nothing is
unfinished, and routes each TokenEvent to the listener of its request.

The HTTP side hands requests over with submit / abort (engine.add_request and engine.abort are
thread-safe) and gets tokens back through its listener, which it calls on this thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from assay.core.openmp import release_openmp_workers
from assay.serve.engine.config import TokenEvent
from assay.serve.engine.engine import Engine
from assay.serve.engine.request import choice_ids
from assay.serve.engine.sampling import SamplingParams

log = logging.getLogger("assay.serve")


class EngineFailed(RuntimeError):
    """engine.step() raised: a bug, not bad input. Every open request gets a 500; /health turns 503.
    A subclass may answer with another status (e.g. 503, with a Retry-After, when no engine is reachable)."""

    status: int = 500


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
        """Start stepping on the engine thread. Call it on the thread that loaded and warmed up the engine: its
        OpenMP workers are released first, so the engine thread's are the only ones (core/openmp.py: with two
        teams on a 2-core machine, libgomp stops spinning and a decode step took 1.7x as long)."""
        if self._thread is None:
            release_openmp_workers()
            self._thread = threading.Thread(target=self._run, name="assay-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request_id: str, listener: Callable, prompt_tokens: list[int], params: SamplingParams) -> None:
        """Register the listener for each of the request's choices (n), then add the request (AssayError /
        QueueFull propagate, nothing stays registered)."""
        if not self.alive:
            raise EngineFailed("the engine is not running")
        ids = choice_ids(request_id, params.n)
        with self._lock:
            for choice_id in ids:
                self._listeners[choice_id] = listener
        try:
            self.engine.add_request(request_id, prompt_tokens, params=params)
        except BaseException:
            for choice_id in ids:
                self.forget(choice_id)
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
