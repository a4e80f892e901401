"""Chats with tools rendered by real chat templates through Transformers: a template that renders tools gets
them (and the calls and results in the history) itself; SmolLM2's, which drops them, gets the generic format."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from assay.core.errors import AssayError
from assay.serve.guided import parse_tools, render_chat, supports_tools

# A ChatML template that renders tools, calls and results the way Qwen-family templates do (written for this test).
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{%- if message.role == 'system' %}{%- elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response name=\"{{ message.name }}\" id=\"{{ message.tool_call_id }}\">\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = parse_tools([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
ROUND_TRIP = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?", "name": "ana"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]


@pytest.fixture(scope="module")
def smollm2(real_model_dir):
    return AutoTokenizer.from_pretrained(real_model_dir)


@pytest.fixture
def tool_tokenizer(zoo_dir):
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "qwen3")
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def test_smollm2_template_has_no_tool_support_and_the_zoo_has_no_template(smollm2, zoo_dir):
    assert not supports_tools(smollm2)
    zoo = AutoTokenizer.from_pretrained(zoo_dir / "qwen3")
    assert not supports_tools(zoo)
    with pytest.raises(AssayError, match="no chat template"):
        render_chat(zoo, [{"role": "user", "content": "hi"}], TOOLS)


def test_generic_format_describes_the_tools_and_writes_calls_and_results_as_blocks(smollm2):
    text = render_chat(smollm2, ROUND_TRIP, TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.") and "<tool_call>" in system
    assert json.dumps(TOOLS[0].as_openai()["function"]) in system
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_template_with_tool_support_renders_tools_calls_and_results_itself(tool_tokenizer):
    assert supports_tools(tool_tokenizer)
    text = render_chat(tool_tokenizer, ROUND_TRIP, TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and '"name": "get_weather"' in text
    assert "You can call functions" not in text  # the generic preamble is not added
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response name="get_weather" id="call_1">\n18 C, sunny\n</tool_response>' in text


def test_no_tools_renders_as_a_plain_chat(smollm2):
    plain = [{"role": "user", "content": "hi"}]
    assert render_chat(smollm2, plain) == smollm2.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


def test_call_arguments_that_are_not_json_are_refused(tool_tokenizer):
    bad = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}]}]
    with pytest.raises(AssayError, match="not JSON"):
        render_chat(tool_tokenizer, bad, TOOLS)


def test_template_refusal_is_one_line(tool_tokenizer):
    tool_tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(AssayError, match="refused the messages: roles must alternate"):
        render_chat(tool_tokenizer, [{"role": "user", "content": "hi"}])
