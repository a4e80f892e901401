"""`assay serve` on a real pretrained checkpoint (SmolLM2-135M-Instruct, the session's `real_model_dir`),
asked through the official `openai` client over loopback HTTP: real English out, streamed or not; and the
compiled bucket mode on the same model: one warm-up, no compile while serving.

Greedy (temperature 0) float32 decoding of one sequence is deterministic, so the streamed text must equal
the plain one exactly.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
SECOND = "Water boils at a temperature of"


@pytest.fixture(scope="module")
def real_server(real_model_dir):
    # Eager and two slots of 1,024 positions: the test is about the answers, not the compiler.
    with _serve(real_model_dir, "--eager", "--max-seqs", "2", "--max-len", "1024") as server:
        yield server


@contextlib.contextmanager
def _serve(folder, *flags: str):
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(folder), "--port", "0", *flags],
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


def _metrics(url: str) -> dict[str, float]:
    import httpx

    lines = httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))}


def _ask(client, name: str, prompt: str) -> str:
    return client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0).choices[0].text


def test_compiled_buckets_warm_up_once_then_serve_the_eager_text_with_no_compile(real_server, real_model_dir):
    # Buckets 1 and 2, compiled at warm-up before the URL is printed; then one request alone (width 1) and two
    # at once (width 2). Greedy float32 text equals the eager server's. The compiler is aot_eager: what this
    # test is about (warm-up compiles each width once, serving compiles nothing, the widths' slots and steps)
    # is the engine's, whatever the backend; aot_eager's warm-up takes 38 CPU-seconds, inductor's took 88 s to the
    # URL (2 cores). Inductor's decode graphs and their numerics are tested on the zoo (test_decode_gemm.py,
    # test_quantize.py, test_engine.py), and inductor on this model by the probe (test_real_model.py).
    from openai import OpenAI

    name = real_model_dir.name
    eager = OpenAI(base_url=f"{real_server[0]}/v1", api_key="unused", timeout=300, max_retries=0)
    with _serve(real_model_dir, "--backend", "aot_eager", "--buckets", "1,2", "--max-seqs", "2", "--max-len", "512") as (url, announced):
        assert "buckets" in announced and "2 widths compiled" in announced, announced
        after_warm_up = _metrics(url)
        assert after_warm_up['assay_compiles_total{phase="warmup"}'] == 2
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300, max_retries=0)

        alone = _ask(client, name, PROMPT)
        steps_alone = _metrics(url)["assay_decode_steps_total"]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(_ask, [client] * 2, [name] * 2, [PROMPT, SECOND]))
        final = _metrics(url)
        assert final['assay_compiles_total{phase="serving"}'] == 0
        assert final['assay_compile_seconds_total{phase="serving"}'] == 0
        assert final['assay_compiles_total{phase="warmup"}'] == 2
        # 12 tokens each, the first from the prefill: 11 decode steps alone; the pair shared steps (width 2).
        assert steps_alone == 11
        assert final["assay_decode_steps_total"] - steps_alone < 22
    assert [alone, *together] == [_ask(eager, name, PROMPT), _ask(eager, name, PROMPT), _ask(eager, name, SECOND)]
    assert "Paris" in alone
