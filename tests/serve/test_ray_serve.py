"""`assay serve --executor ray --replicas 2`: a local Ray instance (started by the command itself, in its
own temp dir), two engine replicas behind Ray Serve's proxy; requests land on both and get the answers a
single engine gives; SIGINT shuts Serve and the local instance down."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest
from serve.test_http import PROMPT_IDS, post, reference_engine, stream


@pytest.mark.distributed  # a Ray instance, its controller, proxy and two replica processes
def test_two_ray_serve_replicas_share_the_requests(zoo_dir):
    expected = reference_engine(zoo_dir)
    # A short temp root: Ray's unix sockets live under it and their paths are limited to ~107 characters.
    ray_tmp = tempfile.mkdtemp(prefix="assay-ray-", dir="/tmp")
    env = os.environ.copy() | {"RAY_ADDRESS": "", "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(zoo_dir / "gla"), "--eager", "--max-seqs", "2",
         "--port", "0", "--executor", "ray", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        line = process.stdout.readline()  # after both replicas are up
        assert "2 replicas" in line and "http://" in line, (line, process.stderr.read() if process.poll() is not None else "")
        url = line.rsplit(" ", 1)[-1].strip()

        answers: list[tuple[str, str, str]] = []  # (server, text, kind)
        lock = threading.Lock()

        def ask(index: int) -> None:
            body = {"prompt": PROMPT_IDS, "max_tokens": 16, "temperature": 0}
            if index % 2:
                response = stream(url, body, timeout=120)
                assert response.status == 200 and response.done_count == 1 and len(response.finish_reasons) == 1
                with lock:
                    answers.append((response.server, response.text, "stream"))
            else:
                response = post(url, body, timeout=120)
                assert response.status_code == 200, response.text
                with lock:
                    answers.append((response.headers["x-assay-server"], response.json()["choices"][0]["text"], "plain"))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert len(answers) == 12
        assert len({server for server, _, _ in answers}) == 2, "every request landed on one replica"
        want = expected(PROMPT_IDS, 16).text
        assert all(text == want for _, text, _ in answers)

        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-3000:]
        assert stdout.strip().endswith("stopped")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
