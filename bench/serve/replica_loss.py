"""A replica lost under load: `assay serve --executor ray`, one engine replica SIGKILLed while requests are in
flight, and what every client got.

    python bench/serve/replica_loss.py [--requests 200] [--concurrency 16] [--max-tokens 256] [--replicas 2]
        [--zoo DIR] [--out bench/results/serve_replica_loss.json]     -> exit 1 when a target is missed

The server is a subprocess over the tiny zoo Qwen3 (eager, 8 slots per replica, its own Ray instance in a
temp dir). Requests cycle over four prompts, every other one streamed (the streams alternate greedy and
seeded sampling; the non-streamed ones are greedy), all with ignore_eos so each asks for exactly
--max-tokens tokens. At a random moment while --concurrency requests are unfinished (once a random number of
requests have finished, short of the last two waves), one engine replica gets SIGKILL: the one running the
most requests (as the router's /health counts them). Expected texts come from an engine in this process decoding the
prompts unbroken.

Targets: every non-streamed request returns 200 with --max-tokens tokens; every stream ends with [DONE] or
an error event; none hangs (no whole answer within 300 s); the killed replica is back and /health not
degraded within 60 s of the kill; every non-streamed request run again returns the unbroken run's text.
Also recorded: streams resumed and exact, /metrics' losses and reruns, the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

from assay.core.files import atomic_write_json
from assay.serve.ray.deployment import replica_processes
from bench.common import RESULTS
PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300], [11, 12, 13, 14, 15], [42, 43, 44]]
SEED, TEMPERATURE = 1234, 0.8
HANG_S = 300.0


def expected_texts(model: Path, max_tokens: int) -> dict[tuple[int, str], str]:
    from assay.serve import Engine, EngineConfig, run_to_completion

    engine = Engine.from_checkpoint(model, EngineConfig(max_seqs=8, eager=True, max_len=512))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"{i}/greedy", prompt, max_tokens=max_tokens)
        engine.add_request(f"{i}/seeded", prompt, max_tokens=max_tokens, temperature=TEMPERATURE, seed=SEED + i)
    tokens = run_to_completion(engine)
    return {(int(k.split("/")[0]), k.split("/")[1]): engine.tokenizer.decode(ids, skip_special_tokens=True) for k, ids in tokens.items()}


def body(i: int, max_tokens: int) -> tuple[dict, str]:
    seeded = i % 2 == 1 and (i // 2) % 2 == 1
    sampling = {"temperature": TEMPERATURE, "seed": SEED + i % len(PROMPTS)} if seeded else {"temperature": 0}
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "ignore_eos": True, **sampling}, "seeded" if seeded else "greedy"


def ask(url: str, i: int, max_tokens: int) -> dict:
    request, mode = body(i, max_tokens)
    record = {"index": i, "mode": mode, "streamed": i % 2 == 1, "start": time.monotonic()}
    try:
        if not record["streamed"]:
            response = httpx.post(f"{url}/v1/completions", json=request, timeout=HANG_S)
            record |= {"status": response.status_code, "reruns": int(response.headers.get("x-assay-reruns", "0")),
                       "server": response.headers.get("x-assay-server")}
            if response.status_code == 200:
                answer = response.json()
                record |= {"text": answer["choices"][0]["text"], "tokens": answer["usage"]["completion_tokens"]}
        else:
            texts, ended = [], None
            with httpx.stream("POST", f"{url}/v1/completions", json=request | {"stream": True}, timeout=HANG_S) as response:
                record |= {"status": response.status_code, "server": response.headers.get("x-assay-server")}
                for line in response.iter_lines():
                    payload = line.removeprefix("data: ")
                    if not payload:
                        continue
                    if ended is not None and ended != "error":
                        ended = "event after [DONE]"
                    elif payload == "[DONE]":
                        ended = "done" if ended is None else "error"
                    elif payload.startswith('{"error"'):
                        ended = "error"
                    else:
                        texts += [c["text"] for c in json.loads(payload)["choices"]]
            record |= {"text": "".join(texts), "ended": ended or "cut"}
    except httpx.TimeoutException:
        record["hung"] = True
    except httpx.HTTPError as exc:
        record["broken"] = f"{type(exc).__name__}: {exc}"
    record["end"] = time.monotonic()
    return record


def run(args) -> dict:
    from assay.zoo import build_zoo

    zoo = Path(args.zoo or os.environ.get("ASSAY_TEST_ZOO") or Path.home() / ".cache" / "assay" / "bench_zoo")
    build_zoo(zoo, names=["qwen3-pretrained"], progress=False)
    model = zoo / "qwen3-pretrained"
    expected = expected_texts(model, args.max_tokens)
    ray_tmp = tempfile.mkdtemp(prefix="assay-ray-", dir="/tmp")
    env = os.environ.copy() | {"RAY_ADDRESS": "", "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    server_log = open(Path(ray_tmp) / "server.log", "w")  # the server's stderr: shown when it fails
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(model), "--eager", "--max-seqs", "8", "--max-len", "512",
         "--port", "0", "--executor", "ray", "--replicas", str(args.replicas)],
        stdout=subprocess.PIPE, stderr=server_log, text=True, env=env, start_new_session=True)
    try:
        line = process.stdout.readline()
        if "replicas" not in line:
            raise SystemExit(f"the server did not start: {line!r}")
        url = line.rsplit(" ", 1)[-1].strip()
        replicas = replica_processes(process.pid)  # {replica id: pid}
        in_flight, finished, lock, kill, health = [0], [0], threading.Lock(), {}, []
        started = time.monotonic()

        def tracked(i: int) -> dict:
            with lock:
                in_flight[0] += 1
            try:
                return ask(url, i, args.max_tokens)
            finally:
                with lock:
                    in_flight[0] -= 1
                    finished[0] += 1

        def killer() -> None:
            # A random moment while the pool keeps --concurrency requests going (once a random number of
            # requests, short of the last two waves, have finished), the victim the replica the router last said
            # runs the most (Ray's routing can leave most requests on one replica).
            after = random.randrange(0, max(args.requests - 2 * args.concurrency, 1))
            running = {}
            while finished[0] < after or not running:
                running = httpx.get(f"{url}/health", timeout=30).json()["replicas"]["running"]
                time.sleep(0.02)
            victim = max(replicas, key=lambda replica: running.get(replica, 0))
            os.kill(replicas[victim], signal.SIGKILL)
            kill.update(replica=victim, at_s=time.monotonic() - started, in_flight=in_flight[0], running=running, after=after,
                        monotonic=time.monotonic())
            while time.monotonic() - kill["monotonic"] < 120:
                status = httpx.get(f"{url}/health", timeout=30).json()
                health.append((time.monotonic() - kill["monotonic"], status["status"]))
                if status["status"] == "ok" and any(s == "degraded" for _, s in health):
                    break
                time.sleep(0.25)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        with ThreadPoolExecutor(args.concurrency) as pool:
            records = list(pool.map(tracked, range(args.requests)))
        thread.join(180)
        scraped = httpx.get(f"{url}/metrics", timeout=30).text
        process.send_signal(signal.SIGINT)
        process.wait(120)
    except BaseException:
        print((Path(ray_tmp) / "server.log").read_text()[-5000:], file=sys.stderr)
        raise
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        server_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return report(args, records, expected, kill, health, scraped, time.monotonic() - started)


def _count(servers) -> dict[str, int]:
    counts: dict[str, int] = {}
    for server in servers:
        counts[str(server)] = counts.get(str(server), 0) + 1
    return counts


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def report(args, records, expected, kill, health, scraped, wall_s) -> dict:
    plain = [r for r in records if not r["streamed"]]
    streams = [r for r in records if r["streamed"]]
    exact = lambda r: r.get("text") == expected[(r["index"] % len(PROMPTS), r["mode"])]  # noqa: E731
    rerun = [r for r in plain if r.get("reruns")]
    back = next((t for t, s in health if s == "ok" and any(s2 == "degraded" for t2, s2 in health if t2 < t)), None)
    figures = {
        "plain": len(plain), "plain_200_full": sum(r.get("status") == 200 and r.get("tokens") == args.max_tokens for r in plain),
        "plain_rerun": len(rerun), "plain_rerun_exact": sum(map(exact, rerun)), "plain_exact": sum(map(exact, plain)),
        "streams": len(streams), "streams_done": sum(r.get("ended") == "done" for r in streams),
        "streams_error_event": sum(r.get("ended") == "error" for r in streams),
        "streams_done_exact": sum(exact(r) for r in streams if r.get("ended") == "done"),
        "hung": sum(bool(r.get("hung")) for r in records), "broken": [r["broken"] for r in records if r.get("broken")],
        "kill": {k: v for k, v in kill.items() if k != "monotonic"}, "degraded_seen": any(s == "degraded" for _, s in health),
        "healthy_again_s": back, "replica_losses": _metric(scraped, "assay_replica_losses_total"),
        "requests_rerun": _metric(scraped, "assay_requests_rerun_total"),
        "requests_rerun_after_tokens_sent": _metric(scraped, 'assay_requests_rerun_total{sent="tokens"}'), "wall_s": round(wall_s, 1),
        # Which replica had accepted each request unfinished at the kill (X-Assay-Server), and every request's.
        "in_flight_at_kill_by_replica": _count(r.get("server") for r in records if r["start"] <= kill.get("monotonic", 0) < r["end"]),
        "requests_by_replica": _count(r.get("server") for r in records),
    }
    targets = {
        "every non-streamed request 200 with all its tokens": figures["plain_200_full"] == len(plain),
        "every stream ends with [DONE] or an error event": figures["streams_done"] + figures["streams_error_event"] == len(streams),
        "none hangs or breaks": figures["hung"] == 0 and not figures["broken"],
        "killed with at least 8 unfinished": kill.get("in_flight", 0) >= 8,
        "healthy (not degraded) again within 60 s": back is not None and back <= 60,
        "every rerun non-streamed request gives the unbroken text": figures["plain_rerun_exact"] == len(rerun),
    }
    return {"config": vars(args), "figures": figures, "targets": targets, "loadavg": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--zoo", default=None)
    parser.add_argument("--out", default=str(RESULTS / "serve_replica_loss.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = run(args) | {"loadavg_before": load_before}
    atomic_write_json(Path(args.out), result)
    print(json.dumps(result["figures"], indent=1))
    for target, met in result["targets"].items():
        print(f"{'met   ' if met else 'MISSED'} {target}")
    sys.exit(0 if all(result["targets"].values()) else 1)


if __name__ == "__main__":
    main()
