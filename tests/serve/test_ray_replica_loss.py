"""An engine replica SIGKILLed under load loses no request: `assay serve --executor ray --replicas 2 --max-seqs 1`
over the tiny Qwen3, 40 requests of 128 tokens (one in four streamed), 16 at a time, the replica running the
most killed at a random moment while at least 8 are unfinished: frozen first, so that the router's count of
what it holds is current, and killed when that is three or more (one slot each: the rest wait in its queue, so
its requests outlast the router's lag behind it). Rounds on fresh requests once Ray Serve has restarted it, up
to four, until a kill finds a non-streamed request unfinished there. Every non-streamed
request answers 200 with its 128 tokens, and those that were run again (X-Assay-Reruns) give the text of an
unbroken run; every stream ends with [DONE] (or an error event), the openai client sees no protocol error,
and the streams that ended give the unbroken run's text too, greedy or seeded. /health turns degraded,
/metrics counts the losses and the reruns; with every engine replica killed, a request gets 503 with
Retry-After. Expected texts come from an engine decoding the prompts in one process (greedy float32
decoding of independent rows is exact, so the texts must be equal, not close)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serve.test_http import metrics

from assay.serve import Engine, EngineConfig, run_to_completion
from assay.serve.ray.deployment import replica_processes

# 128 tokens: a request runs long enough that the kill lands while its tokens are still being made.
REQUESTS, CONCURRENCY, MAX_TOKENS = 40, 16, 128
PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300], [11, 12, 13, 14, 15], [42, 43, 44]]
SEED, TEMPERATURE = 1234, 0.8
STAGGER_S = 0.05  # between the first wave's starts: their ends spread over a few decode steps
SETTLE_S = 0.5  # a frozen replica's count unchanged this long: the router has read all it sent
MAX_ROUNDS = 4  # rounds, each on a fresh set of requests, until a kill finds a non-streamed request unfinished


def expected_texts(zoo_dir) -> dict[tuple[int, str], str]:
    """(prompt index, "greedy" | "seeded") -> the text of an unbroken run, end-of-text ignored as the requests ask."""
    engine = Engine.from_checkpoint(zoo_dir / "qwen3-pretrained", EngineConfig(max_seqs=8, eager=True, max_len=256))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"{i}/greedy", prompt, max_tokens=MAX_TOKENS)
        engine.add_request(f"{i}/seeded", prompt, max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=SEED + i)
    tokens = run_to_completion(engine)
    return {(int(key.split("/")[0]), key.split("/")[1]): engine.tokenizer.decode(ids, skip_special_tokens=True)
            for key, ids in tokens.items()}


def streamed(i: int) -> bool:
    # One in four: the killed replica then runs a non-streamed request all but surely (the check below).
    return i % 4 == 3


def prompt_index(i: int) -> int:
    return (i + i // 4) % len(PROMPTS)


def body(i: int) -> dict:
    """Request i: greedy; a stream is seeded every other time."""
    seeded = streamed(i) and (i // 4) % 2 == 1
    sampling = {"temperature": TEMPERATURE, "seed": SEED + prompt_index(i)} if seeded else {"temperature": 0}
    return {"prompt": PROMPTS[prompt_index(i)], "max_tokens": MAX_TOKENS, "ignore_eos": True, **sampling}


def sse_stream(url: str, request: dict) -> tuple[str, str]:
    """(text, how it ended: "done" | "error"), read line by line; a broken body raises."""
    text, ended = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=request | {"stream": True}, timeout=180) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line:
                continue
            assert ended in (None, "error"), f"an event after the end: {line}"
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                ended = "done"
            elif '"error"' in payload and payload.startswith('{"error"'):
                ended = "error"
            else:
                text += [choice["text"] for choice in json.loads(payload)["choices"]]
    assert ended is not None, "the stream closed without [DONE] or an error event"
    return "".join(text), ended


@pytest.mark.slow
@pytest.mark.distributed  # a Ray instance, its controller, proxy, the router and two engine replicas
def test_an_engine_replica_killed_under_load_loses_no_request(zoo_dir):
    expected = expected_texts(zoo_dir)
    ray_tmp = tempfile.mkdtemp(prefix="assay-ray-", dir="/tmp")  # short: Ray's socket paths are limited
    env = os.environ.copy() | {"RAY_ADDRESS": "", "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    # The server with torch's own thread count, as a user starts it: the suite's one thread per process (tests/conftest.py)
    # makes the replicas outpace a router slowed by the machine's load, which then still counts requests a replica has
    # finished, and a kill can find nothing to run again.
    env.pop("OMP_NUM_THREADS", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(zoo_dir / "qwen3-pretrained"), "--eager", "--max-seqs", "1",
         "--max-len", "256", "--port", "0", "--executor", "ray", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True,
    )
    try:
        line = process.stdout.readline()
        assert "2 replicas" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        replicas = replica_processes(process.pid)  # {replica id: pid}
        assert len(replicas) == 2
        assert wait_for_health(url, "ok") == (200, "ok")  # the router's view of the replicas trails the controller's by a poll
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=180)
        # A kill lands at a random moment, so it can find the victim's unfinished requests all streamed: then the round
        # proves no loss but no rerun of a whole answer, and the replica is killed again once Ray Serve has restarted
        # it, on a fresh set of requests.
        kills, plain_reruns = [], []
        for round_number in range(MAX_ROUNDS):
            if round_number:
                assert wait_for_health(url, "ok") == (200, "ok")
                replicas = replica_processes(process.pid)
                assert len(replicas) == 2, replicas
            kill, plain = one_round(url, client, replicas, expected)
            kills += [kill] if kill else []
            plain_reruns += [i for i, r in plain.items() if r[3]]
            if plain_reruns:
                break
        assert plain_reruns, f"no non-streamed request was on a killed replica in {MAX_ROUNDS} rounds ({kills})"
        scraped = metrics(url)
        assert scraped[("assay_replica_losses_total", ())] >= len(kills)
        reruns = sum(scraped[("assay_requests_rerun_total", (("sent", s),))] for s in ("none", "tokens"))
        assert reruns >= len(plain_reruns)

        # Every engine replica killed: a request gets 503 and Retry-After at once, not a 500 or a hang. First both
        # running again (a replica Ray Serve is still starting after the kill above would answer after this one).
        assert wait_for_health(url, "ok") == (200, "ok")
        live = replica_processes(process.pid)
        assert len(live) == 2, live
        # The controller notices each death on its own schedule and restarts the replica at once: a replica it
        # restarted before noticing the other's death would keep one live. So every replica process, old or
        # new, is killed as soon as it appears, until the 503 has come back.
        killing = threading.Event()
        killer = threading.Thread(target=kill_replicas_until, args=(process.pid, killing), daemon=True)
        killer.start()
        try:
            assert wait_for_health(url, "unavailable") == (503, "unavailable")
            refused = httpx.post(f"{url}/v1/completions", json=body(0), timeout=30)
        finally:
            killing.set()
            killer.join()
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1, refused.text
        assert refused.json()["error"]["type"] == "server_error"

        assert stop(process) == 0
    finally:
        stop(process)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def one_round(url: str, client: openai.OpenAI, replicas: dict[str, int], expected) -> tuple[dict, dict[int, tuple]]:
    """REQUESTS requests, CONCURRENCY at a time, one replica SIGKILLed among them (when a frozen one has three or
    more unfinished there): every answer whole and unbroken, /health degraded after the kill. (the kill, or {}
    when none was made, {request index: ("plain", text, tokens, reruns)})."""
    in_flight, finished, lock = [0], [0], threading.Lock()
    results: dict[int, tuple] = {}

    def ask(i: int) -> None:
        # The first wave starts staggered: requests of one length started together end together, and a kill
        # that lands between two such waves finds nothing running (the next wave still in Ray's queue).
        time.sleep(STAGGER_S * i if i < CONCURRENCY else 0)
        with lock:
            in_flight[0] += 1
        try:
            request = body(i)
            extra = {"ignore_eos": True}
            sampling = {k: request[k] for k in ("temperature", "seed") if k in request}
            if not streamed(i):  # through the openai client, with the response's headers
                raw = client.completions.with_raw_response.create(model="qwen3-pretrained", prompt=request["prompt"],
                                                                  max_tokens=MAX_TOKENS, extra_body=extra, **sampling)
                completion = raw.parse()
                results[i] = ("plain", completion.choices[0].text, completion.usage.completion_tokens,
                              int(raw.headers.get("x-assay-reruns", "0")))
            elif (i // 8) % 2 == 0:  # streamed, through the openai client: an error event is its APIError
                try:
                    chunks = client.completions.create(model="qwen3-pretrained", prompt=request["prompt"], max_tokens=MAX_TOKENS,
                                                       stream=True, extra_body=extra, **sampling)
                    results[i] = ("stream", "".join(c.choices[0].text for c in chunks if c.choices), "done")
                except openai.APIError as exc:
                    assert not isinstance(exc, openai.APIConnectionError), exc
                    results[i] = ("stream", "", "error")
            else:  # streamed, read line by line: [DONE] or an error event, nothing after
                results[i] = ("stream", *sse_stream(url, request))
        finally:
            with lock:
                in_flight[0] -= 1
                finished[0] += 1

    kill = {}
    health: list[str] = []

    def killer() -> None:
        # A random moment while the pool keeps CONCURRENCY requests going (once a random number of requests,
        # short of the last waves, have finished), the victim the replica the router says runs the most (Ray's
        # routing can leave most requests on one replica). The router's counts trail the replicas under load (a
        # request a replica has finished still counts until the router has read its last tokens), so the victim is
        # first frozen (SIGSTOP): it can finish nothing more, the router drains what it already sent, and its count
        # settles on the requests really unfinished there. Three or more: SIGKILL; fewer: it runs on (SIGCONT).
        after = random.randrange(0, REQUESTS - 2 * CONCURRENCY)
        deadline = time.monotonic() + 300
        running = {}
        # The test's own view of /health, on one kept-alive connection: a poll that Ray's proxy drops (it can
        # under load, a new connection every 20 ms) is polled again; what the clients get is asserted below.
        with httpx.Client(timeout=30) as poller:
            def poll() -> dict | None:
                try:
                    return poller.get(f"{url}/health").json()
                except httpx.TransportError:
                    return None

            def settled(victim: str) -> dict:
                """The router's counts once the frozen victim's has stayed the same for SETTLE_S."""
                counts = (poll() or {"replicas": {"running": running}})["replicas"]["running"]
                since = time.monotonic()
                while time.monotonic() - since < SETTLE_S and time.monotonic() < deadline:
                    time.sleep(0.05)
                    latest = (poll() or {"replicas": {"running": counts}})["replicas"]["running"]
                    if latest.get(victim, 0) != counts.get(victim, 0):
                        since = time.monotonic()
                    counts = latest
                return counts

            # Eight or more requests can be unfinished until all but eight have finished.
            while not kill and finished[0] <= REQUESTS - 8 and time.monotonic() < deadline:
                running = (poll() or {"replicas": {"running": running}})["replicas"]["running"]
                if finished[0] < after or in_flight[0] < 8 or max(running.values(), default=0) < 3:
                    time.sleep(0.02)
                    continue
                victim = max(replicas, key=lambda replica: running.get(replica, 0))
                os.kill(replicas[victim], signal.SIGSTOP)
                frozen_with = in_flight[0]  # the moment chosen: the clients' unfinished requests then
                running = settled(victim)
                if running.get(victim, 0) >= 3:
                    os.kill(replicas[victim], signal.SIGKILL)
                    kill.update(replica=victim, in_flight=frozen_with, running=running, after=after)
                else:
                    os.kill(replicas[victim], signal.SIGCONT)
                    time.sleep(0.2)
            while kill and "degraded" not in health and time.monotonic() < deadline:
                health.append((poll() or {"status": "unanswered"})["status"])
                time.sleep(0.2)

    watcher = threading.Thread(target=killer, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(ask, range(REQUESTS), timeout=600))
    watcher.join(90)

    if kill:  # none when the victim had nothing unfinished each time it was frozen: a round with no loss
        assert kill["in_flight"] >= 8 and kill["running"].get(kill["replica"], 0) >= 3, kill
        assert "degraded" in health, health
    assert len(results) == REQUESTS
    plain = {i: r for i, r in results.items() if r[0] == "plain"}
    assert all(tokens == MAX_TOKENS for _, _, tokens, _ in plain.values())
    assert all(text == expected[(prompt_index(i), "greedy")] for i, (_, text, _, _) in plain.items())
    streams = {i: r for i, r in results.items() if r[0] == "stream"}
    for i, (_, text, ended) in streams.items():
        mode = "seeded" if "seed" in body(i) else "greedy"
        assert ended == "error" or text == expected[(prompt_index(i), mode)], (i, mode)
    return kill, plain


def kill_replicas_until(server_pid: int, done: threading.Event) -> None:
    """SIGKILL every engine replica process of the server, again every 0.2 s, until `done` is set."""
    while not done.is_set():
        for pid in replica_processes(server_pid).values():
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.kill(pid, signal.SIGKILL)
        done.wait(0.2)


def wait_for_health(url: str, status: str, timeout_s: float = 60.0) -> tuple[int, str]:
    """Poll /health until its status is `status` (or timeout_s passes); (HTTP status, its status) then."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{url}/health", timeout=30)
        if response.json()["status"] == status or time.monotonic() > deadline:
            return response.status_code, response.json()["status"]
        time.sleep(0.1)


def stop(process: subprocess.Popen) -> int:
    """SIGINT (the server shuts Serve and its Ray instance down); SIGKILL to its whole session after 120 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


@pytest.mark.slow  # a real `assay serve` process: its start-up is the point
def test_the_single_process_eager_server_imports_neither_ray_nor_the_compiler(zoo_dir, tmp_path):
    # PYTHONPROFILEIMPORTTIME (python -X importtime) lists every module the process imported on stderr
    # (to a file: a pipe nobody reads while the server starts would fill and block it).
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "assay", "serve", "--model", str(zoo_dir / "qwen3-pretrained"), "--eager", "--max-seqs", "2", "--port", "0"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=os.environ | {"PYTHONPROFILEIMPORTTIME": "1"},
        )
    try:
        line = process.stdout.readline()
        assert "serving" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 4, "stream": True}, timeout=60)
        assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    imported = {line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines() if line.startswith("import time:")}
    assert {"assay.serve.http.app", "assay.serve.engine.loop", "fastapi"} <= imported
    assert not {m for m in imported if m == "ray" or m.startswith("ray.")}, "the single-process server imported Ray"
    # An eager server compiles nothing and builds no Transformers model: dynamo and inductor (about 1.3 and 1.2
    # CPU-seconds to import) and Transformers' modeling code (about 2) stay out of its start-up.
    assert not {"torch._dynamo", "torch._inductor", "transformers.modeling_utils"} & imported, "an eager server imported them"
