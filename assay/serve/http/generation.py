"""One HTTP request's generation, shared by /v1/completions and /v1/chat/completions: its prompts, each
submitted to the engine with n choices, the tokens of every choice arriving on one asyncio.Queue (put there
from the engine thread with call_soon_threadsafe), stop strings, disconnects, and settling once.

A batch of P prompts with n choices each is P engine requests; the engine prefills each prompt once and
copies its state into n slots. Choice j of prompt i has OpenAI's index i * n + j.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Protocol

from starlette.requests import Request

from assay.core.errors import AssayError
from assay.serve.http.detokenize import IncrementalText
from assay.serve.engine.config import QueueFull
from assay.serve.engine.request import choice_ids
from assay.serve.engine.loop import EngineFailed
from assay.serve.http.metrics import ServerMetrics
from assay.serve.http.protocol import RequestError
from assay.serve.engine.sampling import SamplingParams, TokenLogprob

# Put on a request's queue by its disconnect watcher: the client has gone.
CLIENT_GONE = object()


@dataclass
class Choice:
    index: int  # OpenAI's: prompt_index * n + j
    prompt_index: int
    engine_id: str
    text: IncrementalText
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, when asked for
    prompt_logprobs: list[TokenLogprob] | None = None  # echo: one per prompt token (the first without a value)
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"; None while it runs
    counted: bool = False


@dataclass
class Piece:
    """What one engine event adds to a choice: its text, its tokens' log-probabilities, whether it ended."""

    choice: Choice
    text: str
    logprobs: list[TokenLogprob]
    finished: bool
    first: bool  # the choice's first piece (with echo, the prompt's log-probabilities arrive with it)


_ids = itertools.count()


class TokenSource(Protocol):
    """What generates the tokens of the engine requests a Generation submits: the local engine thread
    (engine.loop.EngineLoop), or, under Ray Serve, engine replicas reached through deployment handles.
    The listener gets each TokenEvent, or an EngineFailed that ends every choice of the request."""

    @property
    def alive(self) -> bool: ...

    def submit(self, request_id: str, listener: Callable, prompt_tokens: list[int], params: SamplingParams) -> None:
        """Start the request; AssayError (bad input), QueueFull or EngineFailed refuse it before anything runs."""

    def abort(self, request_id: str) -> None:
        """Stop one choice (an id of choice_ids); its listener hears nothing more of it that matters."""


async def watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to go (the body is read already, so receive() only ever reports a disconnect).

    A task of its own rather than request.is_disconnected() polls: those cancel-scope polls can deliver
    a stray cancellation into the awaiting handler under anyio on asyncio.
    """
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait(CLIENT_GONE)
            return


class Generation:
    """Submit the prompts, then hand out Pieces until every choice finished; settle() once, however it ends."""

    def __init__(self, engine_loop: TokenSource, metrics: ServerMetrics, tokenizer, prompts: list[list[int]], prefix: str):
        self.engine_loop = engine_loop
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.request_id = f"{prefix}-{uuid.uuid4().hex[:24]}-{next(_ids)}"
        self.created = int(time.time())
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[Choice] = []
        self._by_engine_id: dict[str, Choice] = {}
        self.settled = False
        self.client_gone = False
        self._watcher: asyncio.Task | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.choices)

    def submit(self, params: SamplingParams) -> None:
        """Every prompt into the engine, or none: a refusal (RequestError 400/429/503) withdraws what went in."""
        loop = asyncio.get_running_loop()
        queue = self.queue

        def listener(item) -> None:  # runs on the engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop has closed (server shutting down): nobody is listening
                pass

        submitted: list[str] = []
        try:
            for i, prompt in enumerate(self.prompts):
                engine_id = f"{self.request_id}-{i}"
                for j, choice_id in enumerate(choice_ids(engine_id, params.n)):
                    choice = Choice(i * params.n + j, i, choice_id, IncrementalText(self.tokenizer, list(params.stop), params.min_tokens))
                    self.choices.append(choice)
                    self._by_engine_id[choice_id] = choice
                self.engine_loop.submit(engine_id, listener, prompt, params)
                submitted.append(engine_id)
        except (QueueFull, AssayError, EngineFailed) as exc:
            for choice in self.choices:  # withdrawn before any token reached the client: not counted as aborts
                choice.counted = True
                self.engine_loop.abort(choice.engine_id)
            self.settled = True
            if isinstance(exc, QueueFull):
                raise RequestError(429, str(exc)) from None
            if isinstance(exc, EngineFailed):
                raise RequestError(503, str(exc)) from None
            where = f"prompt {len(submitted)}: " if len(self.prompts) > 1 else ""
            raise RequestError(400, f"{where}{exc}") from None

    async def pieces(self, request: Request) -> AsyncIterator[Piece]:
        """Every Piece until each choice finished, or until the client goes (client_gone). Raises EngineFailed.

        Starlette also cancels a stream on disconnect (ASGI < 2.4) or fails its next write (2.4); the
        watcher catches a client that leaves while its request is still queued and no token is written.
        """
        if self._watcher is None:
            self._watcher = asyncio.create_task(watch_disconnect(request, self.queue))
        while self.unfinished():
            piece = await self.next_piece()
            if piece is None:
                return
            yield piece

    async def texts(self, request: Request) -> dict[int, str] | None:
        """Each choice's whole text by index; None when the client left. Settles the request. Raises EngineFailed."""
        texts: dict[int, list[str]] = {c.index: [] for c in self.choices}
        try:
            async for piece in self.pieces(request):
                texts[piece.choice.index].append(piece.text)
        finally:
            self.settle()
        return None if self.client_gone else {index: "".join(parts) for index, parts in texts.items()}

    def unfinished(self) -> bool:
        return any(c.finish_reason is None for c in self.choices)

    async def next_piece(self) -> Piece | None:
        """The next Piece of any choice; None when the client has gone. Raises EngineFailed."""
        while True:
            item = await self.queue.get()
            if item is CLIENT_GONE:
                self.client_gone = True
                return None
            if isinstance(item, EngineFailed):
                for choice in self.choices:
                    if choice.finish_reason is None:
                        choice.finish_reason = "error"
                self.metrics.count("error")
                raise item
            choice = self._by_engine_id.get(item.request_id)
            if choice is None or choice.finish_reason is not None:
                continue  # a late event of a choice already ended by a stop string
            first = not choice.tokens and choice.finish_reason is None
            if item.prompt_logprobs is not None:
                choice.prompt_logprobs = list(item.prompt_logprobs)
            if item.finished and item.finish_reason == "abort":
                choice.finish_reason = "abort"
                return Piece(choice, choice.text.flush(), [], True, first)
            choice.tokens.append(item.token_id)
            new_logprobs = [item.logprob] if item.logprob is not None else []
            choice.logprobs += new_logprobs
            delta, stopped = choice.text.add(item.token_id)
            if stopped:
                # A stop string ended the text before the engine did: free the slot now, answer "stop".
                self.engine_loop.abort(choice.engine_id)
                choice.finish_reason = "stop"
                return Piece(choice, delta, new_logprobs, True, first)
            if item.finished:
                choice.finish_reason = item.finish_reason
                return Piece(choice, delta + choice.text.flush(), new_logprobs, True, first)
            return Piece(choice, delta, new_logprobs, False, first)

    def settle(self) -> None:
        """Abort what still runs (the client left, or the server failed) and count each choice once."""
        if self._watcher is not None:
            self._watcher.cancel()
        if self.settled:
            return
        self.settled = True
        for choice in self.choices:
            if choice.finish_reason is None:
                self.engine_loop.abort(choice.engine_id)
                choice.finish_reason = "abort"
            if not choice.counted and choice.finish_reason != "error":  # errors were counted where they happened
                self.metrics.count(choice.finish_reason)
            choice.counted = True
        self.metrics.count_prompt_tokens(self.prompt_tokens)
