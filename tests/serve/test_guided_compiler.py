"""Grammars from schemas and tools, with real tokenizers and real llguidance: what they allow, the cache, and
the one-line refusal naming the part of a schema the library cannot enforce."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from assay.core.errors import AssayError
from assay.serve.guided import GrammarCompiler, GrammarError, choose_tools, parse_tools

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "kind"],
          "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}, "kind": {"enum": ["a", "b"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}, "required": ["city"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time"}}]


@pytest.fixture(scope="module")
def tokenizer(zoo_dir):
    return AutoTokenizer.from_pretrained(zoo_dir / "qwen3")


@pytest.fixture
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


def accepts(grammar, tokenizer, text: str, finish: bool = True) -> bool:
    """Whether the grammar takes `text` token by token (and then, with finish, the stop token)."""
    matcher = grammar.matcher()
    ok = all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    return ok and (not finish or matcher.accept(tokenizer.eos_token_id))


def test_schema_output_in_json_dumps_form_is_accepted(compiler, tokenizer):
    grammar = compiler.json_schema(SCHEMA, strict=True)
    assert accepts(grammar, tokenizer, json.dumps({"n": 3, "kind": "b"}))


@pytest.mark.parametrize("text", [
    '{"n": 6, "kind": "a"}',             # above maximum
    '{"n": 0, "kind": "a"}',             # below minimum
    '{"n": 3, "kind": "c"}',             # not in the enum
    '{"n": 3, "kind": "a", "x": 1}',     # additionalProperties false
    '{"n": 3}',                          # a required property missing
])
def test_schema_bounds_refuse_the_token_that_breaks_them(compiler, tokenizer, text):
    assert not accepts(compiler.json_schema(SCHEMA, strict=True), tokenizer, text)


def test_stop_token_only_once_the_object_is_complete(compiler, tokenizer):
    matcher = compiler.json_schema(SCHEMA, strict=True).matcher()
    for token in tokenizer.encode('{"n": 3, "kind": "a"', add_special_tokens=False):
        assert matcher.accept(token)
    assert not matcher.allowed_mask(compiler.vocab_size)[tokenizer.eos_token_id]
    assert matcher.accept(tokenizer.encode("}", add_special_tokens=False)[0])
    assert matcher.is_terminated() and matcher.allowed_mask(compiler.vocab_size).nonzero().flatten().tolist() == [tokenizer.eos_token_id]


def test_rollback_returns_to_an_earlier_state(compiler, tokenizer):
    matcher = compiler.json_schema(SCHEMA, strict=True).matcher()
    tokens = tokenizer.encode('{"n": 3', add_special_tokens=False)
    for token in tokens:
        assert matcher.accept(token)
    before = matcher.allowed_mask(compiler.vocab_size)
    assert matcher.accept(tokenizer.encode(",", add_special_tokens=False)[0])
    matcher.rollback(1)
    assert matcher.accepted == len(tokens) and bool((matcher.allowed_mask(compiler.vocab_size) == before).all())
    with pytest.raises(ValueError):
        matcher.rollback(len(tokens) + 1)


def test_json_object_takes_any_object_but_not_an_array(compiler, tokenizer):
    grammar = compiler.json_object()
    assert accepts(grammar, tokenizer, '{"a": [1, {"b": null}]}')
    assert not accepts(grammar, tokenizer, "[1, 2]")


def test_second_compile_of_the_same_schema_is_a_cache_hit(compiler):
    first = compiler.json_schema(SCHEMA, strict=True)
    assert (compiler.compiles, compiler.hits) == (1, 0)
    again = compiler.json_schema(json.loads(json.dumps(SCHEMA)), strict=True)
    assert again is first and (compiler.compiles, compiler.hits) == (1, 1)
    compiler.json_schema(SCHEMA, strict=False)  # another grammar: not strict ignores what it cannot enforce
    assert compiler.compiles == 2


def test_matchers_of_one_cached_grammar_are_independent(compiler, tokenizer):
    grammar = compiler.json_schema(SCHEMA, strict=True)
    first, second = grammar.matcher(), grammar.matcher()
    assert first.accept(tokenizer.encode("{", add_special_tokens=False)[0])
    assert second.accepted == 0 and not second.accept(tokenizer.encode("}", add_special_tokens=False)[0])


def test_unimplemented_keyword_is_refused_in_one_line_naming_where(compiler):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(GrammarError) as caught:
        compiler.json_schema(schema, strict=True)
    message = str(caught.value)
    assert isinstance(caught.value, AssayError) and caught.value.param == "response_format"
    assert "\n" not in message and "/properties/tags" in message and "uniqueItems" in message
    compiler.json_schema(schema, strict=False)  # OpenAI's default (strict false): enforced where it can be


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "(?<=a)b"}, "look-around"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "nsatisfiable"),
    ("not a schema", "JSON Schema object"),
])
def test_schema_the_library_cannot_compile_is_one_line(compiler, schema, words):
    with pytest.raises(GrammarError) as caught:
        compiler.json_schema(schema, strict=True)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_required_tools_grammar_forces_the_format_and_valid_arguments(compiler, tokenizer):
    grammar = compiler.tool_calls(choose_tools(parse_tools(TOOLS), "required"), parallel=True)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(grammar, tokenizer, call)
    assert accepts(grammar, tokenizer, call + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not accepts(grammar, tokenizer, "Sure! " + call, finish=False)
    assert not accepts(grammar, tokenizer, call.replace("get_weather", "get_mail"), finish=False)
    assert not accepts(grammar, tokenizer, call.replace("Paris", "Paris!"), finish=False)  # maxLength 5
    assert not accepts(grammar, tokenizer, call.replace('"city"', '"town"'), finish=False)


def test_named_tool_without_parallel_calls_allows_one_call_of_it(compiler, tokenizer):
    tools = parse_tools(TOOLS)
    grammar = compiler.tool_calls(choose_tools(tools, {"type": "function", "function": {"name": "get_time"}}), parallel=False)
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert accepts(grammar, tokenizer, call)
    assert not accepts(grammar, tokenizer, call + "\n" + call, finish=False)
    assert not accepts(grammar, tokenizer, call.replace("get_time", "get_weather"), finish=False)


def test_tool_whose_parameters_are_refused_is_named(compiler):
    tools = parse_tools([{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}])
    with pytest.raises(GrammarError) as caught:
        compiler.tool_calls(tools)
    assert caught.value.param == "tools" and "'f'" in str(caught.value) and "/properties/x" in str(caught.value)


@pytest.mark.parametrize("raw, words", [
    ([], "non-empty"),
    ([{"type": "retrieval"}], "tools[0]"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}], "twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "parameters"),
])
def test_bad_tools_are_refused_naming_the_entry(raw, words):
    with pytest.raises(AssayError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_tools(raw)


def test_tool_choice_none_and_auto_need_no_grammar_and_unknown_names_are_refused():
    tools = parse_tools(TOOLS)
    assert choose_tools(tools, "auto") is None and choose_tools(tools, "none") is None
    with pytest.raises(AssayError, match="not in tools"):
        choose_tools(tools, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(AssayError, match="tool_choice must be"):
        choose_tools(tools, "sometimes")


def test_tags_that_are_special_tokens_are_matched_as_tokens(zoo_dir, tmp_path):
    """A tokenizer holding <tool_call> as a special token (text never matches one): the grammar names the
    token itself, so the model's single tag token is what it accepts."""
    folder = tmp_path / "tok"
    shutil.copytree(zoo_dir / "qwen3", folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    compiler = GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
    assert compiler.special_tags == {"<tool_call>", "</tool_call>"}
    grammar = compiler.tool_calls(parse_tools(TOOLS)[1:], parallel=False)
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in tokenizer.encode(text, add_special_tokens=False)
    assert accepts(grammar, tokenizer, text)


def test_a_grammar_sent_to_another_process_is_the_same_grammar_there(compiler, tokenizer, zoo_dir):
    """What a Ray Serve router does with a request's SamplingParams: pickle them to an engine replica, a real
    other process here, which compiles the grammar again for the same tokenizer folder."""
    import pickle
    import subprocess
    import sys

    from assay.serve.engine.sampling import SamplingParams

    grammar = compiler.json_schema(SCHEMA, strict=True)
    assert pickle.loads(pickle.dumps(grammar)).key == grammar.key  # in this process: the cache
    payload = pickle.dumps(SamplingParams(max_tokens=8, grammar=grammar))
    child = (
        "import pickle, sys\nfrom transformers import AutoTokenizer\n"
        "params = pickle.loads(sys.stdin.buffer.read())\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(zoo_dir / 'qwen3')!r})\n"
        "def takes(text):\n"
        "    matcher = params.grammar.matcher()\n"
        "    return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))\n"
        "print(takes('{\"n\": 3, \"kind\": \"a\"}'), takes('{\"n\": 9'))\n"
    )
    run = subprocess.run([sys.executable, "-c", child], input=payload, capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().split() == ["True", "False"]
