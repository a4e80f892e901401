"""POST /v1/chat/completions: the prompt is the model's own chat template over the messages
(apply_chat_template(..., add_generation_prompt=True), rendered to text and tokenised without adding
special tokens again, as vLLM does); the answer is the assistant's message, streamed as deltas or whole.

A model whose tokenizer has no chat template gets a 400 that says so (its /v1/completions still works).
"""

from __future__ import annotations

from starlette.requests import Request

from assay.serve.http.frontend import Serving
from assay.serve.http.generation import Generation, Piece
from assay.serve.http.protocol import ChatCompletionRequest, RequestError, parse_chat
from assay.serve.http.responses import chat_body, chat_choice, chat_delta, chat_logprobs, usage


def chat_prompt(serving: Serving, body: ChatCompletionRequest) -> list[int]:
    """The token ids of the chat template over the messages, with the assistant's turn opened."""
    tokenizer = serving.tokenizer
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    # The template only adds to the text: contents over the character limit are refused before rendering.
    serving.check_chars(sum(len(m["content"]) for m in messages), "messages")
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(400, f"the model {serving.model_name!r} has no chat template (no chat_template in its tokenizer files): "
                                "use /v1/completions with a prompt", "messages")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # the template's own refusal (e.g. raise_exception("roles must alternate"))
        raise RequestError(400, f"the model's chat template refused the messages: {exc}", "messages") from None
    return serving.tokenize(text, add_special_tokens=False)


async def handle(serving: Serving, raw: bytes, request: Request):
    body = parse_chat(raw)
    serving.check_model(body.model)
    serving.check_choices(1, body.n)
    prompt = chat_prompt(serving, body)
    max_tokens = body.token_budget() or serving.room(len(prompt))
    top = (body.top_logprobs or 0) if body.logprobs else None
    generation = serving.generation([prompt], "chatcmpl")
    generation.submit(serving.sampling_params(body, max_tokens=max_tokens, logprobs=top))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(serving, generation, body, request, include_usage)
    return await _collect(serving, generation, body, request)


def _logprobs(serving: Serving, body: ChatCompletionRequest, entries) -> dict | None:
    return chat_logprobs(entries, serving.token_text, body.top_logprobs or 0) if body.logprobs else None


def _body(serving: Serving, generation: Generation, choices: list[dict], with_usage: bool = False, chunk: bool = False) -> dict:
    used = usage(generation.prompt_tokens, generation.completion_tokens) if with_usage else None
    return chat_body(generation.request_id, generation.created, serving.model_name, choices, used, chunk=chunk)


async def _collect(serving: Serving, generation: Generation, body: ChatCompletionRequest, request: Request):
    texts = await serving.collect(generation, request)
    if not isinstance(texts, dict):
        return texts
    choices = [chat_choice(c.index, texts[c.index], c.finish_reason, _logprobs(serving, body, c.logprobs)) for c in generation.choices]
    return _body(serving, generation, choices, with_usage=True)


def _stream(serving: Serving, generation: Generation, body: ChatCompletionRequest, request: Request, include_usage: bool):
    def chunk(piece: Piece) -> dict:
        finish = piece.choice.finish_reason if piece.finished else None
        delta = {"content": piece.text} if piece.text or not piece.finished else {}
        return _body(serving, generation, [chat_delta(piece.choice.index, delta, finish, _logprobs(serving, body, piece.logprobs))], chunk=True)

    # OpenAI's first chunk of each choice names the role; the content follows in deltas.
    opening = [_body(serving, generation, [chat_delta(c.index, {"role": "assistant", "content": ""})], chunk=True) for c in generation.choices]
    closing = (lambda: _body(serving, generation, [], with_usage=True, chunk=True)) if include_usage else None
    return serving.stream(generation, request, chunk, opening, closing)
