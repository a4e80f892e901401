"""`assay serve --executor ray --replicas 2`: a local Ray instance (started by the command itself, in its
own temp dir), two engine replicas behind Ray Serve's proxy. Everything the single server does works
through it (the API key, completions plain and streamed, chat, a batch with n choices and logprobs),
requests land on both replicas and get the answers a single engine gives, and /metrics is the sum over
both replicas, exact right after the answers; SIGINT shuts Serve and the local instance down."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest
from serve.test_http import PROMPT_IDS, metrics, post, reference_engine, stream
from serve.test_openai_chat import CHATML

KEY = "sk-ray-replicas-1234"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.mark.distributed  # a Ray instance, its controller, proxy and two replica processes
def test_two_ray_serve_replicas_share_the_requests_and_metrics_sum_them(zoo_dir, tmp_path):
    model = tmp_path / "qwen3-chat"  # the tiny Qwen3 with a chat template, as in test_openai_chat.py
    shutil.copytree(zoo_dir / "qwen3-pretrained", model)
    (model / "chat_template.jinja").write_text(CHATML)
    expected = reference_engine(zoo_dir, "qwen3-pretrained", max_len=256)
    # A short temp root: Ray's unix sockets live under it and their paths are limited to ~107 characters.
    ray_tmp = tempfile.mkdtemp(prefix="assay-ray-", dir="/tmp")
    env = os.environ.copy() | {"RAY_ADDRESS": "", "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0", "ASSAY_API_KEY": KEY}
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(model), "--eager", "--max-seqs", "2", "--max-len", "256",
         "--port", "0", "--executor", "ray", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        line = process.stdout.readline()  # after both replicas are up
        assert "2 replicas" in line and "http://" in line, (line, process.stderr.read() if process.poll() is not None else "")
        url = line.rsplit(" ", 1)[-1].strip()
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200  # open without the key
        assert post(url, {"prompt": PROMPT_IDS}, timeout=60).status_code == 401

        answers: list[tuple[str, str, str]] = []  # (server, text, kind)
        lock = threading.Lock()

        def ask(index: int) -> None:
            body = {"prompt": PROMPT_IDS, "max_tokens": 16, "temperature": 0}
            if index % 2:
                response = stream(url, body, timeout=120, headers=AUTH)
                assert response.status == 200 and response.done_count == 1 and len(response.finish_reasons) == 1
                with lock:
                    answers.append((response.server, response.text, "stream"))
            else:
                response = post(url, body, timeout=120, headers=AUTH)
                assert response.status_code == 200, response.text
                with lock:
                    answers.append((response.headers["x-assay-server"], response.json()["choices"][0]["text"], "plain"))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert len(answers) == 16
        assert len({server for server, _, _ in answers}) == 2, "every request landed on one replica"
        want = expected(PROMPT_IDS, 16).text
        assert all(text == want for _, text, _ in answers)

        chat = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, timeout=120,
                          json={"messages": [{"role": "user", "content": "The quick brown fox"}], "max_tokens": 4, "temperature": 0})
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"
        # Structured outputs through the router: the grammar is pickled to a replica and compiled again there.
        schema = {"type": "object", "required": ["ok"], "additionalProperties": False, "properties": {"ok": {"type": "boolean"}}}
        shaped = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, timeout=120, json={
            "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 16, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema, "strict": True}}})
        assert shaped.status_code == 200 and isinstance(json.loads(shaped.json()["choices"][0]["message"]["content"])["ok"], bool)
        batch = post(url, {"prompt": [PROMPT_IDS, [100, 200]], "max_tokens": 3, "temperature": 0, "n": 2, "logprobs": 1},
                     timeout=120, headers=AUTH)
        assert [c["index"] for c in batch.json()["choices"]] == [0, 1, 2, 3]
        assert all(len(c["logprobs"]["token_logprobs"]) == len(c["logprobs"]["tokens"]) >= 1 for c in batch.json()["choices"])

        # Right after the answers, whichever replica answers the scrape: 16 + 2 chats + 2 prompts x n=2 choices.
        scraped = metrics(url)
        finished = sum(scraped[("assay_requests_total", (("outcome", o),))] for o in ("length", "stop"))
        assert finished == 16 + 2 + 4
        assert scraped[("assay_replicas", ())] == 2
        assert scraped[("assay_slots", ())] == 4 and scraped[("assay_free_slots", ())] == 4
        assert scraped[("assay_requests_total", (("outcome", "rejected_unauthorized"),))] == 1
        assert scraped[("assay_ttft_seconds_count", ())] == 16 + 2 + 4

        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-3000:]
        assert stdout.strip().endswith("stopped")
        assert KEY not in stdout + stderr
        # Nor in any log Ray wrote (controller, proxy, replicas) under its temp dir.
        logs = [path for path in Path(ray_tmp).rglob("*") if path.is_file() and path.suffix in (".log", ".out", ".err", ".json")]
        assert len(logs) > 10 and not [path for path in logs if KEY.encode() in path.read_bytes()]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
