"""assay serve beside the CPU servers people run (llama.cpp's llama-server, vLLM's CPU build, any server with an
OpenAI-compatible /v1/completions), one server at a time (or in rounds), each driven by the same client with the
same payloads.

    python bench/serve/peers.py --model smollm2/ [--assay-modes eager,compiled] [--assay-args '--quantize int8']
        [--peer 'llama.cpp=llama-server -m smollm2-f32.gguf --port {port} -t {threads} -np 32 -c 8192']
        [--peer 'vllm=/opt/vllm/bin/vllm serve smollm2/ --port {port} --dtype float32 --max-num-seqs 32']
        -> bench/results/serve_peers.json, bench/results/serve_peers.png, a table of assay / peer per width

The workload is the one vLLM's `bench serve --dataset-name random` sends, on real text: --prompt-tokens token
ids (windows of the embedded corpus at random offsets, the same ids for every server: a GGUF converted from the
model's tokenizer.json numbers the tokens alike), --max-tokens new tokens with ignore_eos, temperature 0,
streamed. For each concurrency c, --requests requests go out c at a time (c clients, each sending its next
request when its last one ends). Measured at the client: output tokens/s over the wall time of the batch
(tokens of whole answers only; a connection the server drops once it has begun to answer is counted, not
retried; one it closes unanswered is sent again once), time to first token, time per output token (TPOT: from
the first token to the last, over the tokens between).
Every server gets one untimed request first (lazy set-up is not serving speed) and the same threads (the
client shares the machine with it, as it does with each peer). A shared machine's speed drifts (by 15-20% within
an hour here): --rounds N starts every server at once and measures each width on each server in turn, N times,
so each round's ratios compare servers measured within a minute of each other; the table holds each width's
median round. The peers' commands are the user's: docs/serve.md ("Measuring against llama.cpp and vLLM") says
how to build each and make its model file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import json
import os
import shlex
import signal
import subprocess
import tempfile
import time

import httpx

from assay.core.files import atomic_write_json
from assay.core.metrics import percentile, save_figure
from assay.core.output import print_table
from assay.core.net import free_port
from bench.common import RESULTS, corpus_prompts, drive_clients, load_average, machine

ASSAY_MODES = {"eager": ["--eager"], "compiled": ["--compile"], "compiled-prefill": ["--compile", "--compile-prefill"]}


class Server:
    """One server process from a command line with {port} (and {threads}) in it, ready once /v1/models answers."""

    def __init__(self, name: str, command: str, threads: int, log_dir: Path, ready_s: float):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = command.format(port=self.port, threads=threads)
        self.log = log_dir / f"{name}.log"
        print(f"{name}: starting: {self.command}", flush=True)
        env = os.environ | {"OMP_NUM_THREADS": str(threads)}
        started = time.perf_counter()
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(shlex.split(self.command), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.model = self._wait_ready(ready_s)
        self.ready_s = time.perf_counter() - started

    def _wait_ready(self, ready_s: float) -> str:
        deadline = time.monotonic() + ready_s
        last_said = time.monotonic()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise SystemExit(f"{self.name}: the server exited {self.process.returncode} before answering:\n{self.log.read_text()[-2000:]}")
            try:
                answer = httpx.get(f"{self.url}/v1/models", timeout=5)
                if answer.status_code == 200:
                    return answer.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                pass
            if time.monotonic() - last_said > 30:
                print(f"  {self.name}: waiting for the server to answer ({time.monotonic() - deadline + ready_s:.0f} s)", flush=True)
                last_said = time.monotonic()
            time.sleep(1)
        self.stop()
        raise SystemExit(f"{self.name}: no answer on /v1/models in {ready_s:.0f} s:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def one_request(client: httpx.Client, server: Server, prompt: list[int], max_tokens: int) -> dict:
    """A streamed completion timed at the client, sent again once on a new connection when the server closed the
    kept-alive one without answering it (llama-server does, now and then); both attempts' time counts."""
    sent = time.perf_counter()
    result = _one_request(client, server, prompt, max_tokens, sent)
    if result["status"] == "dropped" and result["tokens_before"] == 0 and result["unanswered"]:
        result = _one_request(client, server, prompt, max_tokens, sent) | {"retried": True}
    return result


def _one_request(client: httpx.Client, server: Server, prompt: list[int], max_tokens: int, sent: float) -> dict:
    """Tokens are counted from the text chunks (each server sends one token per chunk; a final chunk that only
    carries finish_reason is not a token)."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    answered = False
    stamps, finish = [], None
    try:
        with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            answered = True
            if response.status_code != 200:
                return {"status": response.status_code, "error": response.read().decode(errors="replace")[:300]}
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if not choices:
                    continue
                if choices[0].get("text"):
                    stamps.append(time.perf_counter())
                finish = choices[0].get("finish_reason") or finish
    except httpx.TransportError as exc:  # a server that drops the connection (llama-server does at c = 32 here)
        return {"status": "dropped", "error": f"{type(exc).__name__}: {exc}", "tokens_before": len(stamps), "unanswered": not answered}
    result = {"status": 200, "tokens": len(stamps), "finish_reason": finish, "ttft_s": stamps[0] - sent if stamps else None}
    if len(stamps) >= 2:
        result["tpot_s"] = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return result


def drive(server: Server, work: list[list[int]], concurrency: int, max_tokens: int) -> tuple[list[dict], float]:
    """`concurrency` clients take prompts until none is left; (results, wall s)."""
    return drive_clients(work, concurrency, lambda session, prompt: one_request(session, server, prompt, max_tokens))


def summary(results: list[dict], wall_s: float, max_tokens: int) -> dict:
    ok = [r for r in results if r["status"] == 200]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in ok if "tpot_s" in r]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": len(results), "answered": len(ok), "dropped": sum(r["status"] == "dropped" for r in results),
        "retried": sum(bool(r.get("retried")) for r in results),
        "errors": [r.get("error", r["status"]) for r in results if r["status"] != 200][:3],
        "whole_answers": sum(r["tokens"] == max_tokens for r in ok), "output_tokens": tokens, "wall_s": wall_s,
        "output_tokens_per_s": tokens / wall_s if wall_s else None,
        "ttft_s": {f"p{q}": percentile(ttft, q) for q in (50, 99)} if ttft else None,
        "tpot_s": {f"p{q}": percentile(tpot, q) for q in (50, 99)} if tpot else None,
    }


def first_request(server: Server, prompt: list[int], max_tokens: int) -> None:
    """One untimed request: lazy set-up is not serving speed; a server that cannot answer it whole stops the run."""
    with httpx.Client(timeout=900) as client:
        first = one_request(client, server, prompt, max_tokens)
    if first["status"] != 200 or first["tokens"] != max_tokens:
        raise SystemExit(f"{server.name}: the first request got {first} (see {server.log})")


def measure_width(server: Server, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    print(f"  {server.name}: {len(prompts)} requests, {concurrency} at a time ...", flush=True)
    results, wall_s = drive(server, prompts, concurrency, max_tokens)
    entry = {"concurrency": concurrency, "loadavg": load_average(), **summary(results, wall_s, max_tokens)}
    tpot = entry["tpot_s"]["p50"] * 1000 if entry["tpot_s"] else float("nan")
    print(f"  {server.name}: c={concurrency}: {entry['output_tokens_per_s']:.1f} output tok/s, median TPOT {tpot:.1f} ms, "
          f"{entry['whole_answers']}/{len(prompts)} whole answers, {entry['dropped']} connections dropped, "
          f"{entry['retried']} sent again", flush=True)
    return entry


def batches(work: list[list[int]], requests: list[int], rounds: int) -> list[list[list[int]]]:
    """work[0] is the first request's; then each round's prompts for each width in turn: no prompt is sent twice
    to a server, so its prefix cache (vLLM's, llama-server's per-slot one) never skips a prefill."""
    out, start = [], 1
    for _ in range(rounds):
        out.append([])
        for count in requests:
            out[-1].append(work[start:start + count])
            start += count
    return out


def median_run(rounds: list[dict]) -> dict:
    """One width's runs over the rounds, as one run: the median round's tokens/s and TPOT / TTFT p50, summed counts."""
    def med(values):
        return percentile([v for v in values if v is not None], 50)
    run = {"concurrency": rounds[0]["concurrency"], "loadavg": rounds[-1]["loadavg"], "rounds": len(rounds),
           "output_tokens_per_s": med([r["output_tokens_per_s"] for r in rounds]),
           "output_tokens_per_s_rounds": [r["output_tokens_per_s"] for r in rounds]}
    for key in ("requests", "answered", "dropped", "retried", "whole_answers", "output_tokens"):
        run[key] = sum(r[key] for r in rounds)
    for key in ("ttft_s", "tpot_s"):
        p50 = med([(r[key] or {}).get("p50") for r in rounds])
        run[key] = {"p50": p50, "p50_rounds": [(r[key] or {}).get("p50") for r in rounds],  # p99: one slow request a batch shows here
                    "p99_rounds": [(r[key] or {}).get("p99") for r in rounds]} if p50 is not None else None
    run["errors"] = [error for r in rounds for error in r["errors"]][:3]
    return run


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = record["servers"]
    widths = record["concurrency"]
    fig, (rate, tpot) = plt.subplots(1, 2, figsize=(11, 4))
    bar = 0.8 / max(len(servers), 1)
    for index, server in enumerate(servers):
        xs = [w + (index - (len(servers) - 1) / 2) * bar for w in range(len(widths))]
        rate.bar(xs, [run["output_tokens_per_s"] or 0 for run in server["runs"]], bar, label=server["name"])
        tpot.bar(xs, [(run["tpot_s"] or {}).get("p50", 0) * 1000 for run in server["runs"]], bar, label=server["name"])
    for axis, title in ((rate, "output tokens/s (higher is better)"), (tpot, "median time per output token, ms (lower is better)")):
        axis.set_xticks(range(len(widths)), [f"c = {w}" for w in widths])
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    fig.suptitle(f"{record['model_name']}: {record['prompt_tokens']} prompt + {record['max_tokens']} output tokens, "
                 f"{record['threads']} threads, {record['machine']['cpu']}", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the checkpoint folder assay serves (and whose tokenizer makes the prompts)")
    parser.add_argument("--assay-modes", default="eager", help=f"assay serve modes, comma-separated: {', '.join(ASSAY_MODES)}")
    parser.add_argument("--assay-args", default="", help="more flags for every assay server (e.g. '--quantize int8'), in its name too")
    parser.add_argument("--max-seqs", type=int, default=32, help="assay's slots (give each peer as many: -np, --max-num-seqs)")
    parser.add_argument("--max-len", type=int, default=256, help="assay's positions per slot (llama-server's -c over -np: 8192 / 32); "
                                                                 "a compiled decode attends over all of them")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=COMMAND",
                        help="a peer server's command line, with {port} (and {threads}) where they go; repeatable")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--requests", default="8,16,64", help="requests per concurrency, in the same order")
    parser.add_argument("--rounds", type=int, default=1, help="more than 1: every server up at once, each round driving each width on "
                                                                 "each server in turn; the table holds each width's median round")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of every server (OMP_NUM_THREADS; {threads} in a peer's command)")
    parser.add_argument("--ready-s", type=float, default=900, help="how long a server may take to answer /v1/models")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_peers.json")
    args = parser.parse_args()

    widths = [int(w) for w in args.concurrency.split(",")]
    requests = [int(r) for r in args.requests.split(",")]
    modes = [m for m in args.assay_modes.split(",") if m]
    if args.rounds < 1:
        parser.error("--rounds takes a positive number")
    if len(widths) != len(requests) or min(widths + requests) < 1:
        parser.error("--concurrency and --requests need as many positive numbers each")
    if unknown := [m for m in modes if m not in ASSAY_MODES]:
        parser.error(f"unknown --assay-modes {', '.join(unknown)} (known: {', '.join(ASSAY_MODES)})")
    peers = []
    for given in args.peer:
        name, _, command = given.partition("=")
        if not name or "{port}" not in command:
            parser.error(f"--peer {given!r}: give NAME=COMMAND with {{port}} in the command")
        peers.append((name, command))
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there")
    if args.prompt_tokens + args.max_tokens > args.max_len:
        parser.error(f"--prompt-tokens + --max-tokens ({args.prompt_tokens + args.max_tokens}) exceed --max-len {args.max_len}")

    work = corpus_prompts(args.model, 1 + args.rounds * sum(requests), args.prompt_tokens)  # the first request's, then each round's and width's own
    extra = " ".join(shlex.quote(flag) for flag in shlex.split(args.assay_args))
    servers = [(f"assay {mode}{' ' + extra if extra else ''}", f"{shlex.quote(sys.executable)} -m assay serve --model "
                f"{shlex.quote(str(args.model))} --port {{port}} --max-seqs {args.max_seqs} --max-len {args.max_len} "
                f"{' '.join(ASSAY_MODES[mode])} {extra}".rstrip()) for mode in modes] + peers
    log_dir = Path(tempfile.mkdtemp(prefix="assay-peers-"))  # each server's output, named in the record
    record = {"benchmark": "serve_peers", "model": str(args.model), "model_name": args.model.resolve().name, "machine": machine(),
              "threads": args.threads, "rounds": args.rounds, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
              "concurrency": widths, "requests": requests, "logs": str(log_dir), "servers": []}
    work_by_round = batches(work, requests, args.rounds)
    if args.rounds == 1:  # one server at a time: only it is in memory
        for name, command in servers:
            server = Server(name, command, args.threads, log_dir, args.ready_s)
            try:
                print(f"{name}: answering after {server.ready_s:.1f} s (model {server.model!r})", flush=True)
                first_request(server, work[0], args.max_tokens)
                runs = [measure_width(server, prompts, c, args.max_tokens) for c, prompts in zip(widths, work_by_round[0])]
                record["servers"].append({"name": name, "command": server.command, "ready_s": server.ready_s, "runs": runs})
            finally:
                server.stop()
            atomic_write_json(args.out, record)  # after each server: a later failure keeps what was measured
    else:  # every server up at once, idle but for the one driven; each round drives each width on each in turn
        started: list[Server] = []
        try:
            for name, command in servers:
                started.append(Server(name, command, args.threads, log_dir, args.ready_s))
                print(f"{name}: answering after {started[-1].ready_s:.1f} s (model {started[-1].model!r})", flush=True)
                first_request(started[-1], work[0], args.max_tokens)
            per_server = {server.name: [[] for _ in widths] for server in started}
            for round_index, prompts_by_width in enumerate(work_by_round):
                print(f"round {round_index + 1}/{args.rounds}", flush=True)
                order = started[round_index % len(started):] + started[:round_index % len(started)]  # who goes first rotates
                for index, (concurrency, prompts) in enumerate(zip(widths, prompts_by_width)):
                    for server in order:
                        per_server[server.name][index].append(measure_width(server, prompts, concurrency, args.max_tokens))
                record["servers"] = [{"name": server.name, "command": server.command, "ready_s": server.ready_s,
                                      "runs": [median_run(rounds) for rounds in per_server[server.name]]} for server in started]
                record["rounds_done"] = round_index + 1
                atomic_write_json(args.out, record)  # after each round: a later failure keeps what was measured
        finally:
            for server in started:
                server.stop()

    rows = []
    reference = {run["concurrency"]: run for run in record["servers"][0]["runs"]}
    for server in record["servers"]:
        for run in server["runs"]:
            base = reference[run["concurrency"]]
            rows.append({"server": server["name"], "c": run["concurrency"], "tok/s": run["output_tokens_per_s"],
                         "TPOT p50 ms": (run["tpot_s"] or {}).get("p50", float("nan")) * 1000,
                         "TTFT p50 ms": (run["ttft_s"] or {}).get("p50", float("nan")) * 1000,
                         f"{record['servers'][0]['name']} / this": base["output_tokens_per_s"] / run["output_tokens_per_s"]})
    record["ratios"] = [{"server": row["server"], "concurrency": row["c"], "reference_over_server": row[f"{record['servers'][0]['name']} / this"]}
                        for row in rows]
    if args.rounds > 1:  # each round's own ratio, the servers measured minutes apart
        for ratio, (server, run) in zip(record["ratios"], [(s, r) for s in record["servers"] for r in s["runs"]]):
            base = reference[run["concurrency"]]["output_tokens_per_s_rounds"]
            ratio["reference_over_server_rounds"] = [a / b if a and b else None for a, b in zip(base, run["output_tokens_per_s_rounds"])]
    atomic_write_json(args.out, record)
    plot(record, args.out.with_suffix(".png"))
    print_table(rows, list(rows[0]), title=f"{record['model_name']}: {args.prompt_tokens} + {args.max_tokens} tokens, {args.threads} threads")
    print(f"written {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
