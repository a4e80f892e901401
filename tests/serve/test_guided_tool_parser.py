"""The <tool_call> format read back: whole responses (good, parallel, partial, malformed) and streamed ones,
whose deltas come in OpenAI's order (id and name first, then argument fragments that join to the arguments)."""

from __future__ import annotations

import itertools
import json

import pytest

from assay.serve.guided import ToolCallStream, parse_tool_calls

ARGS = '{"city": "Pa}ris \\" {", "days": [1, {"n": 2}]}'
ONE = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'
TWO = ONE + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_one_call_is_parsed_with_its_arguments_as_written():
    content, calls = parse_tool_calls(ONE, ids())
    assert content == ""
    assert [(c.id, c.name, c.arguments) for c in calls] == [("call_0", "get_weather", ARGS)]
    assert json.loads(calls[0].arguments)["city"] == 'Pa}ris " {'
    assert calls[0].as_openai() == {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}


def test_parallel_calls_and_surrounding_text():
    content, calls = parse_tool_calls("Let me check. " + TWO + " Done.", ids())
    assert content == "Let me check. Done."
    assert [c.name for c in calls] == ["get_weather", "get_time"] and calls[1].arguments == "{}"


def test_compact_and_spaced_forms_are_both_read():
    content, calls = parse_tool_calls('<tool_call>{"name":"f","arguments":{"x":1}}</tool_call>')
    assert content == "" and calls[0].name == "f" and calls[0].arguments == '{"x":1}'


def test_plain_text_has_no_calls():
    assert parse_tool_calls("The weather is fine.") == ("The weather is fine.", [])


@pytest.mark.parametrize("text", [
    ONE[:-5],                                                        # cut inside the closing tag (max_tokens)
    ONE[:40],                                                        # cut inside the arguments
    '<tool_call>\n{"name": "f", "arguments": {"x": 1,}}\n</tool_call>',  # not JSON
    '<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>',     # not the format's order
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',    # arguments not an object
    "<tool_call> hello",
])
def test_partial_or_malformed_block_stays_content(text):
    content, calls = parse_tool_calls(text)
    assert calls == [] and content == text.strip()


def test_good_call_before_a_malformed_one_is_kept():
    content, calls = parse_tool_calls(ONE + "\n<tool_call>\n{oops", ids())
    assert [c.name for c in calls] == ["get_weather"] and content == "<tool_call>\n{oops"


def collect(text: str, size: int) -> tuple[str, dict[int, dict], list[dict]]:
    stream, deltas = ToolCallStream(ids()), []
    for start in range(0, len(text), size):
        deltas += stream.feed(text[start:start + size])
    deltas += stream.finish()
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], {"arguments": ""})
            if "id" in call:
                assert "id" not in entry, "a call's id and name come once"
                entry.update(id=call["id"], name=call["function"]["name"], type=call["type"])
            else:
                assert "id" in entry, "argument fragments come after the id and name"
            entry["arguments"] += call["function"]["arguments"]
    return content, calls, deltas


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 1000])
def test_streamed_fragments_join_to_the_whole_arguments(size):
    text = "Checking. " + TWO
    _, whole = parse_tool_calls(text, ids())
    content, calls, _ = collect(text, size)
    assert content.strip() == "Checking."
    assert [(calls[i]["id"], calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == [
        (c.id, c.name, c.arguments) for c in whole]


def test_stream_sends_id_and_name_before_the_arguments_arrive():
    stream = ToolCallStream(ids())
    assert stream.feed('<tool_call>\n{"name": "get_weather", "arguments": ') == [
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}]
    assert stream.feed('{"city": "Pa') == [{"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]}]


def test_stream_holds_back_a_partial_tag_and_releases_it_when_it_is_not_one():
    stream = ToolCallStream()
    assert stream.feed("a <tool") == [{"content": "a "}]
    assert stream.feed("box> b") == [{"content": "<toolbox> b"}]


@pytest.mark.parametrize("size", [1, 4, 100])
def test_stream_of_a_block_that_is_not_a_call_comes_out_as_content(size):
    text = "x <tool_call> not json at all"
    content, calls, _ = collect(text, size)
    assert calls == {} and content == text


def test_stream_cut_inside_the_head_flushes_it_as_content():
    content, calls, _ = collect('<tool_call>\n{"name": "get_w', 3)
    assert calls == {} and content == '<tool_call>\n{"name": "get_w'
