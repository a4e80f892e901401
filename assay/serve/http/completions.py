"""POST /v1/completions: OpenAI's completions, with a batch of prompts, n choices each, echo and logprobs, and
response_format (each choice's text is JSON of the schema, as on the chat route).

With echo, a choice's text starts with its prompt's text and, with logprobs, its log-probabilities start
with the prompt's tokens (the first one null): what lm-evaluation-harness's local-completions sends for
every log-likelihood (max_tokens 1, echo, logprobs 1) and reads back as token_logprobs[context:-1].
"""

from __future__ import annotations

from typing import AsyncIterator

from starlette.requests import Request

from assay.serve.http.frontend import Frontend
from assay.serve.http.generation import Choice, Generation, Piece
from assay.serve.http.protocol import CompletionRequest, completion_prompts, parse_completion
from assay.serve.http.responses import completion_body, completion_choice, legacy_logprobs, usage
from assay.serve.http.structured import response_grammar


def _prompt_tokens(frontend: Frontend, body: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) of every prompt; text prompts are checked in characters before they are tokenised."""
    prompts = completion_prompts(body.prompt)
    frontend.check_choices(len(prompts), body.n)
    frontend.check_chars(sum(len(p) for p in prompts if isinstance(p, str)), "prompt" if len(prompts) == 1 else "prompt batch")
    ids = [frontend.tokenize(p) if isinstance(p, str) else frontend.check_length(p) for p in prompts]
    texts = [p if isinstance(p, str) else frontend.tokenizer.decode(p) for p in prompts] if body.echo else ["" for _ in prompts]
    return ids, texts


async def handle(frontend: Frontend, raw: bytes, request: Request):
    body = parse_completion(raw)
    frontend.check_model(body.model)
    prompts, echo_texts = _prompt_tokens(frontend, body)
    params = frontend.sampling_params(body, prompt_logprobs=body.logprobs if body.echo and body.logprobs is not None else None,
                                      grammar=response_grammar(frontend.grammars, body.response_format))
    generation = frontend.generation(prompts, "cmpl")
    generation.submit(params)
    view = _View(frontend, generation, body, echo_texts)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return frontend.stream(generation, view.chunks(request, include_usage))
    return await _collect(view, request)


class _View:
    """How the choices of a completions request read: text and log-probabilities, whole or piece by piece."""

    def __init__(self, frontend: Frontend, generation: Generation, body: CompletionRequest, echo_texts: list[str]):
        self.frontend, self.generation, self.body, self.echo_texts = frontend, generation, body, echo_texts
        self.offsets: dict[int, int] = {}  # per choice: characters of text already covered by text_offset

    def logprobs(self, choice: Choice, entries) -> dict | None:
        if self.body.logprobs is None:
            return None
        start = self.offsets.get(choice.index, 0)
        result = legacy_logprobs(entries, self.frontend.token_text, start)
        self.offsets[choice.index] = start + sum(len(t) for t in result["tokens"])
        return result

    def echo(self, choice: Choice) -> tuple[str, list]:
        """The prompt's text and log-probability entries that open a choice (nothing without echo)."""
        if not self.body.echo:
            return "", []
        return self.echo_texts[choice.prompt_index], list(choice.prompt_logprobs or [])

    def body_of(self, choices: list[dict], with_usage: bool = False) -> dict:
        generation = self.generation
        used = usage(generation.prompt_tokens, generation.completion_tokens) if with_usage else None
        return completion_body(generation.request_id, generation.created, self.frontend.model_name, choices, used)

    def chunk(self, piece: Piece) -> dict:
        text, entries = (self.echo(piece.choice) if piece.first else ("", []))
        finish = piece.choice.finish_reason if piece.finished else None
        logprobs = self.logprobs(piece.choice, entries + piece.logprobs)
        return self.body_of([completion_choice(piece.choice.index, text + piece.text, finish, logprobs)])

    async def chunks(self, request: Request, include_usage: bool) -> AsyncIterator[dict]:
        """One chunk per Piece, then (every choice finished, the client still there) the usage-only chunk."""
        async for piece in self.generation.pieces(request):
            yield self.chunk(piece)
        if include_usage and not self.generation.client_gone:
            yield self.body_of([], with_usage=True)


async def _collect(view: _View, request: Request):
    texts = await view.frontend.collect(view.generation, request)
    if not isinstance(texts, dict):
        return texts
    choices = []
    for choice in view.generation.choices:
        echo_text, echo_entries = view.echo(choice)
        logprobs = view.logprobs(choice, echo_entries + choice.logprobs)
        choices.append(completion_choice(choice.index, echo_text + texts[choice.index], choice.finish_reason, logprobs))
    return view.body_of(choices, with_usage=True)
