"""The web app's search and filters at 10,000 rows: the functions each UI callback calls, timed.

    python bench/compat/app.py               -> bench/results/app.json and a table
    python bench/compat/app.py --rows 50000  -> a larger dataset

A dataset of N rows over 5 stacks (N / 5 models, each on every stack) is generated with realistic
columns: the whole stack's versions JSON, a ~1.5 KB run.py, ~1 KB tracebacks on failures, timings
and memory; a catalog of 300 public ids ranks part of them. Each case runs `repeats` times after one
warm-up; median, p95 and max are reported in milliseconds. The budget is 1 s per search or filter.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time

from assay.app.catalog import Catalog, CatalogModel  # noqa: E402
from assay.app.results.analysis import compare_stacks, failure_groups, pass_rates, per_model_costs  # noqa: E402
from assay.app.results.listing import ALL_RESULTS, DOWNLOADS, SELECTED, TRENDING, Filters, list_view  # noqa: E402
from assay.app.results.model_page import model_page  # noqa: E402
from assay.app.results.snapshot import load_snapshot  # noqa: E402
from assay.app.results.status import ANY_FAILURE, NOT_TESTED, SKIPPED  # noqa: E402
from assay.compat.results.dataset import write_rows  # noqa: E402
from assay.compat.results.schema import empty_row  # noqa: E402
from assay.core.files import atomic_write_json  # noqa: E402
from assay.core.output import print_table  # noqa: E402
from bench.common import RESULTS

BUDGET_S = 1.0
STACKS = 5
STATUS_WEIGHTS = {"PASS": 60, "FAIL_COMPILE": 10, "FAIL_RUN": 8, "FAIL_ACCURACY": 5, "FAIL_LOAD": 4, "OOM": 3, "TIMEOUT": 2,
                  "CRASH": 1, "SKIPPED": 7}
ERRORS = [
    "torch._dynamo.exc.Unsupported: call_function BuiltinVariable(setattr) [UserDefinedObjectVariable({name}Config)] {{}}",
    "RuntimeError: shape '[1, {n}]' is invalid for input of size {m}",
    "ValueError: Unrecognized configuration class <class 'transformers.models.{name}.Config'> at 0x7f{n:04x}",
    "torch.OutOfMemoryError: Tried to allocate {n}.00 MiB (GPU 0; {m} GiB total capacity)",
    "KeyError: 'model.layers.{n}.self_attn.q_proj.weight'",
]
RUN_PY = "# run.py: reproduces {model} on {stack}\nimport torch\nfrom transformers import AutoModelForCausalLM\n" + "# padding\n" * 120


def _versions(i: int) -> str:
    return json.dumps({
        "python": "3.11.7", "backend": "inductor", "device_type": "cpu", "device_name": "cpu", "device_count": 1,
        "compiler": {"torch": f"2.1{i}.0", "triton": f"3.{i}.0"},
        "libraries": {"torch": f"2.1{i}.0", "transformers": f"5.2{i}.0", "tokenizers": "0.22.1", "safetensors": "0.6.2",
                      "accelerate": "1.10.0", "numpy": "2.3.3", "pyarrow": "26.0.1", "duckdb": "2.0.1"},
        "vendor_packages": {"triton": f"3.{i}.0"}, "os": "Linux 6.1 (x86_64), linux", "label": f"stack {i}",
    }, sort_keys=True)


def generate(folder: Path, rows: int, seed: int = 0) -> Catalog:
    rng = random.Random(seed)
    models = rows // STACKS
    statuses, weights = list(STATUS_WEIGHTS), list(STATUS_WEIGHTS.values())
    stacks = [f"cpu-inductor-torch2.1{i}.0-tf5.2{i}.0-{i:08x}" for i in range(STACKS)]
    records = []
    for i, stack in enumerate(stacks):
        versions = _versions(i)
        for j in range(models):
            status = rng.choices(statuses, weights)[0]
            public = f"org{j % 50}/model-{j:05d}-{rng.choice(['instruct', 'base', 'chat'])}"
            error = None
            if status not in ("PASS", "SKIPPED"):
                message = rng.choice(ERRORS).format(name=f"arch{j % 7}", n=rng.randrange(1, 4096), m=rng.randrange(1, 4096))
                error = ("Traceback (most recent call last):\n" + f'  File "/home/ci/site-packages/torch/mod{j % 9}.py", line {j}, in f\n'
                         "    return fn(*args)\n" * 8 + message + "\n")
            records.append(empty_row() | {
                "model": f"assay-zoo/m{j:05d}" if j % 4 == 0 else public, "stands_in_for": public if j % 4 == 0 else None,
                "model_name": f"m{j:05d}", "task": "text-generation" if j % 10 else "image-text-to-text", "architecture": f"Arch{j % 7}",
                "status": status, "reason": error.splitlines()[-1][:120] if error else ("low priority" if status == "SKIPPED" else None),
                "error": error, "device": "cpu", "device_name": "cpu", "backend": "inductor", "dtype": "float32", "num_devices": 1,
                "parallelism": "single", "stack_id": stack, "stack_label": f"stack {i}", "versions": versions,
                "run_py": RUN_PY.format(model=public, stack=stack), "command": f"assay probe {public} --device cpu --out results/",
                "generated_tokens": list(range(32)), "reference_tokens": list(range(32)), "load_s": rng.uniform(0.1, 5),
                "compile_s": rng.uniform(1, 60), "decode_tokens_per_s": rng.uniform(5, 500), "total_s": rng.uniform(2, 90),
                "peak_memory_bytes": rng.randrange(100, 9000) * 2**20, "memory_kind": "host_rss",
            })
    write_rows(folder, records)
    publics = sorted({r["stands_in_for"] or r["model"] for r in records})
    # 300 ranked ids: most were tested, 50 only exist on the Hub (shown as "not tested").
    ranked = rng.sample(publics, min(250, len(publics))) + [f"hub-only/untested-{k:03d}" for k in range(50)]
    rng.shuffle(ranked)
    catalog_models = tuple(CatalogModel(p, "text-generation", downloads=rng.randrange(10**3, 10**7), likes=rng.randrange(0, 5000),
                                        trending_score=rng.randrange(0, 400)) for p in ranked)
    return Catalog(tuple(ranked[:40]), catalog_models, "bench")


def _time(fn, repeats: int) -> dict:
    fn()  # warm-up: DuckDB's first query, pandas' first string ops
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    samples.sort()
    return {"median_ms": 1000 * statistics.median(samples), "p95_ms": 1000 * samples[int(0.95 * (len(samples) - 1))],
            "max_ms": 1000 * samples[-1], "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "app.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="assay-app-bench-") as tmp:
        folder = Path(tmp) / "results"
        started = time.perf_counter()
        catalog = generate(folder, args.rows)
        generate_s = time.perf_counter() - started
        started = time.perf_counter()
        snapshot = load_snapshot(folder)
        load_s = time.perf_counter() - started
        stacks = snapshot.stacks
        compiler, transformers = "torch 2.12.0, triton 3.2.0", "5.22.0"  # both from stack 2
        some_model = snapshot.rows["public"].iloc[len(snapshot.rows) // 2]
        search = lambda **kw: lambda: list_view(snapshot, catalog, ALL_RESULTS, Filters(**kw))  # noqa: E731
        cases = {
            "all results, no filter": search(),
            "search 'model-01'": search(text="model-01"),
            "search 'INSTRUCT' (any case, many hits)": search(text="INSTRUCT"),
            "search, no match": search(text="zzz-no-such-model"),
            "filter compiler": search(compiler=compiler),
            "filter transformers": search(transformers=transformers),
            "filter device": search(device="cpu"),
            "filter status FAIL_COMPILE": search(status="FAIL_COMPILE"),
            "filter status any failure": search(status=ANY_FAILURE),
            "filter status skipped": search(status=SKIPPED),
            "filter task": search(task="image-text-to-text"),
            "search + every filter": search(text="model-0", compiler=compiler, transformers=transformers, device="cpu",
                                            status="PASS", task="text-generation"),
            "Selected view": lambda: list_view(snapshot, catalog, SELECTED, Filters()),
            "Trending view + search": lambda: list_view(snapshot, catalog, TRENDING, Filters(text="org1")),
            "Downloads view + not tested": lambda: list_view(snapshot, catalog, DOWNLOADS, Filters(status=NOT_TESTED)),
            "Downloads view + transformers": lambda: list_view(snapshot, catalog, DOWNLOADS, Filters(transformers=transformers)),
        }
        other = {
            "failure groups": lambda: failure_groups(snapshot, Filters()),
            "model page (DuckDB read of its rows)": lambda: model_page(snapshot, catalog, some_model),
            "compare two stacks (diff_stacks)": lambda: compare_stacks(folder, stacks[0], stacks[1]),
            "pass rate per stack": lambda: pass_rates(snapshot),
            "compile/memory per model": lambda: per_model_costs(snapshot, stacks[0]),
        }
        timings = {name: _time(fn, args.repeats) | {"kind": "search/filter"} for name, fn in cases.items()}
        timings |= {name: _time(fn, max(3, args.repeats // 4)) | {"kind": "other"} for name, fn in other.items()}
        matches = {name: fn().total for name, fn in cases.items()}

    worst = max(t["max_ms"] for t in timings.values() if t["kind"] == "search/filter")
    record = {
        "rows": args.rows, "stacks": STACKS, "models_per_stack": args.rows // STACKS, "catalog_models": len(catalog.models),
        "generate_s": generate_s, "load_snapshot_s": load_s, "budget_ms": 1000 * BUDGET_S,
        "worst_search_filter_ms": worst, "within_budget": worst < 1000 * BUDGET_S,
        "cases": {name: t | ({"rows_matched": matches[name]} if name in matches else {}) for name, t in timings.items()},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "note": "time of the app's own data functions (what each Gradio callback calls), excluding the browser round trip",
    }
    atomic_write_json(args.out, record)
    print_table(
        [{"case": name, "median ms": t["median_ms"], "p95 ms": t["p95_ms"], "max ms": t["max_ms"], "rows": matches.get(name, "")}
         for name, t in timings.items()],
        ["case", "median ms", "p95 ms", "max ms", "rows"],
        title=f"app at {args.rows:,} rows over {STACKS} stacks (snapshot load {load_s:.2f} s); worst search/filter {worst:.0f} ms",
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
