"""vLLM's serving benchmark client (`vllm bench serve --backend openai` and `--backend openai-chat`) against a
real `assay serve` process on loopback: its exact payloads, several at once, read the way it reads them.

The payloads and the reading are those of vLLM's vllm/benchmarks/lib/endpoint_request_func.py (0.32):
completions send `repetition_penalty: 1.0`, `logprobs: null`, `max_tokens`; chat sends `max_completion_tokens`
and the content as a list of text parts; both stream with `stream_options.include_usage`, add `ignore_eos`
under --ignore-eos and an `x-request-id` header. A request counts as a success when the answer is 200 and
at least one SSE message carries choices; the usage chunk gives the output length. The client itself is
run against the real SmolLM2 in docs/serve.md ("vLLM's benchmark client").
"""

from __future__ import annotations

import codecs
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
from serve.test_openai_chat import CHATML

NAME = "bench-model"
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived",
    "def fibonacci(n):",
    "Water boils at",
    "A list of prime numbers: 2, 3, 5, 7,",
    "The history of the printing press begins",
    "In mathematics, a group is",
    "Hello",
]


@pytest.fixture(scope="module")
def server(zoo_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench") / "qwen3-chat"
    shutil.copytree(zoo_dir / "qwen3-pretrained", folder)
    (folder / "chat_template.jinja").write_text(CHATML)
    # The defaults of a CPU (eager), 4 slots: 8 requests at once queue for them.
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(folder), "--port", "0", "--max-seqs", "4", "--max-len", "256",
         "--served-model-name", NAME],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    line = process.stdout.readline()
    try:
        assert "http://" in line, f"{line!r} {process.stderr.read() if process.poll() is not None else ''}"
        yield line.rsplit(" ", 1)[-1].strip()
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0 and "Traceback" not in stderr, stderr


def completions_payload(prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    payload = {"model": NAME, "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": max_tokens, "logprobs": None,
               "stream": True, "stream_options": {"include_usage": True}}
    return payload | ({"ignore_eos": True} if ignore_eos else {})


def chat_payload(prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    payload = {"model": NAME, "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
               "max_completion_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    return payload | ({"ignore_eos": True} if ignore_eos else {})


@dataclass
class Output:
    """What vLLM's RequestFuncOutput records of one request, and what it saw of the stream."""

    status: int
    messages: list[str] = field(default_factory=list)  # every SSE message, in order
    success: bool = False  # 200 and a message with choices
    text: str = ""
    output_tokens: int | None = None  # usage.completion_tokens
    prompt_len: int | None = None  # usage.prompt_tokens


def _messages(buffer: str, decoded: str) -> tuple[list[str], str]:
    """vLLM's StreamedResponseHandler.add_chunk: messages split on blank lines; a last one kept back until it is
    [DONE] or whole JSON."""
    buffer += decoded
    messages = []
    while "\n\n" in buffer:
        message, buffer = buffer.split("\n\n", 1)
        if message.strip():
            messages.append(message.strip())
    if buffer.startswith("data: "):
        content = buffer.removeprefix("data: ").strip()
        try:
            if content == "[DONE]" or (content and json.loads(content) is not None):
                messages.append(buffer.strip())
                buffer = ""
        except json.JSONDecodeError:
            pass
    return messages, buffer


def vllm_request(url: str, route: str, payload: dict) -> Output:
    """One request as vLLM's async_request_openai_completions / _chat_completions makes it and reads it."""
    headers = {"x-request-id": str(uuid.uuid4())} | ({"Content-Type": "application/json"} if route == "chat/completions" else {})
    with httpx.stream("POST", f"{url}/v1/{route}", json=payload, headers=headers, timeout=120) as response:
        output = Output(response.status_code)
        if response.status_code != 200:
            response.read()
            return output
        decoder, buffer, first = codecs.getincrementaldecoder("utf-8")(), "", False
        for chunk_bytes in response.iter_bytes():
            chunk_bytes = chunk_bytes.strip()
            if not chunk_bytes:
                continue
            messages, buffer = _messages(buffer, decoder.decode(chunk_bytes))
            output.messages += messages
            for message in messages:
                if message.startswith(":"):
                    continue
                chunk = message.removeprefix("data: ")
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if choices := data.get("choices"):
                    first = True
                    output.text += (choices[0].get("text") if route == "completions" else choices[0]["delta"].get("content")) or ""
                elif usage := data.get("usage"):
                    output.output_tokens, output.prompt_len = usage.get("completion_tokens"), usage.get("prompt_tokens")
        output.success = first
    return output


@pytest.mark.parametrize("ignore_eos", [True, False], ids=["ignore-eos", "eos"])
@pytest.mark.parametrize("route, build", [("completions", completions_payload), ("chat/completions", chat_payload)],
                         ids=["openai", "openai-chat"])
def test_vllm_bench_serve_payloads_all_succeed(server, route, build, ignore_eos):
    assert httpx.get(f"{server}/v1/models", timeout=30).json()["data"][0]["id"] == NAME
    max_tokens = [16, 5, 24, 1, 12, 16, 8, 20]
    # The client's test request first, alone; then the benchmark's requests, all at once.
    outputs = [vllm_request(server, route, build(PROMPTS[0], max_tokens[0], ignore_eos))]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        outputs += list(pool.map(lambda args: vllm_request(server, route, build(*args, ignore_eos)), zip(PROMPTS, max_tokens)))
    max_tokens = [max_tokens[0], *max_tokens]
    failed = [o for o in outputs if not o.success or o.status != 200]
    assert failed == [], failed
    for output, wanted in zip(outputs, max_tokens):
        assert output.messages[-1] == "data: [DONE]" and output.messages.count("data: [DONE]") == 1
        assert output.prompt_len and output.prompt_len > 0
        if ignore_eos:
            assert output.output_tokens == wanted, (output.output_tokens, wanted)
        else:
            assert 1 <= output.output_tokens <= wanted
    metrics = httpx.get(f"{server}/metrics", timeout=30).text
    assert 'assay_requests_total{outcome="rejected_invalid"} 0.0' in metrics
