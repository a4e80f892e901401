"""The probe's eval phase (`--eval TASKS`): task accuracy on the device next to the CPU eager reference's.

After the compiled generation, the probe scores each task twice through lm-eval's own task machinery
(eval/recipe.py): on the device, with the probe's model object and its forward compiled by the probe's
backend; and on the CPU, eager, in float32 (float64 with --reference-dtype float64), cached in the
reference cache per checkpoint and task content. eval/compare.py turns the two into the row's eval
columns and its eval_status. Imported only when --eval is given: a probe without it never imports
lm_eval (tests/compat/test_eval.py checks).
"""

from __future__ import annotations

import logging
import time
import traceback

from assay.compat.eval import recipe as eval_recipe
from assay.compat.probe import recipe, stages
from assay.compat.eval.compare import compare_task, device_only_columns, row_columns
from assay.compat.eval.task_files import task_file, task_names
from assay.compat.probe.request import ProbePlan, classify_exception, one_line
from assay.core.compiling import CompileStats, counting_backend, watch
from assay.core.progress import library_bar_off


# lm-eval warns, for every model object it is handed, that arguments meant for a Hub id are ignored: here
# that is the point (the probe's own model), so only its errors are shown.
logging.getLogger("lm_eval").setLevel(logging.ERROR)


def _no_request_bar():
    """lm-eval draws a tqdm bar of its own while it builds a task's requests, on stderr between the probe's own
    item counts (stages.items_callback), redrawn with carriage returns even into a log: off while the probe
    scores. (run.py keeps it: there it is the only progress shown.)"""
    from lm_eval.api import task as lm_eval_task

    return library_bar_off(lm_eval_task)


def reference_dtype(plan: ProbePlan) -> str:
    """The eval reference's dtype: float32 (what the checkpoint scores at full precision; a bfloat16 probe
    is judged against it, not against bfloat16 on the CPU), or float64 when asked for the reference."""
    return "float64" if plan.request.reference_dtype == "float64" else "float32"


def score_on_device(plan: ProbePlan, model) -> dict:
    """The device's scores with the probe's model compiled by its backend (score_compiled)."""
    return score_compiled(model, plan.ref.load_path, plan.backend, [str(task_file(spec)) for spec in plan.request.eval_tasks],
                          plan.request.eval_limit)


def score_compiled(model, load_path: str, backend: str, task_paths: list[str], limit: int | None = None) -> dict:
    """Score the tasks with `model`'s forward compiled by `backend`; a failure is returned, not raised.

    {"scores": [...], "graphs", "recompiles", "shapes", "seconds"} or {"failure": [status, reason, traceback]}.
    Runs on every rank of a sharded probe. limit: each task's first documents only (--eval-limit).
    """
    stats = CompileStats()
    start = time.perf_counter()
    try:
        with watch(stats), _no_request_bar():
            forward = eval_recipe.compiled_forward(model, counting_backend(backend, stats))
            scores, shapes = eval_recipe.score_tasks(model, load_path, task_paths, forward, stages.items_callback("device"), limit)
    except Exception as exc:  # the device failed the eval: a result of the row, not a crash of the probe
        return {"failure": [classify_exception(exc, "run"), one_line(exc), traceback.format_exc()]}
    return {"scores": scores, "graphs": stats.graphs, "recompiles": stats.recompiles, "shapes": [list(s) for s in shapes],
            "seconds": time.perf_counter() - start}


def reference_scores(plan: ProbePlan, cpu_model=None) -> tuple[list[dict], list[float], bool | None]:
    """The CPU eager reference's scores per task, their seconds (a cache hit: the lookup's), and whether
    every task came from the reference cache (None: no cache consulted).

    cpu_model: the probe's own model when it is already on the CPU in the reference dtype (one load
    serves both runs; eager here, its compiled forward is a separate wrapper)."""
    dtype = reference_dtype(plan)
    model = cpu_model if cpu_model is not None and plan.request.dtype == dtype else None
    cache = None
    if plan.request.reference_cache is not None:
        from assay.compat.probe.reference_cache import ReferenceCache, default_root

        cache = ReferenceCache(default_root() if plan.request.reference_cache == "auto" else plan.request.reference_cache)
    scores, seconds, hits = [], [], []
    for spec in plan.request.eval_tasks:
        start = time.perf_counter()
        key = None
        if cache is not None:
            from assay.compat.probe.reference_cache import eval_reference_key

            content = eval_recipe.task_content_sha256(eval_recipe.load_task(task_file(spec)), plan.request.eval_limit)
            key = eval_reference_key(plan, content, dtype)
        cached = cache.load_eval(key) if key is not None else None
        if key is not None:
            hits.append(cached is not None)
        if cached is None:
            if model is None:
                model = recipe.load_model(plan.ref.load_path, plan.task, "cpu", dtype)
            with _no_request_bar():
                [cached], _ = eval_recipe.score_tasks(model, plan.ref.load_path, [task_file(spec)],
                                                      progress=stages.items_callback("reference"), limit=plan.request.eval_limit)
            if key is not None:
                cache.store_eval(key, cached, plan.ref.name)
        scores.append(cached)
        seconds.append(time.perf_counter() - start)
    return scores, seconds, (all(hits) if hits else None)


def record_eval(plan: ProbePlan, row: dict, device: dict, cpu_model=None, with_reference: bool = True) -> None:
    """Fill the row's eval columns from the device's result (score_on_device's dict, or the same from
    rank 0 of a sharded probe) and the reference's. Without a reference (a sharded probe with
    --no-reference: no single-device run is affordable) the row gets the device's accuracy alone."""
    start = time.perf_counter()
    row["eval_tasks"] = task_names(plan.request.eval_tasks)
    row["eval_limit"] = plan.request.eval_limit
    row["eval_reference_dtype"] = reference_dtype(plan)
    if "failure" in device:
        status, reason, error = device["failure"]
        row.update(eval_status="FAIL", eval_reason=f"{status} while scoring on the device: {reason}", eval_error=error)
        return
    row.update(eval_graphs=device["graphs"], eval_recompiles=device["recompiles"])
    if not with_reference:
        row.update(device_only_columns(device["scores"]), eval_s=device["seconds"])
        return
    try:
        reference, reference_seconds, hit = reference_scores(plan, cpu_model)
        comparisons = [compare_task(ours, theirs, ours["seconds"], spent)
                       for ours, theirs, spent in zip(device["scores"], reference, reference_seconds)]
    except Exception as exc:
        row.update(eval_status="FAIL", eval_reason=f"the CPU eager reference failed: {one_line(exc)}", eval_error=traceback.format_exc())
        return
    row.update(row_columns(comparisons), eval_reference_cache_hit=hit)
    row["eval_s"] = device["seconds"] + time.perf_counter() - start


def not_run(plan: ProbePlan, row: dict, why: str) -> None:
    """The eval was asked for, but the probe failed before it could run."""
    row.update(eval_tasks=task_names(plan.request.eval_tasks), eval_limit=plan.request.eval_limit, eval_reason=f"not run: {why}")
