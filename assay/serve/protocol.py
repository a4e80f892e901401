"""The wire format of /v1/completions (OpenAI's, with vLLM's extensions and error shapes): the request
schema, the incremental detokenizer, and the one builder of response bodies, streamed or not.

vLLM is the reference: errors are {"error": {"message", "type", "param", "code"}}; a body of the wrong
shape or out-of-range fields is 422 with one readable line per problem, malformed JSON is 400.
"""

from __future__ import annotations

import json
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field

SSE_DONE = "data: [DONE]\n\n"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """The fields of OpenAI's /v1/completions this server honours; other fields are ignored."""

    # strict: "16" is not a number of tokens and 1.0 is not a token id; a client that sends them has a bug.
    model_config = ConfigDict(extra="ignore", strict=True)
    model: Optional[str] = None
    prompt: Union[str, list[int]]
    max_tokens: int = Field(16, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    n: int = Field(1, ge=1, le=1)
    # vLLM's extensions: extra stop token ids, and generating past the end-of-text token.
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False


class IncrementalText:
    """Token ids in, text deltas out; stop strings cut the text (and are not part of it), as in vLLM.

    The whole text is re-decoded each token (byte-level BPE: a character may span tokens), a trailing
    incomplete character is held back, and so are the last len(longest stop) - 1 characters, which
    could still turn into a stop string.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.text = ""

    def add(self, token_id: int) -> tuple[str, bool]:
        """(new text to send, whether a stop string ended the text)."""
        self.ids.append(token_id)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            return self._take(max(cut, self.sent)), True
        stable = len(self.text.rstrip("\ufffd"))
        return self._take(max(self.sent, stable - self.hold)), False

    def flush(self) -> str:
        """The held-back rest, once the request finished without a stop string."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        delta = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return delta


def completion_body(request_id: str, created: int, model: str, text: str | None, finish_reason: str | None = None,
                    usage: dict | None = None) -> dict:
    """A text_completion object: the whole answer, one streamed chunk, or (text None) the usage-only last chunk."""
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    body = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def sse(body: dict) -> str:
    """One server-sent event carrying a JSON body."""
    return f"data: {json.dumps(body)}\n\n"


def validation_message(errors: list[dict]) -> tuple[int, str]:
    """FastAPI's validation errors as (status, one readable line): 400 for a body that is not JSON, 422 otherwise."""
    problems = []
    for error in errors:
        if error.get("type") in ("json_invalid", "json_type"):
            return 400, f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}"
        location = [str(part) for part in error.get("loc", ()) if part != "body"]
        if location[:1] == ["prompt"] and error.get("type") != "missing":
            # A union reports one error per branch; what the user needs is the shape that is accepted.
            problems.append("prompt: expected a string or a list of token ids (integers)")
            continue
        where = ".".join(location) if location else "body"
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    unique = list(dict.fromkeys(problems))
    return 422, "; ".join(unique) if unique else "invalid request body"
