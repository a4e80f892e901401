"""What the HTTP routes share (`Frontend`): the engine loop, the tokenizer, the metrics, and the limits a
prompt is checked against before any work is spent on it; the streaming response that settles its
generation however it ends.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

from fastapi.responses import JSONResponse, StreamingResponse

from assay.core.errors import AssayError
from assay.serve.engine.engine import Engine
from assay.serve.engine.loop import EngineFailed, EngineLoop
from assay.serve.engine.sampling import SamplingParams
from assay.serve.guided import GrammarCompiler
from assay.serve.http.generation import Generation, TokenSource
from assay.serve.http.metrics import ServerMetrics
from assay.serve.http.protocol import RequestError
from assay.serve.http.responses import SSE_DONE, TokenText, error_body, sse

_ERROR_KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
                422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
_OUTCOME = {429: "rejected_queue_full", 500: "error", 503: "error"}  # any other refusal: rejected_invalid


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, from the engine's configuration."""

    max_prompt_tokens: int
    max_new_tokens: int
    slot_positions: int | None  # a KV-cache slot's positions (prompt + generated); None: a fixed state
    max_seqs: int
    max_waiting: int
    # The longest prompt in characters that could be within max_prompt_tokens: no token of the vocabulary
    # stands for more characters than its longest entry, so a longer text is refused without tokenising it.
    max_prompt_chars: int

    @classmethod
    def of(cls, engine: Engine, tokenizer) -> Limits:
        config = engine.config
        longest_token = max((len(token) for token in tokenizer.get_vocab()), default=1)
        return cls(config.max_prompt_tokens, config.max_new_tokens, config.slot_len() if engine.slot_model.uses_max_len() else None,
                   config.max_seqs, config.max_waiting, config.max_prompt_tokens * max(longest_token, 1))


def _eos_ids(tokenizer) -> tuple[int, ...]:
    """The tokenizer's end-of-text token and those of the checkpoint's generation_config.json (an Instruct
    model ends a turn with its own, e.g. <|im_end|>)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = Path(str(tokenizer.name_or_path)) / "generation_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return tuple(sorted(int(i) for i in ids))


def serving_failure(exc: EngineFailed, retry_after_s: int) -> JSONResponse:
    """The 500 of a request the engine failed, or the failure's own status (503: no engine reachable, with a
    Retry-After); counted as an error where the failure arrived."""
    headers = {"Retry-After": str(retry_after_s)} if exc.status in (429, 503) else None
    return JSONResponse(error_body(exc.status, str(exc), _ERROR_KINDS.get(exc.status, "server_error")), status_code=exc.status, headers=headers)


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


class Frontend:
    """What the routes share, and the checks every request passes before the engine sees it."""

    def __init__(self, engine_loop: TokenSource, tokenizer, limits: Limits, model_name: str, metrics: ServerMetrics, retry_after_s: int):
        self.engine_loop = engine_loop  # the local engine thread, or (Ray Serve) the engine replicas
        self.tokenizer = tokenizer
        self.token_text = TokenText(self.tokenizer)
        self.eos_ids = _eos_ids(self.tokenizer)
        self.model_name = model_name
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self.limits = limits
        # The grammar compiler indexes the vocabulary (seconds for a 49K-token one): built on a thread of its
        # own from the start, so start-up does not wait for it (a structured request that comes first does).
        self._grammars: Future[GrammarCompiler] = ThreadPoolExecutor(1, thread_name_prefix="assay-grammars").submit(
            GrammarCompiler, self.tokenizer, self.eos_ids)

    @classmethod
    def of_engine(cls, engine: Engine, engine_loop: EngineLoop, model_name: str, metrics: ServerMetrics, retry_after_s: int) -> Frontend:
        # The tokenizer loads now, not on the first request (and never from two threads at once).
        tokenizer = engine.tokenizer
        return cls(engine_loop, tokenizer, Limits.of(engine, tokenizer), model_name, metrics, retry_after_s)

    def grammars(self) -> GrammarCompiler:
        """The model's grammar compiler (structured outputs, forced tool calls); a 400 when it cannot have one."""
        try:
            return self._grammars.result()
        except AssayError as exc:
            raise RequestError(400, f"structured outputs and tool calls need the model's end-of-text token: {exc}",
                               "response_format") from None
        except Exception as exc:  # a tokenizer the grammar library cannot index: these requests only are refused
            raise RequestError(400, f"structured outputs and tool calls are not available for this model's tokenizer: "
                                    f"{type(exc).__name__}: {exc}", "response_format") from None

    def error(self, exc: RequestError) -> JSONResponse:
        self.metrics.count(_OUTCOME.get(exc.status, "rejected_invalid"))
        headers = {"Retry-After": str(self.retry_after_s)} if exc.status in (429, 503) else None
        kind = _ERROR_KINDS.get(exc.status, "invalid_request_error")
        return JSONResponse(error_body(exc.status, exc.message, kind, exc.param), status_code=exc.status, headers=headers)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise RequestError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}", "model")

    def check_choices(self, prompts: int, n: int) -> None:
        limits = self.limits
        if n > limits.max_seqs:
            raise RequestError(400, f"n is {n}; this server decodes at most {limits.max_seqs} sequences at once (--max-seqs)", "n")
        if prompts > max(limits.max_waiting, 1):
            raise RequestError(400, f"the request has {prompts} prompts; this server queues at most {limits.max_waiting} "
                                    "(--max-waiting): send fewer at a time", "prompt")

    def check_chars(self, chars: int, what: str = "prompt") -> None:
        """Before tokenising: a text longer than max_prompt_chars cannot fit in max_prompt_tokens."""
        if chars > self.limits.max_prompt_chars:
            raise RequestError(400, f"the {what} has {chars} characters, more than {self.limits.max_prompt_tokens} tokens can hold "
                                    f"(--max-prompt-tokens; at most {self.limits.max_prompt_chars} characters)", what.split()[0])

    def check_length(self, tokens: list[int]) -> list[int]:
        if len(tokens) > self.limits.max_prompt_tokens:
            raise RequestError(400, f"the prompt has {len(tokens)} tokens; this server accepts at most {self.limits.max_prompt_tokens}",
                               "prompt")
        return tokens

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.check_chars(len(text))
        try:
            return self.check_length(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except RequestError:
            raise
        except Exception as exc:  # a tokenizer that cannot encode the text is the caller's input, not a bug
            raise RequestError(400, f"the prompt could not be tokenized: {exc}", "prompt") from None

    def room(self, prompt_tokens: int) -> int:
        """max_tokens when a request gives none: what the server allows and the slot still holds."""
        room = self.limits.max_new_tokens
        if self.limits.slot_positions is not None:
            room = min(room, self.limits.slot_positions - prompt_tokens)
        if room < 1:
            raise RequestError(400, f"the prompt ({prompt_tokens} tokens) leaves no room to generate in a slot of "
                                    f"{self.limits.slot_positions} positions (--max-len)", "messages")
        return room

    def sampling_params(self, body, **derived) -> SamplingParams:
        """The request's SamplingParams, built once here: the stop strings, the stop token ids with the model's
        end-of-text ones (unless ignore_eos), then the body's fields (and what the route derives)."""
        eos = () if body.ignore_eos else self.eos_ids
        try:
            return body.sampling_params(stop=tuple(body.stop_strings()), stop_token_ids=tuple(body.stop_token_ids or ()) + eos, **derived)
        except AssayError as exc:  # what depends on two fields (min_tokens > max_tokens); each field's range is the schema's
            field = str(exc).split(" ", 1)[0]
            raise RequestError(400, str(exc), field if field in type(body).model_fields else None) from None

    def generation(self, prompts: list[list[int]], prefix: str) -> Generation:
        return Generation(self.engine_loop, self.metrics, self.tokenizer, prompts, prefix)

    def stream(self, generation: Generation, bodies: AsyncIterator[dict]) -> StreamingResponse:
        """Server-sent events: the route's bodies, then [DONE] once they end with every choice finished; an
        engine failure is an error event and [DONE]; a client gone, nothing more. Settles the generation."""

        async def events() -> AsyncIterator[str]:
            try:
                async for body in bodies:
                    yield sse(body)
            except EngineFailed as exc:
                yield sse(error_body(exc.status, str(exc), _ERROR_KINDS.get(exc.status, "server_error")))
                yield SSE_DONE
                return
            if not generation.client_gone:
                yield SSE_DONE

        return _ClosingStream(events(), on_close=generation.settle, media_type="text/event-stream",
                              headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def collect(self, generation: Generation, request) -> dict[int, str] | JSONResponse:
        """Each choice's whole text, or the response when there is none to give (client gone, engine failed)."""
        try:
            texts = await generation.texts(request)
        except EngineFailed as exc:
            return serving_failure(exc, self.retry_after_s)
        return JSONResponse({}, status_code=499) if texts is None else texts  # 499: nobody reads it
