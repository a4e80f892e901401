"""The probe's child process: `python -m assay.compat.run.worker PLAN.json ROW.json` runs the plan it is given."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from assay.core.plugins import load_plugins

    load_plugins()
    from assay.compat.probe import stages

    stages.enable_from_env()  # `assay probe --timeout`: the parent relays these lines
    from assay.compat.probe.execute import execute
    from assay.compat.probe.request import ProbePlan
    from assay.core.compile_cache import cache_dir_from_env, load_mega_cache, save_mega_cache
    from assay.core.files import atomic_write_json

    plan_path, row_path = argv
    # The parent's plan, as JSON: the child runs it as planned (row laid out, judge and eval tasks resolved).
    plan = ProbePlan.from_json(Path(plan_path).read_text())
    request = plan.request
    # A sweep with a compile-cache folder: reuse this model's portable artifacts, then save them anew.
    cache_dir = cache_dir_from_env()
    cache_key = f"{request.model}|{request.backend}|{request.dtype}|{request.device}"
    cache_io = 0.0
    if cache_dir is not None:
        start = time.perf_counter()
        load_mega_cache(cache_dir, cache_key)
        cache_io = time.perf_counter() - start
    row = execute(plan)
    if cache_dir is not None and row.get("graphs"):
        start = time.perf_counter()
        save_mega_cache(cache_dir, cache_key)
        cache_io += time.perf_counter() - start
    if cache_dir is not None:
        row["compile_cache_io_s"] = cache_io
    atomic_write_json(row_path, row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
