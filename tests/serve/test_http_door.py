"""The server's door, over real HTTP on loopback: nothing silently ignored (a field not implemented is a
400 naming it), bodies that are not UTF-8 JSON objects are 4xx, a body over --max-request-bytes is 413
before it is parsed, a prompt over the character limit is refused without being tokenised, and with an
API key every /v1/* route is 401 without it while /health stays open; the key shows up nowhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from serve.test_http import PROMPT_IDS, metrics, post, post_route, start_server

KEY = "sk-assay-test-9f8e7d6c5b4a"
DOOR = 4 * 2**20  # --max-request-bytes of the door fixture


@pytest.fixture(scope="module")
def door(zoo_dir):
    handle, engine = start_server(zoo_dir, max_request_bytes=DOOR, max_prompt_tokens=512)
    yield handle, engine
    handle.stop()


@pytest.fixture(scope="module")
def locked(zoo_dir):
    handle, _ = start_server(zoo_dir, api_key=KEY)
    yield handle
    handle.stop()


def _error(response: httpx.Response) -> dict:
    error = response.json()["error"]
    assert "\n" not in error["message"]
    return error


# ---------------------------------------------------------------- nothing silently ignored


@pytest.mark.parametrize(
    "route, field, value",
    [
        ("completions", "best_of", 3),
        ("completions", "logit_bias", {"5": 100}),
        ("chat", "logit_bias", {"5": -100}),
        ("chat", "audio", {"voice": "alloy", "format": "wav"}),
        ("completions", "suffix", " and then"),
        ("chat", "functions", [{"name": "f"}]),  # the deprecated form of tools
        ("chat", "function_call", "auto"),
        ("chat", "modalities", ["text", "audio"]),
        ("completions", "guided_json", {"type": "object"}),  # a vLLM extension this server does not implement
        ("chat", "temprature", 0.5),  # a typo is not a silent default
    ],
)
def test_a_field_not_implemented_is_a_400_that_names_it(door, route, field, value):
    handle, _ = door
    response = post_route(handle.url, route, {field: value})
    assert response.status_code == 400, response.text
    error = _error(response)
    assert error["param"] == field and repr(field) in error["message"] or f"{field} is not supported" in error["message"]


@pytest.mark.parametrize("field, value", [("presence_penalty", 0), ("frequency_penalty", 0.0), ("logit_bias", {}),
                                          ("best_of", 1), ("suffix", None), ("user", "someone")])
def test_a_field_whose_value_asks_for_nothing_is_accepted(door, field, value):
    handle, _ = door
    response = post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 2, "temperature": 0, field: value})
    assert response.status_code == 200, response.text


def test_an_unknown_field_inside_a_message_is_a_400(door):
    handle, _ = door
    body = {"messages": [{"role": "user", "content": "hi", "mood": "curious"}]}
    response = httpx.post(f"{handle.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400 and "unknown field 'messages.0.mood'" in _error(response)["message"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"prompt": "caf\xe9"}', "not valid UTF-8"),
        (b'{"prompt": [1, 2', "not valid JSON"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b'"just a string"', "must be a JSON object"),
        (b"", "not valid JSON"),
        (b"[" * 20_000 + b"]" * 20_000, "not valid JSON"),
    ],
    ids=["latin-1", "truncated", "array", "string", "empty", "deeply-nested"],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_that_is_not_a_utf8_json_object_is_a_400(door, path, content, message):
    handle, _ = door
    response = httpx.post(f"{handle.url}{path}", content=content, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    assert message in _error(response)["message"]


# ---------------------------------------------------------------- limits at the door


def test_a_body_over_max_request_bytes_is_413_before_it_is_parsed(door):
    handle, _ = door
    before = metrics(handle.url)[("assay_requests_total", (("outcome", "rejected_too_large"),))]
    # Not even JSON: a 413 must come from the size alone.
    response = httpx.post(f"{handle.url}/v1/completions", content=b"x" * (DOOR + 1), timeout=30)
    assert response.status_code == 413 and f"at most {DOOR} bytes" in _error(response)["message"]

    # Without a Content-Length (chunked), the size is counted as it arrives.
    def chunks():
        for _ in range(100):
            yield b" " * 65536

    response = httpx.post(f"{handle.url}/v1/completions", content=chunks(), timeout=30)
    assert response.status_code == 413, response.text
    after = metrics(handle.url)[("assay_requests_total", (("outcome", "rejected_too_large"),))]
    assert after == before + 2
    assert post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 2}).status_code == 200  # still serving


def test_an_oversized_prompt_is_refused_by_its_length_in_characters_without_tokenising_it(door):
    handle, engine = door
    tokenizer = engine.tokenizer
    text = "The quick brown fox jumps over the lazy dog. " * 70_000  # 3.15 M characters, under the 4 MiB door
    started = time.perf_counter()
    tokenizer.encode(text[: len(text) // 16])
    sixteenth_s = time.perf_counter() - started  # tokenising the whole text would take about 16 times this
    normal = []
    for _ in range(3):
        started = time.perf_counter()
        assert post(handle.url, {"prompt": "The quick brown fox", "max_tokens": 1}).status_code == 200
        normal.append(time.perf_counter() - started)
    refused = []
    for _ in range(3):
        started = time.perf_counter()
        response = post(handle.url, {"prompt": text, "max_tokens": 1})
        refused.append(time.perf_counter() - started)
        assert response.status_code == 400
        assert "more than 512 tokens can hold" in _error(response)["message"]
    # The refusal reads the length, not the tokens: no slower than a normal one-token request (with a
    # margin for a shared machine), whatever tokenising this text would have cost.
    print(f"tokenising 1/16 of the prompt {sixteenth_s * 1e3:.0f} ms; a normal request {min(normal) * 1e3:.1f} ms; "
          f"the refusal {min(refused) * 1e3:.1f} ms (3.15 MB of JSON sent and parsed)")
    assert min(refused) < sixteenth_s
    assert min(refused) < 3 * min(normal) + 0.1  # parsing 3 MB of JSON is part of it
    # The same text as a chat message, and as one prompt of a batch, is refused the same way.
    response = httpx.post(f"{handle.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]}, timeout=30)
    assert response.status_code == 400 and "characters" in _error(response)["message"]
    assert post(handle.url, {"prompt": ["hi", text], "max_tokens": 1}).status_code == 400


def test_a_prompt_of_token_ids_over_max_prompt_tokens_is_400(door):
    handle, _ = door
    response = post(handle.url, {"prompt": [5] * 513, "max_tokens": 1})
    assert response.status_code == 400 and "at most 512" in _error(response)["message"]


# ---------------------------------------------------------------- keys


def test_with_an_api_key_every_v1_route_is_401_without_it_and_health_stays_open(locked):
    url = locked.url
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
    requests = [("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": PROMPT_IDS, "max_tokens": 2}),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"authorization": f"Basic {KEY}"}):
        for method, path, body in requests:
            response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)
            assert response.status_code == 401, (headers, path, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            assert KEY not in response.text and "wrong" not in response.text
    good = {"authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{url}/v1/models", headers=good, timeout=10).status_code == 200
    response = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 2}, headers=good, timeout=30)
    assert response.status_code == 200
    scraped = httpx.get(f"{url}/metrics", timeout=10).text
    assert KEY not in scraped and 'outcome="rejected_unauthorized"} 12.0' in scraped


def test_the_openai_client_with_the_key_is_served_and_without_it_is_refused(locked):
    from openai import AuthenticationError, OpenAI

    client = OpenAI(base_url=f"{locked.url}/v1", api_key=KEY, max_retries=0, timeout=30)
    assert client.completions.create(model="gla", prompt=PROMPT_IDS, max_tokens=2, temperature=0).choices[0].finish_reason
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{locked.url}/v1", api_key="sk-other", max_retries=0, timeout=30).models.list()


@pytest.mark.slow
def test_assay_serve_reads_the_key_from_the_environment_and_never_prints_it(zoo_dir):
    env = os.environ.copy() | {"ASSAY_API_KEY": KEY}
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(zoo_dir / "gla"), "--port", "0", "--eager", "--max-seqs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = process.stdout.readline()
        assert "http://" in line, (line, process.stderr.read() if process.poll() is not None else "")
        url = line.rsplit(" ", 1)[-1].strip()
        assert httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT_IDS}, timeout=30).status_code == 401
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 2},
                            headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        assert answer.status_code == 200
        bad = httpx.post(f"{url}/v1/completions", content=json.dumps({"prompt": PROMPT_IDS, "x": 1}),
                         headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        assert bad.status_code == 400 and KEY not in bad.text
        scraped = httpx.get(f"{url}/metrics", timeout=10).text
        process.terminate()
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    for text in (line, stdout, stderr, scraped):
        assert KEY not in text
