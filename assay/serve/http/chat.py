"""POST /v1/chat/completions: the prompt is the model's own chat template over the messages
(apply_chat_template(..., add_generation_prompt=True), rendered to text and tokenised without adding
special tokens again, as vLLM does); the answer is the assistant's message, streamed as deltas or whole.

Tools are shown to the template (or, for a template without tool support, described in the system message:
assay.serve.guided.chat), and the answer's <tool_call> blocks come back as OpenAI's tool_calls
(structured.py). A model whose tokenizer has no chat template gets a 400 that says so (its /v1/completions
still works).
"""

from __future__ import annotations

from typing import AsyncIterator

from starlette.requests import Request

from assay.core.errors import AssayError
from assay.serve.guided import FunctionTool, render_chat
from assay.serve.http.frontend import Frontend
from assay.serve.http.generation import Generation, Piece
from assay.serve.http.protocol import ChatCompletionRequest, RequestError, parse_chat
from assay.serve.http.responses import chat_body, chat_choice, chat_delta, chat_logprobs, usage
from assay.serve.http.structured import OutputPlan, output_plan


def chat_prompt(frontend: Frontend, body: ChatCompletionRequest, tools: list[FunctionTool] | None = None) -> list[int]:
    """The token ids of the chat template over the messages (and tools), with the assistant's turn opened."""
    tokenizer = frontend.tokenizer
    messages = [m.template_message() for m in body.messages]
    # The template only adds to the text: contents over the character limit are refused before rendering.
    frontend.check_chars(sum(len(m["content"]) + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls", ()))
                             for m in messages), "messages")
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(400, f"the model {frontend.model_name!r} has no chat template (no chat_template in its tokenizer files): "
                                "use /v1/completions with a prompt", "messages")
    try:
        text = render_chat(tokenizer, messages, tools)
    except AssayError as exc:  # the template's own refusal (e.g. raise_exception("roles must alternate"))
        raise RequestError(400, str(exc), "messages") from None
    return frontend.tokenize(text, add_special_tokens=False)


async def handle(frontend: Frontend, raw: bytes, request: Request):
    body = parse_chat(raw)
    frontend.check_model(body.model)
    frontend.check_choices(1, body.n)
    plan = output_plan(frontend.grammars, body)
    prompt = chat_prompt(frontend, body, plan.tools)
    max_tokens = body.token_budget() or frontend.room(len(prompt))
    top = (body.top_logprobs or 0) if body.logprobs else None
    generation = frontend.generation([prompt], "chatcmpl")
    generation.submit(frontend.sampling_params(body, max_tokens=max_tokens, logprobs=top, grammar=plan.grammar))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(frontend, generation, body, plan, request, include_usage)
    return await _collect(frontend, generation, body, plan, request)


def _logprobs(frontend: Frontend, body: ChatCompletionRequest, entries) -> dict | None:
    return chat_logprobs(entries, frontend.token_text, body.top_logprobs or 0) if body.logprobs else None


def _body(frontend: Frontend, generation: Generation, choices: list[dict], with_usage: bool = False, chunk: bool = False) -> dict:
    used = usage(generation.prompt_tokens, generation.completion_tokens) if with_usage else None
    return chat_body(generation.request_id, generation.created, frontend.model_name, choices, used, chunk=chunk)


async def _collect(frontend: Frontend, generation: Generation, body: ChatCompletionRequest, plan: OutputPlan, request: Request):
    texts = await frontend.collect(generation, request)
    if not isinstance(texts, dict):
        return texts
    choices = []
    for c in generation.choices:
        message, finish_reason = plan.message(texts[c.index], c.finish_reason)
        choices.append(chat_choice(c.index, message, finish_reason, _logprobs(frontend, body, c.logprobs)))
    return _body(frontend, generation, choices, with_usage=True)


def _stream(frontend: Frontend, generation: Generation, body: ChatCompletionRequest, plan: OutputPlan, request: Request,
            include_usage: bool):
    messages = {choice.index: plan.stream() for choice in generation.choices}

    def chunks(piece: Piece) -> list[dict]:
        """One chunk per delta (a call's head and its first arguments are two); the piece's log-probabilities
        ride on the first, the finish reason on the last."""
        message = messages[piece.choice.index]
        deltas = message.deltas(piece.text, piece.finished)
        if not deltas and not piece.finished:
            deltas = [{"content": ""}] if piece.logprobs else []  # text held back (a partial tag): nothing to send yet
        if not deltas:
            deltas = [{}] if piece.finished else []
        finish = message.finish_reason(piece.choice.finish_reason) if piece.finished else None
        logprobs = _logprobs(frontend, body, piece.logprobs)
        return [_body(frontend, generation, [chat_delta(piece.choice.index, delta, finish if i == len(deltas) - 1 else None,
                                                        logprobs if i == 0 else None)], chunk=True)
                for i, delta in enumerate(deltas)]

    async def bodies() -> AsyncIterator[dict]:
        # OpenAI's first chunk of each choice names the role; the content follows in deltas.
        for choice in generation.choices:
            yield _body(frontend, generation, [chat_delta(choice.index, {"role": "assistant", "content": ""})], chunk=True)
        async for piece in generation.pieces(request):
            for chunk in chunks(piece):
                yield chunk
        if include_usage and not generation.client_gone:
            yield _body(frontend, generation, [], with_usage=True, chunk=True)

    return frontend.stream(generation, bodies())
