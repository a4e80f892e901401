"""Benchmark: sweeping the zoo (20 checkpoints, inductor, CPU) cold and warm, 1 and 2 workers, with the
time of every probe phase summed over the models.

    python bench/compat/sweep_zoo.py                          # all five sweeps (40-60 minutes on 2 busy cores)
    python bench/compat/sweep_zoo.py --runs cold1,warm1       # some of them

Each run is a real `assay sweep` in a subprocess into a new results folder. A "cache set" is a compile-cache
folder (--cache-dir: inductor's FX-graph cache, TORCHINDUCTOR_CACHE_DIR, and the portable mega-cache)
plus a reference-cache folder (--reference-cache); each set starts empty, so cold is really cold:
  cold1:        1 worker,  set 1 empty
  warm1:        1 worker,  set 1 as cold1 left it (compile caches and reference cache kept)
  warm1_noref:  1 worker,  set 1's compile caches, --no-reference-cache (what the reference cache saves)
  cold2:        2 workers, set 2 empty
  warm2:        2 workers, set 2 as cold2 left it
Ratios are taken within this run (warm1 / cold1, cold2 / cold1, warm2 / warm1), so they do not depend on
this machine's speed; the load average before and after each run says how busy the machine was.
Results: bench/results/sweep_zoo.json (runs, phases, ratios, and under "probes" each model's probe in cold1),
rewritten after every run so an interrupted benchmark keeps what it measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time

from bench.common import RESULTS

RUNS = {  # name: (workers, cache set, reference cache on)
    "cold1": (1, 1, True),
    "warm1": (1, 1, True),
    "warm1_noref": (1, 1, False),
    "cold2": (2, 2, True),
    "warm2": (2, 2, True),
}
PER_MODEL = ("model", "status", "load_s", "reference_s", "trace_s", "backend_compile_s", "first_call_s", "generate_s",
             "compile_cache_io_s", "compile_s", "decode_tokens_per_s", "total_s", "graphs", "recompiles",
             "compile_cache_hit", "reference_cache_hit")


def sweep(zoo: Path, out: Path, cache: Path, refs: Path | None, workers: int) -> dict:
    command = [sys.executable, "-m", "assay", "sweep", "--zoo", str(zoo), "--backend", "inductor", "--out", str(out),
               "--cache-dir", str(cache), "--workers", str(workers), "--timeout", "1800", "--json"]
    command += ["--reference-cache", str(refs)] if refs else ["--no-reference-cache"]
    # The sweep points its probes at --cache-dir; the same here, so nothing reaches torch's default folder.
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
    load_before = os.getloadavg()
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"sweep failed: {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    return {"wall_s": wall, "workers": workers, "counts": report["counts"], "phases": report["phases"],
            "load_average_before": load_before, "load_average_after": os.getloadavg(), "rows": report["rows"]}


def per_model(rows: list[dict]) -> list[dict]:
    return sorted(({k: r.get(k) for k in PER_MODEL} for r in rows), key=lambda r: r["model"])


def write(context: dict, measured: dict[str, dict]) -> dict:
    RESULTS.mkdir(parents=True, exist_ok=True)
    cold = measured.get("cold1")
    probes = {"backend": "inductor", "device": "cpu", "sweep_wall_s": cold["wall_s"], "models": per_model(cold["rows"])} if cold else None
    summary: dict = {name: {k: v for k, v in m.items() if k != "rows"} for name, m in measured.items()}
    ratios = {}
    for name, (numerator, denominator) in {
        "warm_over_cold": ("warm1", "cold1"), "warm_noref_over_cold": ("warm1_noref", "cold1"),
        "two_workers_over_one_cold": ("cold2", "cold1"), "two_workers_over_one_warm": ("warm2", "warm1"),
        "warm_over_cold_two_workers": ("warm2", "cold2"),
    }.items():
        if numerator in measured and denominator in measured:
            ratios[name] = measured[numerator]["wall_s"] / measured[denominator]["wall_s"]
    report = {"context": context, "targets": {"warm_over_cold": 0.33, "two_workers_over_one": 0.6}, "ratios": ratios, "runs": summary,
              "probes": probes}
    (RESULTS / "sweep_zoo.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--zoo", type=Path, default=None, help="an existing zoo folder (default: build one)")
    args = parser.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    unknown = set(runs) - set(RUNS)
    if unknown:
        raise SystemExit(f"unknown runs {sorted(unknown)} (choose from {', '.join(RUNS)})")
    scratch = Path(tempfile.mkdtemp(prefix="assay-bench-"))
    zoo = args.zoo or scratch / "zoo"
    if args.zoo is None:
        subprocess.run([sys.executable, "-m", "assay", "zoo", "build", str(zoo), "--json"], check=True, capture_output=True)
    context = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": "wall times on a shared 2-core machine; compare ratios within one run",
    }
    measured: dict[str, dict] = {}
    for name in RUNS:
        if name not in runs:
            continue
        workers, cache_set, with_references = RUNS[name]
        cache = scratch / f"compile-cache{cache_set}"
        refs = scratch / f"reference-cache{cache_set}" if with_references else None
        print(f"{time.strftime('%H:%M:%S')} {name}: {workers} worker(s), cache set {cache_set}", file=sys.stderr, flush=True)
        measured[name] = sweep(zoo, scratch / f"results-{name}", cache, refs, workers)
        print(f"{time.strftime('%H:%M:%S')} {name}: {measured[name]['wall_s']:.0f} s {measured[name]['counts']}", file=sys.stderr, flush=True)
        context["load_average_at_end"] = os.getloadavg()
        report = write(context, measured)
    print(json.dumps({"ratios": report["ratios"], "runs": {n: {"wall_s": m["wall_s"], "phases": m["phases"]} for n, m in report["runs"].items()}}, indent=2))


if __name__ == "__main__":
    main()
