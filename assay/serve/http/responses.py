"""The response bodies of both routes, streamed or not, and their log-probability formats.

completions: OpenAI's legacy shape, {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, one entry
per token of the choice's text (with echo, the prompt's tokens first; the first prompt token has no
log-probability: null). top_logprobs maps each alternative's text to its log-probability and includes the
chosen token, so an entry has k or k + 1 keys (as vLLM and OpenAI's legacy API).
chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]},
the top_logprobs most likely tokens at each position.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the door's middleware imports this module without torch
    from assay.serve.engine.sampling import TokenLogprob

SSE_DONE = "data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def sse(body: dict) -> str:
    """One server-sent event carrying a JSON body."""
    return f"data: {json.dumps(body)}\n\n"


class TokenText:
    """The text of single tokens, as the logprobs formats show them (cached: a vocabulary is small)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text


def legacy_logprobs(entries: list[TokenLogprob], token_text: TokenText, text_offset: int = 0) -> dict:
    """OpenAI's completions logprobs for consecutive tokens whose text starts at text_offset."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for entry in entries:
        text = token_text(entry.token_id)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        if entry.logprob is None:
            top_logprobs.append(None)
        else:
            alternatives = {token_text(token_id): logprob for token_id, logprob in entry.top}
            alternatives[text] = entry.logprob  # the chosen token always has its entry
            top_logprobs.append(alternatives)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def _chat_token(token_text: TokenText, token_id: int, logprob: float) -> dict:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText, top: int) -> dict:
    return {"content": [
        _chat_token(token_text, e.token_id, e.logprob) | {"top_logprobs": [_chat_token(token_text, t, lp) for t, lp in e.top[:top]]}
        for e in entries
    ]}


def completion_body(request_id: str, created: int, model: str, choices: list[dict], usage_: dict | None = None) -> dict:
    """A text_completion object: the whole answer, one streamed chunk, or (no choices) the usage-only last chunk."""
    body = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_body(request_id: str, created: int, model: str, choices: list[dict], usage_: dict | None = None, chunk: bool = False) -> dict:
    body = {"id": request_id, "object": "chat.completion.chunk" if chunk else "chat.completion", "created": created,
            "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def chat_choice(index: int, message: dict, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    """message: {"role": "assistant", "content": ..., "tool_calls": [...] when the answer made calls}."""
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_delta(index: int, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
