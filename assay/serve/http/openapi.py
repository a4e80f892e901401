"""/openapi.json with every body: the request schemas are the pydantic models the routes validate with
(protocol.py), the responses are described by the models below (what responses.py writes), so /docs shows
them and a generated client works.

The routes read their bodies themselves (the field policy answers in one line, before pydantic), so FastAPI
cannot infer the request bodies: `describe(app)` puts them in.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from assay.serve.http.protocol import ChatCompletionRequest, CompletionRequest


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobOut]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # a JSON object's text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: Optional[str]
    tool_calls: Optional[list[ToolCallOut]] = None


FinishReason = Optional[Literal["stop", "length", "tool_calls", "abort", "error"]]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    """A whole chat answer (stream false)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: Optional[str] = None  # the call's first delta: its id, type and name; then argument fragments
    type: Optional[Literal["function"]] = None
    function: dict[str, str]


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCallDelta]] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: Optional[ChatLogprobs]
    finish_reason: FinishReason


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat answer (the last, with include_usage, has usage and no choices)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class LegacyLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[LegacyLogprobs]
    finish_reason: FinishReason


class Completion(BaseModel):
    """A whole completion (stream false), or one server-sent event of a streamed one."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class ErrorDetail(BaseModel):
    message: str  # one line
    type: str
    param: Optional[str]
    code: int


class ErrorResponse(BaseModel):
    error: ErrorDetail


_ERRORS = {400: "a field this server does not implement, or input it cannot honour", 401: "no or a wrong API key",
           404: "an unknown model", 413: "the body is over --max-request-bytes", 422: "a field of the wrong type or out of range",
           429: "the waiting queue is full: retry after Retry-After seconds", 500: "the engine failed",
           503: "the engine is not running"}
BODIES: dict[str, tuple[type[BaseModel], type[BaseModel], type[BaseModel]]] = {
    "/v1/completions": (CompletionRequest, Completion, Completion),
    "/v1/chat/completions": (ChatCompletionRequest, ChatCompletion, ChatCompletionChunk),
}


def responses(answer: type[BaseModel]) -> dict[Union[int, str], dict[str, Any]]:
    """A generating route's responses: the answer (JSON, or server-sent events with stream true) and the errors."""
    return {200: {"model": answer, "content": {"text/event-stream": {"schema": {"type": "string"}}},
                  "description": "the answer; with stream: true, server-sent events, each a chunk as JSON, then [DONE]"}} | {
        status: {"model": ErrorResponse, "description": why} for status, why in _ERRORS.items()}


def describe(app: FastAPI) -> None:
    """app.openapi() with each generating route's request body (and the chunk models) in the components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes, description=app.description)
            models = [(model, "validation") for model, _, _ in BODIES.values()] + [(chunk, "serialization") for _, _, chunk in BODIES.values()]
            _, definitions = models_json_schema(models, ref_template="#/components/schemas/{model}")
            document.setdefault("components", {}).setdefault("schemas", {}).update(definitions.get("$defs", {}))
            for path, (request, _, _) in BODIES.items():
                document["paths"][path]["post"]["requestBody"] = {
                    "required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}}}
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi
