"""Structured outputs and tool calls on the real SmolLM2-135M-Instruct through the server (one eager server
for the module, over real HTTP on loopback): 20 sampled answers (temperature 1, seeds 0-19) under a nested
schema all validate, 20 named tool calls' arguments all validate, 8 schema requests beside 8 free ones in one
batch are all valid and the free ones equal what they give alone; and the examples of
docs/structured_outputs.md run as they are written.

Greedy float32 decoding of independent rows in an eager engine is exact, whatever shares the batch, so the
free answers must be equal, not close.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve.test_guided_decode import PERSON, WEATHER_TOOL, valid
from serve.test_http import start_server

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "structured_outputs.md"
PERSON_PROMPT = [{"role": "user", "content": "Describe a made-up person as JSON."}]
WEATHER_PROMPT = [{"role": "user", "content": "What is the weather in Paris this week?"}]


@pytest.fixture(scope="module")
def real_server(real_model_dir):
    # 16 slots: the 8 + 8 batch in one decode step; 1,024 positions hold the tool description and the answer.
    handle, _ = start_server(real_model_dir.parent, real_model_dir, max_seqs=16, max_len=1024)
    yield handle.url, real_model_dir.name
    handle.stop()


def chat_all(url: str, bodies: list[dict]) -> list[dict]:
    """Every body at once (they share decode steps), each answer's first choice."""
    def send(body):
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(send, bodies))


def person_body(seed: int | None) -> dict:
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    return {"messages": PERSON_PROMPT, "max_tokens": 160, "response_format": {
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}} | sampling


def test_twenty_sampled_answers_under_a_nested_schema_all_validate(real_server):
    url, _ = real_server
    choices = chat_all(url, [person_body(seed) for seed in range(20)])
    invalid = [c for c in choices if c["finish_reason"] != "stop" or not valid(c["message"]["content"], PERSON)]
    assert invalid == [] and len({c["message"]["content"] for c in choices}) > 1


def test_twenty_sampled_named_tool_calls_all_have_valid_arguments(real_server):
    url, _ = real_server
    named = {"type": "function", "function": {"name": "get_weather"}}
    bodies = [{"messages": WEATHER_PROMPT, "tools": [WEATHER_TOOL], "tool_choice": named, "parallel_tool_calls": False,
               "max_tokens": 80, "temperature": 1.0, "seed": seed} for seed in range(20)]
    for choice in chat_all(url, bodies):
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls" and [c["function"]["name"] for c in calls] == ["get_weather"], choice
        assert valid(calls[0]["function"]["arguments"], WEATHER_TOOL["function"]["parameters"]), choice


def test_eight_schema_requests_beside_eight_free_ones_are_valid_and_leave_the_free_ones_unchanged(real_server):
    url, _ = real_server
    questions = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?", "Say hello in Spanish.",
                 "What do bees make?", "Name a large ocean.", "What is water made of?", "Which planet is red?"]
    free = [{"messages": [{"role": "user", "content": q}], "max_tokens": 24, "temperature": 0} for q in questions]
    guided = [person_body(seed) for seed in range(8)]
    together = chat_all(url, [body for pair in zip(guided, free) for body in pair])
    alone = [chat_all(url, [body])[0] for body in free]
    for choice in together[0::2]:
        assert choice["finish_reason"] == "stop" and valid(choice["message"]["content"], PERSON), choice
    assert [c["message"]["content"] for c in together[1::2]] == [c["message"]["content"] for c in alone]


def doc_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_docs_page_has_the_four_examples():
    examples = doc_examples()
    assert len(examples) == 4
    assert "json_schema" in examples[0] and ".parse(" in examples[1] and "tool_choice={" in examples[2] and "tool_call_id" in examples[3]


@pytest.mark.parametrize("index", range(4), ids=["json-schema", "pydantic-parse", "named-tool", "auto-round-trip"])
def test_each_docs_example_runs_against_the_real_model(real_server, index):
    """Each example as a script of its own (a real process, as a reader runs it), pointed at this server."""
    url, name = real_server
    source = doc_examples()[index].replace("http://localhost:8000/v1", f"{url}/v1").replace('model="smollm2"', f"model={name!r}")
    run = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    printed = run.stdout.strip()
    assert printed, "the example printed nothing"
    if index == 2:
        assert printed.startswith("tool_calls get_weather {")
