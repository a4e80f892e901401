"""Serving soak: the real `assay serve` under mixed, bounded and hostile clients for minutes.

    python bench/serve/soak.py [--minutes 10] [--model qwen3|gla|FOLDER] [--zoo DIR]
        -> bench/results/serve_soak.json and serve_soak.png; exit 1 on a hard failure

The server is a subprocess (`python -m assay serve`, eager by default: no compile time on a small
machine) over a copy of a tiny zoo model with a ChatML chat template added, so both routes serve. It is
started with small limits so that every refusal is reachable: 4 slots, a queue of 8, prompts of at most
512 tokens, answers of at most 48, bodies of at most 1 MiB.

`--clients` threads (default 6) each send one request after another, drawing their kind from a shuffled
deck (every kind in each deck; the kinds are in bench/serve/soak_clients.py, the report in bench/serve/soak_report.py):
plain and streamed completions and chat, logprobs/n/seed/echo/stop strings, clients that leave mid-stream, before a plain answer or in the middle of
their body, malformed JSON, unknown or unimplemented fields, wrong values, invalid UTF-8, a missing or wrong
API key (the server requires a random one), prompts over the token, character and byte limits.
Every `--burst-every` seconds a burst of slots + queue + 4 long requests arrives at once: some get 429.

Targets (met/missed printed, and in the JSON):
  hard (exit 1 when missed): no request hangs (no byte for 30 s, or no whole answer in 90 s), none gets a
    5xx or a broken connection or an incomplete 200, every refusal has the status its kind expects, the
    server logs no traceback and exits 0 on SIGINT, its key appears neither in its log nor in /metrics,
    and afterwards every slot is free (/metrics);
  flat over time: the server's resident memory (RSS, sampled every second) grows less than 5% after
    warm-up, warm-up being the first 20% of the run: the median of the 10% after warm-up against the
    median of the last 10%; and the last minute's p99 TTFT (at the client, streamed requests) is within
    1.5x of the first minute's (runs under 3 minutes: the first and last thirds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import itertools
import os
import random
import re
import secrets
import shutil
import tempfile
import threading
import time

import httpx
import psutil

from assay.core.files import atomic_write_json
from bench.common import RESULTS, start_server, stop_server
from bench.serve.soak_clients import DECK, Client, Outcome, Setup
from bench.serve.soak_report import plot, summarise

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LIMITS = {"max_seqs": 4, "max_waiting": 8, "max_prompt_tokens": 512, "max_new_tokens": 48, "max_request_bytes": 2**20}
ZOO_MODELS = {"qwen3": "qwen3-pretrained", "gla": "gla-pretrained"}


def model_folder(model: str, zoo: str | None, work: Path) -> Path:
    """A copy of the model with a ChatML template (the zoo's tokenizers have none), for /v1/chat too."""
    if model in ZOO_MODELS:
        from assay.zoo import build_zoo

        zoo_dir = Path(zoo or os.environ.get("ASSAY_TEST_ZOO") or Path.home() / ".cache" / "assay" / "soak_zoo")
        build_zoo(zoo_dir, names=[ZOO_MODELS[model]], progress=False)
        source = zoo_dir / ZOO_MODELS[model]
    else:
        source = Path(model)
    folder = work / f"{source.name}-chat"
    shutil.copytree(source, folder)
    if not (folder / "chat_template.jinja").exists():
        (folder / "chat_template.jinja").write_text(CHATML)
    return folder


def serve_flags(folder: Path, args) -> list:
    flags = ["--model", folder, "--max-seqs", LIMITS["max_seqs"], "--max-waiting", LIMITS["max_waiting"], "--max-prompt-tokens", LIMITS["max_prompt_tokens"],
             "--max-new-tokens", LIMITS["max_new_tokens"], "--max-request-bytes", LIMITS["max_request_bytes"], "--port", 0]
    return flags + (["--eager"] if args.backend is None else ["--backend", args.backend])


def scrape(url: str) -> dict[str, float]:
    """/metrics as {'name{labels}': value}."""
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


class Soak:
    def __init__(self, setup: Setup, pid: int, seconds: float, args):
        self.setup, self.seconds, self.args = setup, seconds, args
        self.process = psutil.Process(pid)
        self.began = time.perf_counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self.samples: list[dict] = []
        self.bursts: list[dict] = []
        self.deck: list[str] = []
        self.seeds = itertools.count(args.seed * 1000)

    def clock(self) -> float:
        return time.perf_counter() - self.began

    def next_kind(self, rng: random.Random) -> str:
        with self.lock:
            if not self.deck:
                self.deck = [kind for kind, count in DECK.items() for _ in range(count)]
                rng.shuffle(self.deck)
            return self.deck.pop()

    def client(self) -> Client:
        with self.lock:
            seed = next(self.seeds)
        return Client(self.setup, random.Random(seed), self.clock)

    def worker(self) -> None:
        client = self.client()
        try:
            while not self.stop.is_set():
                outcome = client.run(self.next_kind(client.rng))
                with self.lock:
                    self.outcomes.append(outcome)
                self.stop.wait(client.rng.uniform(0, self.args.think))
        finally:
            client.close()

    def burst(self) -> None:
        size = LIMITS["max_seqs"] + LIMITS["max_waiting"] + 4
        clients = [self.client() for _ in range(size)]
        gate = threading.Barrier(size)
        results: list[Outcome] = []

        def member(client: Client) -> None:
            gate.wait()
            results.append(client.run("burst_member"))

        threads = [threading.Thread(target=member, args=(c,)) for c in clients]
        start = self.clock()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for client in clients:
            client.close()
        with self.lock:
            self.outcomes += results
            self.bursts.append({"start": round(start, 2), "sent": size, "answered": sum(o.outcome == "answered" for o in results),
                                "refused_429": sum(o.outcome == "refused_429" for o in results)})

    def bursts_loop(self) -> None:
        every = min(self.args.burst_every, self.seconds / 3)
        next_at = every / 2
        while not self.stop.wait(max(0.0, next_at - self.clock())):
            self.burst()
            next_at += every

    def sampler(self) -> None:
        while not self.stop.is_set():
            sample = {"t": round(self.clock(), 2), "rss_mib": round(self.process.memory_info().rss / 2**20, 3),
                      "load1": round(os.getloadavg()[0], 2)}
            try:
                metrics = scrape(self.setup.url)
                finished = sum(metrics.get(f'assay_requests_total{{outcome="{o}"}}', 0) for o in ("length", "stop", "abort"))
                sample |= {"running": metrics.get("assay_running_requests"), "waiting": metrics.get("assay_waiting_requests"),
                           "decode_steps": metrics.get("assay_decode_steps_total"), "finished": finished}
            except httpx.HTTPError as exc:
                sample["scrape_error"] = f"{type(exc).__name__}: {exc}"
            self.samples.append(sample)
            self.stop.wait(1.0)

    def run(self) -> None:
        threads = [threading.Thread(target=self.worker, daemon=True) for _ in range(self.args.clients)]
        threads += [threading.Thread(target=self.bursts_loop, daemon=True), threading.Thread(target=self.sampler, daemon=True)]
        for thread in threads:
            thread.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        for thread in threads:
            thread.join(self.setup.deadline + 30)
        stuck = [t for t in threads if t.is_alive()]
        if stuck:  # a request still open after its deadline and the join's grace: a hang the client missed
            self.outcomes.append(Outcome("client", "hang", None, round(self.clock(), 2), 0.0, detail=f"{len(stuck)} client threads stuck"))


def slots_after(url: str, wait_s: float = 30.0) -> dict:
    """Poll /metrics until nothing runs or waits and every slot is free (disconnects settle asynchronously)."""
    start = time.perf_counter()
    while True:
        metrics = scrape(url)
        state = {"free": metrics["assay_free_slots"], "slots": metrics["assay_slots"], "running": metrics["assay_running_requests"],
                 "waiting": metrics["assay_waiting_requests"]}
        state["all_free"] = state["free"] == state["slots"] and state["running"] == 0 and state["waiting"] == 0
        state["settled_s"] = round(time.perf_counter() - start, 2)
        if state["all_free"] or state["settled_s"] > wait_s:
            return state | {"counters": {k: v for k, v in metrics.items() if k.startswith("assay_requests_total")}}
        time.sleep(0.5)


def server_log(log: Path, api_key: str) -> dict:
    text = log.read_text()
    return {"tracebacks": len(re.findall(r"^Traceback", text, re.MULTILINE)), "stderr_tail": text[-3000:], "key_in_log": api_key in text}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", default="qwen3", help="qwen3 or gla (the tiny zoo's), or a checkpoint folder")
    parser.add_argument("--zoo", default=None, help="the tiny zoo's folder (default $ASSAY_TEST_ZOO, else ~/.cache/assay/soak_zoo)")
    parser.add_argument("--backend", default=None, help="compile the decode step with this backend (default: --eager)")
    parser.add_argument("--clients", type=int, default=6, help="client threads sending one request after another")
    parser.add_argument("--burst-every", type=float, default=20.0, help="seconds between bursts over the queue")
    parser.add_argument("--think", type=float, default=0.05, help="each client's pause between requests: uniform in [0, this] s")
    parser.add_argument("--timeout", type=float, default=30.0, help="no byte for this long: a hang")
    parser.add_argument("--deadline", type=float, default=90.0, help="no whole answer in this long: a hang")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_soak.json", help="the JSON; the plot goes next to it (.png)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.load_start = os.getloadavg()
    args.api_key = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="assay-soak-") as work:
        folder = model_folder(args.model, args.zoo, Path(work))
        log = Path(work) / "server.log"
        # The key by the environment: not in the process list.
        process, url, _ = start_server(serve_flags(folder, args), env={"ASSAY_API_KEY": args.api_key}, stderr=log.open("w"), timeout=args.start_timeout)
        try:
            setup = Setup(url, folder.name, LIMITS["max_seqs"], LIMITS["max_prompt_tokens"], LIMITS["max_new_tokens"], LIMITS["max_request_bytes"],
                          args.timeout, args.deadline, args.api_key)
            soak = Soak(setup, process.pid, args.minutes * 60, args)
            soak.run()
            slots = slots_after(url)
            metrics_text = httpx.get(f"{url}/metrics", timeout=30).text
            health = httpx.get(f"{url}/health", timeout=30).status_code
        finally:
            server = {"exit_code": stop_server(process, timeout=60)} | server_log(log, args.api_key)
        server |= {"health_after": health, "key_in_metrics": args.api_key in metrics_text}
    result = summarise(soak, slots, server, args, LIMITS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"{result['requests']} requests in {args.minutes} min; outcomes {result['by_outcome']}; load {result['machine']['load1_mean']}")
    rss, ttft = result["rss"], result["ttft"]
    print(f"RSS {rss.get('baseline_mib')} -> {rss.get('end_mib')} MiB after warm-up ({rss['growth']:+.2%}); TTFT p99 "
          f"{ttft['first']['p99']} -> {ttft['last']['p99']} s ({ttft['compared']}, x{ttft['ratio']})" if rss["growth"] is not None else "")
    if rss.get("growth_without_engine_records") is not None:
        print(f"RSS growth less the engine's bounded records ({rss['engine_records']['mib']} MiB): "
              f"{rss['growth_without_engine_records']:+.2%}")
    for name, target in result["targets"].items():
        print(f"  {'met   ' if target['met'] else 'MISSED'} {name}{' (hard)' if target['hard'] else ''}")
    for failure in result["failures"][:20]:
        print(f"  failure: {failure}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 1 if result["hard_failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
