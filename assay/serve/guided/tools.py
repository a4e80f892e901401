"""Function tools as a request names them, checked, and the grammar of the tool-call format that forces them.

    tools = parse_tools(body["tools"])                  # [FunctionTool], AssayError naming tools[i].<field>
    chosen = choose_tools(tools, body["tool_choice"])   # None: no grammar (none / auto); else the tools to force
    lark = tool_call_lark(chosen, parallel=True, special={"<tool_call>"})

The format is the one Qwen3, SmolLM3 and Hermes chat templates teach their models (and the generic format
for templates without tools, see chat.py):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each call is fixed text up to the arguments, then the arguments as JSON valid against the function's
`parameters`; parallel calls are separated by one newline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from assay.core.errors import AssayError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# OpenAI's rule for a function name; it also keeps the name safe to write inside a grammar's string literal.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# One line of JSON the way json.dumps writes it: the form models see in training, and no room for a sampled
# model to wander into endless whitespace.
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class FunctionTool:
    """One `{"type": "function", "function": {...}}` entry of a request's `tools`."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI shape, which Transformers' apply_chat_template(tools=...) also takes."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


def parse_tools(raw: Any) -> list[FunctionTool]:
    """The request's `tools`, checked: AssayError names the first entry and field that is wrong."""
    if not isinstance(raw, list) or not raw:
        raise AssayError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    tools, seen = [], set()
    for i, entry in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "function" or not isinstance(entry.get("function"), dict):
            raise AssayError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}} (only function tools are supported)")
        function = entry["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise AssayError(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}")
        if name in seen:
            raise AssayError(f"{where}.function.name {name!r} appears twice")
        seen.add(name)
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise AssayError(f"{where}.function.parameters must be a JSON Schema object")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise AssayError(f"{where}.function.description must be a string")
        tools.append(FunctionTool(name, description, parameters, bool(function.get("strict", False))))
    return tools


def choose_tools(tools: Sequence[FunctionTool], tool_choice: Any) -> list[FunctionTool] | None:
    """The tools a grammar must force for `tool_choice`, or None when the output is free (none, auto).

    OpenAI's default is auto when tools are given; `required` forces one of them, a named function that one.
    """
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if tool_choice == "required":
        return list(tools)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(name, str)):
        raise AssayError("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    for tool in tools:
        if tool.name == name:
            return [tool]
    raise AssayError(f"tool_choice names the function {name!r}, which is not in tools")


def json_grammar_schema(schema: dict[str, Any], strict: bool) -> str:
    """A JSON Schema as llguidance reads it, with the output format (and leniency) fixed by assay.

    strict: every keyword must be enforced, and one the library has not implemented is refused; not strict
    (OpenAI's default): such keywords are ignored and the rest is enforced.
    """
    guidance = {**JSON_FORMAT, "lenient": not strict}
    return json.dumps({**schema, "x-guidance": guidance}, ensure_ascii=False)


def tool_call_lark(tools: Sequence[FunctionTool], parallel: bool, special: Collection[str] = ()) -> str:
    """A Lark grammar (llguidance's dialect) for one call, or one or more with `parallel`, to one of `tools`.

    `special`: the tags the tokenizer holds as special tokens, written as token references, since a
    special token never matches text.
    """
    def tag(text: str) -> str:
        return text if text in special else json.dumps(text)

    choices = []
    for i, tool in enumerate(tools):
        opening = json.dumps(f'{{"name": "{tool.name}", "arguments": ')
        choices.append(f"tool_{i}: {opening} %json{json_grammar_schema(tool.parameters, tool.strict)}")
    body = " | ".join(f"tool_{i}" for i in range(len(tools)))
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    call = f'call: {tag(CALL_OPEN)} "\\n" ({body}) "}}\\n" {tag(CALL_CLOSE)}'
    return "\n".join([start, call, *choices]) + "\n"
