"""The router's TokenSource: each engine request streamed from an engine replica through a Ray Serve
deployment handle (handle.options(stream=True)), and run again on a live replica, once, when its replica dies.

An answer is a function of the prompt, the SamplingParams and the seed, so a request run again gives the
same tokens: the events of tokens the client already has are skipped, and the request goes on as one
unbroken stream. A sampled request that names no seed is given one here, before it first runs, so a rerun
draws the same tokens. Greedy and seeded requests are exact wherever the engine's tokens do not depend on
what else shares its batch (--eager; a compiled decode at another width may differ in the last bits).
Each regenerated token is checked against the one already sent: a divergence ends the request with an
error rather than splicing two different answers.

Failures the client sees: no live replica (before or after a loss) -> EngineFailed with status 503 (a 503
with Retry-After, or in a stream an error event); a second loss of the same request -> the same.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from assay.serve.engine.config import QueueFull, TokenEvent
from assay.serve.engine.loop import EngineFailed
from assay.serve.engine.request import choice_ids, new_request
from assay.serve.engine.sampling import SamplingParams
from assay.serve.ray import exchange as exchanges
from assay.serve.ray.engine_replica import Accepted, EngineFacts, Failed, Refused
from assay.serve.ray.watch import ReplicaWatch

# Runs of one request after its first: a request whose replica dies is run once more, not again and again.
MAX_RERUNS = 1
# Waiting for a replica to accept a request: checked every ACCEPT_POLL_S (no live replica: give up at
# once), never longer than ACCEPT_LIMIT_S.
ACCEPT_POLL_S = 0.5
ACCEPT_LIMIT_S = 120.0

log = logging.getLogger("assay.serve")


class ReplicasUnavailable(EngineFailed):
    """No engine replica could run the request: a 503 with Retry-After (Ray Serve is restarting one)."""

    status = 503


class RemoteFailure(EngineFailed):
    """An engine replica refused or failed the request after it was handed over (its status: 429, 400, 500)."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


@dataclass
class _Run:
    """One engine request (a prompt with its n choices) and what its listener has been given so far."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    listener: Callable
    exchange: exchanges.Exchange | None
    open: set[str]  # choices neither finished nor aborted
    sent: dict[str, list[int]] = field(default_factory=dict)  # per choice: the token ids its listener has
    task: asyncio.Task | None = None

    def deliver(self, event: TokenEvent) -> None:
        """Forward an event the listener has not had; a regenerated one must carry the token it had."""
        if event.request_id not in self.open:
            return
        tokens = self.sent.setdefault(event.request_id, [])
        if event.index < len(tokens):
            if event.token_id != tokens[event.index] and event.token_id >= 0:
                raise RemoteFailure(f"the request was run again after its replica was lost, and token {event.index} "
                                    "differed from the one already sent", 500)
            return
        tokens.append(event.token_id)
        if event.finished:
            self.open.discard(event.request_id)
        self.listener(event)


class RemoteEngine:
    def __init__(self, handle, facts: EngineFacts, watch: ReplicaWatch, on_rerun: Callable[[bool], None] = lambda sent: None,
                 on_replica: Callable[[str, int], None] = lambda replica, count: None):
        self.handle = handle.options(stream=True)
        self.facts = facts
        self.watch = watch
        self.on_rerun = on_rerun  # called with whether tokens had already been sent
        self.on_replica = on_replica  # (replica id, its requests now): one was accepted there, or ended there
        self.runs: dict[str, _Run] = {}  # choice id -> its run
        self.active = 0
        self.running_on: dict[str, int] = {}  # replica id -> engine requests accepted there and not yet ended

    @property
    def alive(self) -> bool:
        return self.watch.live > 0

    def submit(self, request_id: str, listener: Callable, prompt_tokens: list[int], params: SamplingParams) -> None:
        live = self.watch.live
        if live == 0:
            raise ReplicasUnavailable("no engine replica is running (Ray Serve is starting one): retry shortly")
        config = self.facts.config
        if self.active >= live * (config.max_seqs + config.max_waiting):
            raise QueueFull(f"every engine replica's queue is full ({live} x {config.max_waiting} requests waiting); retry later")
        # The engine's own checks at intake (AssayError), here, so a bad request is a 400 before anything runs.
        new_request(config, self.facts.vocab_size, self.facts.slot_positions, request_id, prompt_tokens, params)
        if not params.greedy and params.seed is None:
            params = replace(params, seed=random.getrandbits(63))  # so a rerun draws what the first run drew
        ids = choice_ids(request_id, params.n)
        run = _Run(request_id, list(prompt_tokens), params, listener, exchanges.current(), set(ids))
        if run.exchange is not None:
            run.exchange.dispatched += 1
        for choice_id in ids:
            self.runs[choice_id] = run
        run.task = asyncio.get_running_loop().create_task(self._drive(run))

    def abort(self, request_id: str) -> None:
        """Stop one choice; the engine request is cancelled (its slots freed) once none of its choices is open."""
        run = self.runs.pop(request_id, None)
        if run is None:
            return
        run.open.discard(request_id)
        if not run.open and run.task is not None:
            run.task.cancel()

    async def _drive(self, run: _Run) -> None:
        self.active += 1
        try:
            reruns = 0
            while True:
                lost = await self._attempt(run)
                if lost is not None:
                    self.watch.lost(lost)
                if lost is None or not run.open:  # ended, or lost after its last token
                    return
                if reruns >= MAX_RERUNS or self.watch.live == 0:
                    raise ReplicasUnavailable("the engine replica running this request was lost"
                                              + (" and no other is running" if self.watch.live == 0 else ", and so was the one it was run again on")
                                              + ": retry shortly")
                reruns += 1
                self.on_rerun(any(run.sent.values()))
                if run.exchange is not None:
                    run.exchange.reruns += 1
                log.warning("request %s: its engine replica was lost; running it again", run.request_id)
        except asyncio.CancelledError:
            pass  # aborted: the stream was cancelled, the replica aborts it in its engine
        except EngineFailed as exc:
            self._fail(run, exc)
        except Exception as exc:  # anything else Ray or a replica raised: a 500, not a hang
            log.exception("request %s failed", run.request_id)
            self._fail(run, RemoteFailure(f"the engine replica failed: {type(exc).__name__}: {exc}"))
        finally:
            self.active -= 1
            for choice_id in choice_ids(run.request_id, run.params.n):
                if self.runs.get(choice_id) is run:
                    del self.runs[choice_id]
            if run.exchange is not None:
                run.exchange.ended()

    def _fail(self, run: _Run, exc: EngineFailed) -> None:
        if run.open:
            run.open.clear()
            run.listener(exc)

    async def _attempt(self, run: _Run) -> str | None:
        """One run on whichever replica Ray picks: None once it ended, or the actor id of the replica lost under it."""
        from ray.exceptions import RayActorError

        stream = self.handle.generate.remote(run.request_id, run.prompt, run.params)
        actor_id, replica, ended = None, None, False
        try:
            message = await self._first(stream)
            if isinstance(message, Refused):
                raise RemoteFailure(message.message, message.status)
            if isinstance(message, Failed):
                raise RemoteFailure(message.message)
            actor_id, replica = message.actor_id, message.replica
            self._count(replica, 1)
            if run.exchange is not None:
                run.exchange.accepted(message.replica)
            async for message in stream:
                if isinstance(message, Failed):
                    raise RemoteFailure(message.message)
                for event in message:
                    run.deliver(event)
            ended = True
            return None
        except RayActorError as exc:
            return getattr(exc, "actor_id", None) or actor_id or "unknown"
        finally:
            if replica is not None:
                self._count(replica, -1)
            if not ended:
                stream.cancel()  # aborted or failed: the replica (if it lives) aborts the request in its engine

    def _count(self, replica: str, change: int) -> None:
        count = self.running_on.get(replica, 0) + change
        if count:
            self.running_on[replica] = count
        else:
            self.running_on.pop(replica, None)
        self.on_replica(replica, count)

    async def _first(self, stream) -> Accepted | Refused | Failed:
        """The replica's first message, or ReplicasUnavailable once no replica is live (or ACCEPT_LIMIT_S passed)."""
        first = asyncio.ensure_future(stream.__anext__())
        deadline = time.monotonic() + ACCEPT_LIMIT_S
        try:
            while True:
                done, _ = await asyncio.wait({first}, timeout=ACCEPT_POLL_S)
                if done:
                    return first.result()
                if self.watch.live == 0 or time.monotonic() > deadline:
                    raise ReplicasUnavailable("no engine replica took the request (Ray Serve is starting one): retry shortly")
        finally:
            if not first.done():
                first.cancel()
