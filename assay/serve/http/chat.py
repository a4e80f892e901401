"""POST /v1/chat/completions: the prompt is the model's own chat template over the messages
(apply_chat_template(..., add_generation_prompt=True), rendered to text and tokenised without adding
special tokens again, as vLLM does); the answer is the assistant's message, streamed as deltas or whole.

A model whose tokenizer has no chat template gets a 400 that says so (its /v1/completions still works).
"""

from __future__ import annotations

from typing import AsyncIterator

from starlette.requests import Request

from assay.serve.http.frontend import Frontend
from assay.serve.http.generation import Generation, Piece
from assay.serve.http.protocol import ChatCompletionRequest, RequestError, parse_chat
from assay.serve.http.responses import chat_body, chat_choice, chat_delta, chat_logprobs, usage


def chat_prompt(frontend: Frontend, body: ChatCompletionRequest) -> list[int]:
    """The token ids of the chat template over the messages, with the assistant's turn opened."""
    tokenizer = frontend.tokenizer
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    # The template only adds to the text: contents over the character limit are refused before rendering.
    frontend.check_chars(sum(len(m["content"]) for m in messages), "messages")
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(400, f"the model {frontend.model_name!r} has no chat template (no chat_template in its tokenizer files): "
                                "use /v1/completions with a prompt", "messages")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # the template's own refusal (e.g. raise_exception("roles must alternate"))
        raise RequestError(400, f"the model's chat template refused the messages: {exc}", "messages") from None
    return frontend.tokenize(text, add_special_tokens=False)


async def handle(frontend: Frontend, raw: bytes, request: Request):
    body = parse_chat(raw)
    frontend.check_model(body.model)
    frontend.check_choices(1, body.n)
    prompt = chat_prompt(frontend, body)
    max_tokens = body.token_budget() or frontend.room(len(prompt))
    top = (body.top_logprobs or 0) if body.logprobs else None
    generation = frontend.generation([prompt], "chatcmpl")
    generation.submit(frontend.sampling_params(body, max_tokens=max_tokens, logprobs=top))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(frontend, generation, body, request, include_usage)
    return await _collect(frontend, generation, body, request)


def _logprobs(frontend: Frontend, body: ChatCompletionRequest, entries) -> dict | None:
    return chat_logprobs(entries, frontend.token_text, body.top_logprobs or 0) if body.logprobs else None


def _body(frontend: Frontend, generation: Generation, choices: list[dict], with_usage: bool = False, chunk: bool = False) -> dict:
    used = usage(generation.prompt_tokens, generation.completion_tokens) if with_usage else None
    return chat_body(generation.request_id, generation.created, frontend.model_name, choices, used, chunk=chunk)


async def _collect(frontend: Frontend, generation: Generation, body: ChatCompletionRequest, request: Request):
    texts = await frontend.collect(generation, request)
    if not isinstance(texts, dict):
        return texts
    choices = [chat_choice(c.index, texts[c.index], c.finish_reason, _logprobs(frontend, body, c.logprobs)) for c in generation.choices]
    return _body(frontend, generation, choices, with_usage=True)


def _stream(frontend: Frontend, generation: Generation, body: ChatCompletionRequest, request: Request, include_usage: bool):
    def chunk(piece: Piece) -> dict:
        finish = piece.choice.finish_reason if piece.finished else None
        delta = {"content": piece.text} if piece.text or not piece.finished else {}
        return _body(frontend, generation, [chat_delta(piece.choice.index, delta, finish, _logprobs(frontend, body, piece.logprobs))], chunk=True)

    async def bodies() -> AsyncIterator[dict]:
        # OpenAI's first chunk of each choice names the role; the content follows in deltas.
        for choice in generation.choices:
            yield _body(frontend, generation, [chat_delta(choice.index, {"role": "assistant", "content": ""})], chunk=True)
        async for piece in generation.pieces(request):
            yield chunk(piece)
        if include_usage and not generation.client_gone:
            yield _body(frontend, generation, [], with_usage=True, chunk=True)

    return frontend.stream(generation, bodies())
