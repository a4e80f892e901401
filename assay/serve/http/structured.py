"""Structured outputs and tool calls at the HTTP edge: a request's response_format, tools and tool_choice as
the grammar its choices decode under and the tools its prompt shows; its answers' tool calls, whole or streamed.

    plan = output_plan(frontend.grammars, body)    # RequestError (400 naming the field) for a refused schema or tool
    plan.grammar                                    # None (free text) or the Grammar the engine enforces
    plan.tools                                      # the tools the chat template shows (None: no tools)
    message, finish = plan.message(text, finish)   # {"role", "content", "tool_calls"?}, "tool_calls" when there are calls

tool_choice none shows no tools and parses no calls; auto shows them and parses the model's own calls
(<tool_call> blocks) from free text; required and a named function force the calls with a grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from assay.core.errors import AssayError
from assay.serve.guided import FunctionTool, Grammar, GrammarCompiler, GrammarError, ToolCallStream, choose_tools, parse_tool_calls, parse_tools
from assay.serve.http.protocol import ChatCompletionRequest, RequestError, ResponseFormat


@dataclass(frozen=True)
class OutputPlan:
    grammar: Grammar | None = None
    tools: list[FunctionTool] | None = None  # shown to the model (tool_choice other than none)

    @property
    def parses_calls(self) -> bool:
        return self.tools is not None

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """A whole answer as an assistant message, its calls parsed out of the text when tools are on."""
        if not self.parses_calls:
            return {"role": "assistant", "content": text}, finish_reason
        content, calls = parse_tool_calls(text)
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        message = {"role": "assistant", "content": content or None, "tool_calls": [call.as_openai() for call in calls]}
        return message, "tool_calls" if finish_reason == "stop" else finish_reason

    def stream(self) -> StreamedMessage:
        return StreamedMessage(ToolCallStream() if self.parses_calls else None)


class StreamedMessage:
    """One choice's streamed deltas: its text as content, or with tools on, content and tool-call deltas."""

    def __init__(self, calls: ToolCallStream | None):
        self.calls = calls

    def deltas(self, text: str, finished: bool) -> list[dict]:
        if self.calls is None:  # one delta per token, empty or not (its log-probabilities ride on it)
            return [{"content": text}] if text or not finished else []
        return self.calls.feed(text) + (self.calls.finish() if finished else [])

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.calls is not None and self.calls.calls else reason


def response_grammar(grammars: Callable[[], GrammarCompiler], response_format: ResponseFormat | None) -> Grammar | None:
    """response_format's grammar: None for text; 400 naming the part of the schema the library refuses."""
    if response_format is None or response_format.type == "text":
        return None
    spec = response_format.json_schema
    if response_format.type == "json_schema" and spec is None:
        raise RequestError(400, "response_format.json_schema is needed with type json_schema", "response_format")
    try:
        if response_format.type == "json_object" or spec.schema_ is None:
            return grammars().json_object()
        return grammars().json_schema(spec.schema_, strict=bool(spec.strict))
    except GrammarError as exc:
        raise RequestError(400, str(exc), exc.param) from None


def output_plan(grammars: Callable[[], GrammarCompiler], body: ChatCompletionRequest) -> OutputPlan:
    """What a chat request asks of its output: the grammar and the tools shown (RequestError when refused)."""
    grammar = response_grammar(grammars, body.response_format)
    if not body.tools:
        if body.tool_choice not in (None, "none"):
            raise RequestError(400, "tool_choice needs tools", "tool_choice")
        return OutputPlan(grammar)
    try:
        tools = parse_tools([tool.model_dump(exclude_none=True) for tool in body.tools])
    except AssayError as exc:
        raise RequestError(400, str(exc), "tools") from None
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if choice == "none":
        return OutputPlan(grammar)
    try:
        forced = choose_tools(tools, choice if isinstance(choice, str) else choice.model_dump())
    except AssayError as exc:
        raise RequestError(400, str(exc), "tool_choice") from None
    if forced is None:
        return OutputPlan(grammar, tools)
    if grammar is not None:
        raise RequestError(400, "response_format and a forced tool_choice (required or a named function) cannot both shape the "
                                "output: send one of them", "response_format")
    try:
        return OutputPlan(grammars().tool_calls(forced, parallel=body.parallel_tool_calls is not False), tools)
    except GrammarError as exc:
        raise RequestError(400, str(exc), exc.param) from None
