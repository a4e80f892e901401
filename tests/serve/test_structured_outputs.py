"""Structured outputs and tool calls through the server, over real HTTP on loopback, on the tiny zoo: every
finished output (finish_reason stop) validates against its schema, greedy and sampled, on a KV model (Qwen3)
and the fixed-state GLA, eager and compiled (aot_eager); a batch mixes schemas with free requests, whose
answers equal those they give alone; tool calls come back as OpenAI's tool_calls, whole and streamed.

The tiny models are random: what they write inside a schema is noise, which is the point (the grammar, not
the model, makes it valid). Greedy float32 decoding of independent rows is exact, so free answers must be
equal, not close.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve.test_guided_decode import PERSON, SCORE, WEATHER_TOOL, valid
from serve.test_http import reference_engine, start_server

from assay.serve.guided import parse_tools, render_chat

TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def schema_format(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def chat(url: str, body: dict, timeout: float = 120) -> dict:
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


def complete(url: str, body: dict, timeout: float = 120) -> dict:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def server(chat_model):
    # 1024 positions: the tiny tokenizer spends about 300 tokens of the prompt on each tool's description.
    handle, engine = start_server(chat_model.parent, chat_model, max_seqs=8, max_len=1024)
    yield handle.url, engine
    handle.stop()


# ---------------------------------------------------------------- response_format


def test_chat_json_schema_outputs_validate_greedy_and_sampled(server):
    url, _ = server
    body = {"messages": [{"role": "user", "content": "A person, as JSON."}], "max_tokens": 160, "response_format": schema_format(PERSON)}
    greedy = chat(url, body | {"temperature": 0})
    sampled = chat(url, body | {"temperature": 1.0, "seed": 0, "n": 4})
    for choice in greedy["choices"] + sampled["choices"]:
        text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and valid(text, PERSON), text
    assert len({c["message"]["content"] for c in sampled["choices"]}) > 1  # sampled, not one answer four times


def test_json_object_is_any_object_on_both_routes(server):
    url, _ = server
    answer = chat(url, {"messages": USER, "max_tokens": 120, "temperature": 0, "response_format": {"type": "json_object"}})
    text = answer["choices"][0]["message"]["content"]
    # A random model under "any object" may run to max_tokens inside a string: what finished parses.
    if answer["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{"), text
    scored = complete(url, {"prompt": "Score:", "max_tokens": 40, "temperature": 1.0, "seed": 3, "n": 3, "response_format": schema_format(SCORE)})
    assert [c["finish_reason"] for c in scored["choices"]] == ["stop"] * 3
    assert all(valid(c["text"], SCORE) for c in scored["choices"]), scored


@pytest.fixture(scope="module", params=["gla-eager", "gla-compiled", "qwen3-compiled"])
def engine_server(zoo_dir, request):
    model, mode = request.param.split("-")
    compiled = {"eager": False, "backend": "aot_eager", "buckets": (4,)} if mode == "compiled" else {}
    handle, _ = start_server(zoo_dir, model, max_seqs=4, max_len=256, **compiled)
    yield handle.url
    handle.stop()


def test_schema_holds_on_the_fixed_state_model_and_in_compiled_decode(engine_server):
    """Three sampled choices and a greedy one per schema, in one decode batch of four."""
    answers = complete(engine_server, {"prompt": "The record:", "max_tokens": 160, "temperature": 1.0, "seed": 11, "n": 3,
                                       "response_format": schema_format(PERSON)})
    greedy = complete(engine_server, {"prompt": "Score:", "max_tokens": 40, "temperature": 0, "response_format": schema_format(SCORE)})
    for choice, schema in [(c, PERSON) for c in answers["choices"]] + [(greedy["choices"][0], SCORE)]:
        assert choice["finish_reason"] == "stop" and valid(choice["text"], schema), choice


def test_a_batch_of_schemas_beside_free_requests_leaves_the_free_ones_unchanged(zoo_dir, server):
    url, engine = server
    reference = reference_engine(zoo_dir, "qwen3-pretrained", max_len=1024)
    bodies = [{"prompt": "A person:", "response_format": schema_format(PERSON), "max_tokens": 160},
              {"prompt": [5, 6, 7, 8], "max_tokens": 24},
              {"prompt": "Score:", "response_format": schema_format(SCORE), "max_tokens": 40},
              {"prompt": [40, 41, 42], "max_tokens": 24},
              {"prompt": "Another person:", "response_format": schema_format(PERSON, strict=False), "max_tokens": 160}]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: complete(url, body | {"temperature": 0}), bodies))
    for body, answer in zip(bodies, answers):
        choice = answer["choices"][0]
        if "response_format" in body:
            schema = body["response_format"]["json_schema"]["schema"]
            assert choice["finish_reason"] == "stop" and valid(choice["text"], schema), choice
        else:
            assert choice["text"] == reference(body["prompt"], 24).text


def test_a_schema_the_library_refuses_is_one_400_naming_the_part(server):
    url, _ = server
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    for path, base in [("chat/completions", {"messages": USER}), ("completions", {"prompt": "x"})]:
        response = httpx.post(f"{url}/v1/{path}", json=base | {"response_format": schema_format(schema)}, timeout=30)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "response_format", response.text
        assert "/properties/tags" in error["message"] and "uniqueItems" in error["message"] and "\n" not in error["message"]
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": USER, "response_format": {"type": "json_schema"}}, timeout=30)
    assert response.status_code == 400 and "response_format.json_schema is needed" in response.json()["error"]["message"]


def test_the_openai_clients_parse_returns_the_pydantic_object(server):
    from typing import Literal

    from openai import OpenAI
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        city: str = Field(max_length=10)
        degrees: int = Field(ge=-40, le=50)
        sky: Literal["clear", "cloudy", "rain"]

    url, _ = server
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    completion = client.chat.completions.parse(model="qwen3-chat", messages=USER, response_format=Weather, max_tokens=80, temperature=0)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Weather) and -40 <= parsed.degrees <= 50, completion


# ---------------------------------------------------------------- tools


def test_required_tool_choice_gives_tool_calls_whose_arguments_validate(server):
    url, _ = server
    # One call each: with parallel calls allowed, a random model tends to go on calling until max_tokens.
    answer = chat(url, {"messages": USER, "tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": "required", "max_tokens": 120,
                        "temperature": 1.0, "seed": 5, "n": 3, "parallel_tool_calls": False})
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
    for choice in answer["choices"]:
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls" and len(calls) == 1 and choice["message"]["content"] is None, choice
        for call in calls:
            assert call["type"] == "function" and call["id"].startswith("call_")
            assert valid(call["function"]["arguments"], parameters[call["function"]["name"]]), call


def stream_chat(url: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body | {"stream": True}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def test_a_named_tool_call_streams_as_openai_streams_it(server):
    url, _ = server
    body = {"messages": USER, "tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False, "max_tokens": 120, "temperature": 0}
    whole = chat(url, body)["choices"][0]
    [call] = whole["message"]["tool_calls"]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    assert call["function"]["name"] == "get_weather" and valid(call["function"]["arguments"], WEATHER_TOOL["function"]["parameters"])

    deltas = [c["choices"][0] for c in stream_chat(url, body) if c["choices"]]
    call_deltas = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    head, fragments = call_deltas[0], call_deltas[1:]
    assert head["id"].startswith("call_") and head["function"] == {"name": "get_weather", "arguments": ""} and head["index"] == 0
    assert fragments and all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in fragments)
    assert "".join(f["function"]["arguments"] for f in fragments) == call["function"]["arguments"]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["tool_calls"]
    assert not any(d["delta"].get("content") for d in deltas)


def test_a_round_trip_of_call_result_and_answer_goes_through_the_template(server):
    url, engine = server
    first = chat(url, {"messages": USER, "tools": [WEATHER_TOOL], "tool_choice": "required", "max_tokens": 120, "temperature": 0})
    assistant = first["choices"][0]["message"]
    messages = USER + [assistant, {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "18 C, sunny"}]
    answer = chat(url, {"messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 8, "temperature": 0})
    rendered = render_chat(engine.tokenizer, messages, parse_tools([WEATHER_TOOL]))
    assert "18 C, sunny" in rendered and assistant["tool_calls"][0]["function"]["arguments"] in rendered
    assert answer["usage"]["prompt_tokens"] == len(engine.tokenizer.encode(rendered, add_special_tokens=False))


@pytest.mark.parametrize("body, words", [
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope', which is not in tools"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot both shape the output"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"response_format": {"type": "json_object"}, "min_tokens": 4}, "min_tokens cannot be combined with response_format"),
], ids=["choice-without-tools", "unknown-function", "forced-and-format", "bad-name", "min-tokens-and-format"])
def test_bad_tool_requests_are_one_400(server, body, words):
    url, _ = server
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": USER} | body, timeout=30)
    assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


# ---------------------------------------------------------------- the rest of the chat schema


def test_developer_role_names_and_record_keeping_fields_are_accepted(server):
    url, engine = server
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi", "name": "ada"}]
    body = {"messages": messages, "max_tokens": 3, "temperature": 0, "metadata": {"team": "qa"}, "store": True, "user": "u1",
            "safety_identifier": "hash-1", "prompt_cache_key": "k1", "service_tier": "auto"}
    answer = chat(url, body)
    as_system = render_chat(engine.tokenizer, [{"role": "system", "content": "Be brief."}, messages[1]])
    assert answer["usage"]["prompt_tokens"] == len(engine.tokenizer.encode(as_system, add_special_tokens=False))


@pytest.mark.parametrize("message, words", [
    ({"role": "tool", "content": "18 C"}, "needs the id of the call it answers"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}, "'input_audio' is not supported"),
    ({"role": "user"}, "a user message needs content"),
], ids=["tool-without-id", "audio-part", "no-content"])
def test_messages_the_server_cannot_honour_are_one_400(server, message, words):
    url, _ = server
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": [message]}, timeout=30)
    assert response.status_code == 400 and words in response.json()["error"]["message"], response.text
