"""A chat with tools, rendered through the model's own chat template, or through the generic format when the
template has no tool support.

    text = render_chat(tokenizer, messages, tools)     # messages in OpenAI's shape; tools: [FunctionTool] or None

Messages: role developer is system (OpenAI's newer name for it); an assistant message's `tool_calls` (with
`arguments` as a JSON string) and a tool message's `tool_call_id` go to the template as Transformers expects
them (arguments as an object, the tool message also named after its call's function).

Whether a template supports tools is asked of the template itself, as llama.cpp does: a probe conversation
with one tool is rendered, and the tool's name must appear in the text. A template that drops it (SmolLM2's)
gets the generic format: the tools are described in the system message, calls are written in the assistant
turn as the same <tool_call> blocks the Qwen3 and Hermes templates use (so one parser and one grammar serve
both), and a tool's result comes back as a user turn holding a <tool_response> block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from assay.core.errors import AssayError
from assay.serve.guided.tools import CALL_CLOSE, CALL_OPEN, FunctionTool

_PROBE_TOOL = FunctionTool("assay_probe_tool_q7", "probe", {"type": "object", "properties": {}})
_SUPPORT: dict[str, bool] = {}  # template text -> whether it renders tools

GENERIC_PREAMBLE = (
    "You can call functions to answer. Each function, with its parameters as JSON Schema:\n{tools}\n"
    "To call functions, answer with one block per call and nothing else:\n"
    f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": <arguments as a JSON object>}}\n{CALL_CLOSE}\n'
    "Each result comes back to you in a <tool_response> block."
)


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders the `tools` it is given."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    if template not in _SUPPORT:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL.as_openai()],
                                                 tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that raises on tools does not support them
            text = ""
        _SUPPORT[template] = _PROBE_TOOL.name in text
    return _SUPPORT[template]


def render_chat(tokenizer: Any, messages: Sequence[dict], tools: Sequence[FunctionTool] | None = None) -> str:
    """The prompt text: the template over the messages with the assistant's turn opened.

    AssayError (one line) when the tokenizer has no template or the template refuses the messages.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise AssayError("the model has no chat template (no chat_template in its tokenizer files)")
    native = supports_tools(tokenizer)
    calls = _call_names(messages)
    rendered = [_message(m, calls, native) for m in messages]
    kwargs: dict[str, Any] = {}
    if tools and native:
        kwargs["tools"] = [tool.as_openai() for tool in tools]
    elif tools:
        rendered = _with_preamble(rendered, GENERIC_PREAMBLE.replace("{tools}", "\n".join(
            json.dumps(tool.as_openai()["function"], ensure_ascii=False) for tool in tools)))
    try:
        return tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True, **kwargs)
    except Exception as exc:  # the template's own refusal (e.g. raise_exception("roles must alternate"))
        raise AssayError(f"the model's chat template refused the messages: {exc}") from None


def call_block(name: str, arguments: str) -> str:
    """One call as the format writes it (the generic format's assistant turns)."""
    return f'{CALL_OPEN}\n{{"name": "{name}", "arguments": {arguments}}}\n{CALL_CLOSE}'


def _call_names(messages: Sequence[dict]) -> dict[str, str]:
    """tool_call_id -> function name, from the assistant messages' calls."""
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            names[call.get("id", "")] = call.get("function", {}).get("name", "")
    return names


def _message(message: dict, calls: dict[str, str], native: bool) -> dict:
    role = "system" if message.get("role") == "developer" else message.get("role")
    rendered: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
    if message.get("name"):
        rendered["name"] = message["name"]
    tool_calls = message.get("tool_calls") or []
    if role == "assistant" and tool_calls:
        if native:
            rendered["tool_calls"] = [_template_call(call) for call in tool_calls]
        else:
            blocks = [call_block(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls]
            rendered["content"] = "\n".join(filter(None, [rendered["content"], *blocks]))
    if role == "tool":
        call_id = message.get("tool_call_id", "")
        if native:
            rendered.update(tool_call_id=call_id, name=message.get("name") or calls.get(call_id, ""))
        else:
            rendered = {"role": "user", "content": f"<tool_response>\n{rendered['content']}\n</tool_response>"}
    return rendered


def _template_call(call: dict) -> dict:
    """OpenAI's call (arguments as JSON text) as chat templates read it (arguments as an object)."""
    function = call.get("function", {})
    arguments = function.get("arguments", "{}")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        raise AssayError(f"tool call {call.get('id', '')!r}: function.arguments is not JSON") from None
    return {"id": call.get("id", ""), "type": "function", "function": {"name": function.get("name", ""), "arguments": arguments}}


def _with_preamble(messages: list[dict], preamble: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{preamble}".strip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": preamble}, *messages]
