"""HTTP serving benchmark: `assay serve` (a real process, inductor, buckets) under concurrent streaming
clients on loopback.

    python bench/serve/http_load.py [--zoo DIR] [--model gla-pretrained]   -> bench/results/serve_http.json

What it adds to serve-bench (the engine alone): the service as clients see it. For 1, 8 and 32
concurrent clients against 8 slots (32 clients overflow into the queue): time to first token and time
per output token measured at the client, aggregate output tokens/s, next to the server's own /metrics
(its TTFT/TPOT summaries and compile counters: with buckets, no compile while serving). Then an
overload: 32 clients at once against 8 slots and a queue of 4, each sending once: how many got 429
and whether every accepted request got exactly one complete answer and every slot came back.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import json
import tempfile
import time

import httpx

from assay.core.files import atomic_write_json
from assay.core.metrics import percentile
from assay.core.output import print_table
from bench.common import RESULTS, corpus_prompts, drive_clients, start_server, stop_server

CONCURRENCY = (1, 8, 32)
REQUESTS = 48
MAX_TOKENS = 32
PROMPT_TOKENS = 64
MAX_SEQS = 8


def serve_flags(model_dir: Path, max_waiting: int) -> list:
    return ["--model", model_dir, "--port", 0, "--compile", "--max-seqs", MAX_SEQS, "--max-waiting", max_waiting]


def one_request(client: httpx.Client, url: str, prompt: list[int]) -> dict:
    """A streaming request, timed at the client: status, first-token and per-token times, chunks, [DONE]s."""
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    sent = time.perf_counter()
    stamps, finishes, done = [], 0, 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            return {"status": response.status_code}
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            stamps.append(time.perf_counter())
            finishes += json.loads(line[6:])["choices"][0]["finish_reason"] is not None
    result = {"status": 200, "tokens": len(stamps), "finishes": finishes, "done": done, "ttft_s": stamps[0] - sent}
    if len(stamps) >= 2:
        result["tpot_s"] = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return result


def drive(url: str, work: list[list[int]], concurrency: int) -> tuple[list[dict], float]:
    """`concurrency` clients take prompts from a shared list until it is empty; (results, wall seconds)."""
    return drive_clients(work, concurrency, lambda session, prompt: one_request(session, url, prompt), timeout=600)


def server_metrics(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def summary(results: list[dict], wall_s: float) -> dict:
    ok = [r for r in results if r["status"] == 200]
    ttft = [r["ttft_s"] for r in ok]
    tpot = [r["tpot_s"] for r in ok if "tpot_s" in r]
    mean = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": len(results), "answered": len(ok), "refused_429": sum(r["status"] == 429 for r in results),
        "other_errors": sum(r["status"] not in (200, 429) for r in results),
        "complete_answers": sum(r["finishes"] == 1 and r["done"] == 1 for r in ok),
        "output_tokens": tokens, "wall_s": wall_s, "output_tokens_per_s": tokens / wall_s if wall_s else None,
        "client_ttft_s": {f"p{q}": percentile(ttft, q) for q in (50, 95, 99)} if ttft else None,
        "client_tpot_s": {f"p{q}": percentile(tpot, q) for q in (50, 95, 99)} if tpot else None,
        "client_ttft_s_mean": mean(ttft), "client_tpot_s_mean": mean(tpot),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=None, help="a built zoo (default: build one in a temp folder)")
    parser.add_argument("--model", default="gla-pretrained")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_http.json")
    args = parser.parse_args()
    zoo = args.zoo
    if zoo is None:
        from assay.zoo import build_zoo

        zoo = Path(tempfile.mkdtemp(prefix="assay-zoo-"))
        build_zoo(zoo, progress=False)
    model_dir = zoo / args.model
    work = corpus_prompts(model_dir, REQUESTS + 32, PROMPT_TOKENS)
    cache_dir = tempfile.mkdtemp(prefix="assay-inductor-")

    record: dict = {"model": args.model, "max_seqs": MAX_SEQS, "max_tokens": MAX_TOKENS, "prompt_tokens": PROMPT_TOKENS,
                    "backend": "inductor", "buckets": "1,2,4,8", "runs": []}
    process, url, startup_s = start_server(serve_flags(model_dir, 256), env={"TORCHINDUCTOR_CACHE_DIR": cache_dir})
    record["startup_s_cold_cache"] = startup_s
    try:
        for concurrency in CONCURRENCY:
            before = server_metrics(url)
            results, wall_s = drive(url, work[:REQUESTS], concurrency)
            after = server_metrics(url)
            entry = {"concurrency": concurrency, **summary(results, wall_s)}
            def mean_delta(name: str) -> float | None:
                count = after[f"{name}_count"] - before[f"{name}_count"]
                return (after[f"{name}_sum"] - before[f"{name}_sum"]) / count if count else None

            # The server's histograms cover its whole life; their _sum/_count deltas give this run's means.
            entry["server"] = {
                "ttft_s_mean": mean_delta("assay_ttft_seconds"), "tpot_s_mean": mean_delta("assay_tpot_seconds"),
                "compiles_while_serving": after['assay_compiles_total{phase="serving"}'] - before['assay_compiles_total{phase="serving"}'],
                "free_slots_after": after["assay_free_slots"],
            }
            record["runs"].append(entry)
        record["warmup_compiles"] = after['assay_compiles_total{phase="warmup"}']
        record["warmup_compile_s"] = after['assay_compile_seconds_total{phase="warmup"}']
    finally:
        record["exit_code"] = stop_server(process)

    process, url, startup_s = start_server(serve_flags(model_dir, 4), env={"TORCHINDUCTOR_CACHE_DIR": cache_dir})
    record["startup_s_warm_cache"] = startup_s
    try:
        results, wall_s = drive(url, work[REQUESTS:REQUESTS + 32], 32)
        overload = {"concurrency": 32, "max_waiting": 4, **summary(results, wall_s)}
        time.sleep(0.5)
        final = server_metrics(url)
        overload["free_slots_after"] = final["assay_free_slots"]
        overload["server_refused_429"] = final['assay_requests_total{outcome="rejected_queue_full"}']
        record["overload"] = overload
    finally:
        record["overload_exit_code"] = stop_server(process)

    atomic_write_json(args.out, record)
    rows = [{"clients": r["concurrency"], "answered": r["answered"], "tok/s": r["output_tokens_per_s"],
             "ttft p50": r["client_ttft_s"]["p50"], "ttft p99": r["client_ttft_s"]["p99"], "tpot p50": r["client_tpot_s"]["p50"],
             "tpot p99": r["client_tpot_s"]["p99"], "ttft mean": r["client_ttft_s_mean"], "server ttft mean": r["server"]["ttft_s_mean"],
             "compiles": r["server"]["compiles_while_serving"]} for r in record["runs"]]
    print_table(rows, list(rows[0]), title=f"assay serve over HTTP: {args.model}, {MAX_SEQS} slots, {MAX_TOKENS} tokens per request")
    print(f"overload (32 clients, queue of 4): {overload['answered']} answered ({overload['complete_answers']} complete), "
          f"{overload['refused_429']} refused with 429; free slots after: {overload['free_slots_after']:.0f}/{MAX_SEQS}")
    print(f"startup (load + warm-up): {record['startup_s_cold_cache']:.1f} s cold inductor cache, "
          f"{record['startup_s_warm_cache']:.1f} s warm; written {args.out}")


if __name__ == "__main__":
    main()
