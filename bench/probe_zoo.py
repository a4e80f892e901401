"""Benchmark: probing every zoo model with inductor on CPU, and sweeping the zoo cold vs warm, 1 vs 2 workers.

    python bench/probe_zoo.py                      # all three sweeps (about 30-40 minutes on 2 cores)
    python bench/probe_zoo.py --runs cold1         # only the cold single-worker sweep

Each run is a real `assay sweep` in a subprocess, with its own compile-cache folder:
  cold1: 1 worker, empty cache  -> per-model load / compile / decode split (bench/results/probe_zoo.json)
  warm1: 1 worker, the cache cold1 filled (every probe redone with --force)
  cold2: 2 workers, empty cache
Ratios are taken within this run (warm1 / cold1, cold2 / cold1), so they do not depend on this machine's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def sweep(zoo: Path, out: Path, cache: Path, workers: int, force: bool) -> dict:
    command = [sys.executable, "-m", "assay", "sweep", "--zoo", str(zoo), "--backend", "inductor", "--out", str(out),
               "--cache-dir", str(cache), "--workers", str(workers), "--timeout", "1800", "--json"]
    if force:
        command.append("--force")
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"sweep failed: {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    return {"wall_s": wall, "workers": workers, "counts": report["counts"], "rows": report["rows"]}


def per_model(rows: list[dict]) -> list[dict]:
    keep = ("model", "status", "load_s", "compile_s", "decode_tokens_per_s", "total_s", "peak_memory_bytes", "graphs", "recompiles", "compile_cache_hit")
    return sorted(({k: r.get(k) for k in keep} for r in rows), key=lambda r: r["model"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="cold1,warm1,cold2")
    parser.add_argument("--zoo", type=Path, default=None, help="an existing zoo folder (default: build one)")
    args = parser.parse_args()
    runs = args.runs.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="assay-bench-"))
    zoo = args.zoo or scratch / "zoo"
    if args.zoo is None:
        subprocess.run([sys.executable, "-m", "assay", "zoo", "build", str(zoo), "--json"], check=True, capture_output=True)
    context = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(), "note": "wall times on a shared 2-core machine; compare ratios within one run",
    }
    measured: dict[str, dict] = {}
    if "cold1" in runs or "warm1" in runs:
        measured["cold1"] = sweep(zoo, scratch / "r-cold1", scratch / "cache1", workers=1, force=False)
    if "warm1" in runs:
        measured["warm1"] = sweep(zoo, scratch / "r-cold1", scratch / "cache1", workers=1, force=True)
    if "cold2" in runs:
        measured["cold2"] = sweep(zoo, scratch / "r-cold2", scratch / "cache2", workers=2, force=False)
    context["load_average_at_end"] = os.getloadavg()

    RESULTS.mkdir(parents=True, exist_ok=True)
    cold = measured.get("cold1")
    if cold:
        probe_report = {"context": context, "backend": "inductor", "device": "cpu", "sweep_wall_s": cold["wall_s"], "models": per_model(cold["rows"])}
        (RESULTS / "probe_zoo.json").write_text(json.dumps(probe_report, indent=2) + "\n")
    summary = {name: {"wall_s": m["wall_s"], "workers": m["workers"], "counts": m["counts"]} for name, m in measured.items()}
    if cold and "warm1" in measured:
        summary["warm_over_cold"] = measured["warm1"]["wall_s"] / cold["wall_s"]
        summary["warm_compile_s_sum"] = sum(r["compile_s"] or 0 for r in measured["warm1"]["rows"])
        summary["cold_compile_s_sum"] = sum(r["compile_s"] or 0 for r in cold["rows"])
    if cold and "cold2" in measured:
        summary["two_workers_over_one"] = measured["cold2"]["wall_s"] / cold["wall_s"]
    (RESULTS / "sweep.json").write_text(json.dumps({"context": context, "runs": summary}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
