"""`assay serve` on a real pretrained checkpoint (SmolLM2-135M-Instruct, the session's `real_model_dir`),
asked through the official `openai` client over loopback HTTP: real English out, streamed or not.

Greedy (temperature 0) float32 decoding of one sequence is deterministic, so the streamed text must equal
the plain one exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def real_server(real_model_dir):
    # Eager and two slots of 1,024 positions: the test is about the answers, not the compiler.
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(real_model_dir), "--port", "0", "--eager",
         "--max-seqs", "2", "--max-len", "1024"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    try:
        line = process.stdout.readline()  # the URL, once loaded and warmed up
        if "http://" not in line:
            raise AssertionError(f"no URL from assay serve: {line!r} {process.stderr.read()}")
        yield line.rsplit(" ", 1)[-1].strip(), line
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_openai_client_gets_real_english_streamed_or_not(real_server, real_model_dir):
    from openai import OpenAI

    url, announced = real_server
    assert "llama" in announced and "1024 positions" in announced
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
    assert [model.id for model in client.models.list()] == [real_model_dir.name]

    plain = client.completions.create(model=real_model_dir.name, prompt=PROMPT, max_tokens=12, temperature=0)
    text = plain.choices[0].text
    assert "Paris" in text, text
    assert plain.usage.prompt_tokens == 5 and plain.usage.completion_tokens <= 12

    stream = client.completions.create(model=real_model_dir.name, prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert streamed == text
