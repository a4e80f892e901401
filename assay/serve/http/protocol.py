"""The wire format of /v1/completions and /v1/chat/completions (OpenAI's, with vLLM's extensions): the
request schemas, the field policy (nothing silently ignored), and body parsing.

vLLM is the reference: errors are {"error": {"message", "type", "param", "code"}} with one readable line.
The status follows the problem:
  400  the body is not UTF-8 JSON, or names a field this server does not implement (unknown to OpenAI, or
       OpenAI's but not implemented here, e.g. best_of, logit_bias, tools): the message names the field;
  422  a field of the wrong type or out of range (strict: "8" is not a number of tokens).
A field OpenAI defines whose value asks for nothing (presence_penalty 0, logit_bias {} ...) is accepted: it
changes nothing, so nothing is dropped; so are the fields that ask nothing of the output (user, metadata,
store, safety_identifier, prompt_cache_key ...). Structured outputs (response_format) and tool calls (tools,
tool_choice, parallel_tool_calls) are described here and turned into a grammar by structured.py.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from assay.serve.engine.sampling import SamplingParams

# vLLM's default --max-logprobs: alternatives per token a request may ask for.
MAX_LOGPROBS = 20
# torch.Generator.manual_seed takes any integer in [-2**63, 2**64).
SEED_RANGE = (-(2**63), 2**64 - 1)


class RequestError(Exception):
    """A request the server refuses: HTTP status, one readable line, the field it is about (or None)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class JsonSchemaFormat(_Strict):
    """response_format.json_schema: the schema the output must validate against (strict: refuse the keywords
    the grammar library cannot enforce rather than ignore them)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")  # None: any JSON object
    strict: Optional[bool] = None


class ResponseFormat(_Strict):
    """text (free), json_object (any JSON object) or json_schema (an object of that schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class FunctionDefinition(_Strict):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # JSON Schema of the arguments; None: an object of any properties
    strict: Optional[bool] = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    # OpenAI's: usage on every chunk (null until the last). Not implemented; only false is accepted.
    continuous_usage_stats: Literal[False] = False


class _Sampling(BaseModel):
    """The fields both routes share: what to generate and how to choose each token."""

    # strict: "16" is not a number of tokens and 1.0 is not a token id; a client that sends them has a bug.
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Optional[str] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)  # vLLM's extension; 0 and -1 mean every token
    seed: Optional[int] = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    n: int = Field(1, ge=1)
    stop: Optional[Union[str, list[str]]] = None
    # vLLM's extensions: extra stop token ids, and generating past the end-of-text token.
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    # Penalties and floors with vLLM's ranges (serve/engine/penalties.py, docs/serve.md "Sampling"); the
    # neutral values (1, 0, 0, 0, 0) ask for nothing. OpenAI's two penalties accept null as their default.
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    presence_penalty: Optional[float] = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: Optional[float] = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    min_tokens: int = Field(0, ge=0)
    # OpenAI's end-user identifier: metadata for the caller's own records; it asks nothing of generation.
    user: Optional[str] = None
    # Structured outputs: the output is JSON (of a schema), enforced while decoding (assay.serve.guided).
    response_format: Optional[ResponseFormat] = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self, **derived) -> SamplingParams:
        """SamplingParams from the body's fields of the same names, then `derived` (what the route computes:
        max_tokens, logprobs, stop strings and ids). A sampling field added to both is carried with no more code."""
        shared = {f.name: getattr(self, f.name) for f in fields(SamplingParams) if f.name in type(self).model_fields}
        shared = {name: value for name, value in shared.items() if value is not None or name not in _NULL_IS_DEFAULT}
        return SamplingParams(**(shared | derived))


class CompletionRequest(_Sampling):
    """POST /v1/completions. prompt: a string, a list of strings, a list of token ids or a list of such lists."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"prompt": "The capital of France is", "max_tokens": 8}]})

    # Its four shapes are checked by completion_prompts(), with one message for all of them.
    prompt: Annotated[Any, WithJsonSchema({"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}, "minItems": 1}]})]
    max_tokens: int = Field(16, ge=1)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class CalledFunction(_Strict):
    name: str
    arguments: str  # the arguments as a JSON object's text, as the response gave them


class MessageToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    """One message. developer is system (OpenAI's newer name for it); an assistant message may carry the
    tool_calls it made (its content then may be null), and a tool message the result of one (tool_call_id)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None  # the participant's name, passed to the chat template
    tool_calls: Optional[list[MessageToolCall]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None  # an earlier answer's refusal, as OpenAI's responses may carry it: its text

    def text(self) -> str:
        if self.content is None:
            return self.refusal or ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def template_message(self) -> dict:
        """The message as render_chat takes it (OpenAI's shape, text content)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions: the prompt is the model's own chat template over the messages."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
                                                               "response_format": {"type": "json_object"}}]})

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[Tool]] = None
    # none (the default without tools), auto (the default with them: the model decides), required (at least one
    # call, enforced), or a named function (a call to it, enforced).
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None  # false: one call at most
    # Fields for the caller's own records, or about caching and storage: they ask nothing of the output.
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_options: Optional[dict[str, Any]] = None
    prompt_cache_retention: Optional[str] = None

    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _off(*values, hint: str):
    """(a predicate: the value is one of those that ask for nothing, what to send instead)."""
    return (lambda value, _body: any(value == v and type(value) is type(v) for v in values), hint)


def _empty(hint: str):
    return (lambda value, _body: value is None or value == {} or value == [], hint)


# Fields whose null means their default (OpenAI's clients send null for "not set").
_NULL_IS_DEFAULT = ("presence_penalty", "frequency_penalty")

# OpenAI fields this server does not implement, accepted only with a value that asks for nothing.
_SHARED_OFF = {
    "logit_bias": _empty("{}"),
}
COMPLETION_OFF = _SHARED_OFF | {
    "suffix": _off(None, "", hint='""'),
    # best_of == n asks for no extra candidates to rank.
    "best_of": (lambda value, body: value is None or (type(value) is int and value == body.get("n", 1)), "equal to n"),
}
CHAT_OFF = _SHARED_OFF | {
    # The deprecated forms of tools and tool_choice: send tools and tool_choice.
    "functions": _empty("[]"),
    "function_call": _off(None, "none", hint='"none"'),
    "modalities": (lambda value, _body: value is None or value == ["text"], '["text"]'),
    "audio": _off(None, hint="null"),
    "prediction": _off(None, hint="null"),
    "reasoning_effort": _off(None, hint="null"),
    "service_tier": _off(None, "auto", "default", hint='"auto"'),
    "web_search_options": _off(None, hint="null"),
}


def _check_fields(body: dict, schema: type[_Sampling], off: dict) -> dict:
    """The body without the fields that ask for nothing; a 400 naming the first field not implemented."""
    known = set(schema.model_fields)
    kept = {}
    for name, value in body.items():
        if name in known:
            kept[name] = value
        elif name in off:
            asks_nothing, hint = off[name]
            if not asks_nothing(value, body):
                raise RequestError(400, f"{name} is not supported by this server (send it as {hint} or leave it out)", name)
        else:
            raise RequestError(400, f"unknown field {name!r}: this server implements {', '.join(sorted(known))}", name)
    return kept


def decode_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 (not UTF-8, not JSON, not an object)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"the request body is not valid UTF-8: byte {exc.start} ({raw[exc.start:exc.start + 1]!r})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise RequestError(400, "the request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _check_stream_options(request: _Sampling):
    if request.stream_options is not None and not request.stream:
        raise RequestError(400, "stream_options needs stream: true", "stream_options")
    return request


def parse_completion(raw: bytes) -> CompletionRequest:
    return _check_stream_options(_validate(CompletionRequest, _check_fields(decode_json(raw), CompletionRequest, COMPLETION_OFF)))


def _check_parts(body: dict) -> None:
    """Content parts other than text (images, audio, files) are not implemented: a 400 naming the part."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise RequestError(400, f"messages.{i}.content.{j}: a part of type {kind!r} is not supported (only text parts)", "messages")


def parse_chat(raw: bytes) -> ChatCompletionRequest:
    body = decode_json(raw)
    _check_parts(body)
    request = _validate(ChatCompletionRequest, _check_fields(body, ChatCompletionRequest, CHAT_OFF))
    if request.top_logprobs is not None and not request.logprobs:
        raise RequestError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    _check_roles(request.messages)
    return _check_stream_options(request)


def _check_roles(messages: list[ChatMessage]) -> None:
    """What only some roles may carry: a 400 naming the message."""
    for i, message in enumerate(messages):
        if message.content is None and message.role != "assistant":
            raise RequestError(400, f"messages.{i}.content: a {message.role} message needs content", "messages")
        if message.tool_calls and message.role != "assistant":
            raise RequestError(400, f"messages.{i}.tool_calls: only an assistant message carries tool_calls", "messages")
        if message.role == "tool" and not message.tool_call_id:
            raise RequestError(400, f"messages.{i}.tool_call_id: a tool message needs the id of the call it answers", "messages")


def _validate(schema, body: dict):
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise RequestError(*validation_message(exc.errors(include_url=False))) from None


def validation_message(errors: list[dict]) -> tuple[int, str, str | None]:
    """Pydantic's errors as (status, one readable line, the first field): 400 for a field not implemented
    (inside a message or stream_options), 422 for wrong types and values."""
    problems, first, status = [], None, 422
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part != "body"]
        where = ".".join(location) if location else "body"
        first = first or (location[0] if location else None)
        if error.get("type") == "extra_forbidden":
            status = 400
            problems.append(f"unknown field {where!r}")
            continue
        if location[:1] == ["messages"] and error.get("type") == "literal_error" and location[-1:] == ["role"]:
            problems.append(f"{where}: the role must be system, developer, user, assistant or tool, got {error.get('input')!r}")
            continue
        if location[:1] == ["messages"] and location[2:3] == ["content"]:
            # A union reports one error per branch; what the user needs is the shape that is accepted.
            problems.append(f"messages.{location[1]}.content: expected a string or a list of {{\"type\": \"text\", \"text\": ...}} parts")
            continue
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    unique = list(dict.fromkeys(problems))
    return status, "; ".join(unique) if unique else "invalid request body", first


_PROMPT_SHAPES = "prompt: expected a string, a list of strings, a list of token ids or a list of lists of token ids"


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def completion_prompts(prompt) -> list[str | list[int]]:
    """OpenAI's four prompt shapes as a list of prompts, each a string or a list of token ids (422 otherwise)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if _is_token_ids(prompt):
            return [list(prompt)]  # an empty list is one empty prompt: the engine says so
        if all(isinstance(p, list) for p in prompt) and all(_is_token_ids(p) for p in prompt) and prompt:
            return [list(p) for p in prompt]
    raise RequestError(422, _PROMPT_SHAPES, "prompt")
