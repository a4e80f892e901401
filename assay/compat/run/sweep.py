"""`assay sweep`: the probe over many models, each in its own process; resumable, parallel, sharded.

Rows are written by this process only, one at a time, each atomically: a sweep killed at any moment
(SIGKILL included) keeps every finished row, and its next run skips them (--force redoes them).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from assay.compat.results.dataset import init_results, recorded_evals, write_row
from assay.compat.run.isolate import run_isolated
from assay.compat.run.placement import DevicePool, child_env, devices_needed
from assay.compat.probe.plan import plan_probe
from assay.compat.probe.request import ProbePlan, SweepRequest
from assay.compat.probe.request_checks import check_sweep_request
from assay.compat.results.schema import FAILURES, ROW_KEY
from assay.core.device import device_count, resolve_device, total_memory_bytes


@dataclass
class SweepOutcome:
    rows: list[dict]
    skipped_existing: list[str]
    wall_s: float

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        return counts


def plan_sweep(request: SweepRequest) -> tuple[list[ProbePlan], list[str]]:
    """Plans for the models still to probe, and the models skipped as already recorded. The results
    folder is created only after every model was planned: a bad model path leaves nothing behind."""
    check_sweep_request(request)
    plans, already = [], []
    recorded: dict[str, dict] = {}
    device_type = resolve_device(request.probe.device).type
    per_device_memory = request.device_memory_bytes or total_memory_bytes(device_type)
    for model in request.models:
        plan = plan_probe(replace(request.probe, model=model))
        k = _devices_for(plan, request, per_device_memory)
        if k != plan.request.devices:
            plan = plan_probe(replace(plan.request, devices=k))
        stack_id = plan.row["stack_id"]
        if stack_id not in recorded:
            recorded[stack_id] = recorded_evals(request.out, stack_id)
        key = tuple(plan.row[k] for k in ROW_KEY)
        # A recorded row is done unless --eval asks for a task it did not score (or scored over other documents).
        if key in recorded[stack_id] and not request.force and _evals_recorded(plan, recorded[stack_id][key]):
            already.append(plan.row["model"])
            continue
        plans.append(plan)
    init_results(request.out)
    return plans, already


def _evals_recorded(plan: ProbePlan, recorded: set[tuple[str, int | None]]) -> bool:
    """Every --eval task was scored by the recorded row, over the same documents (--eval-limit)."""
    if not plan.request.eval_tasks:
        return True
    from assay.compat.eval.task_files import task_names

    return {(task, plan.request.eval_limit) for task in task_names(plan.request.eval_tasks)} <= recorded


def _devices_for(plan: ProbePlan, request: SweepRequest, per_device_memory: int) -> int:
    if request.devices:
        return request.devices
    return devices_needed(plan.ref.load_path, plan.request.dtype, per_device_memory, request.max_devices)


def run_sweep(request: SweepRequest) -> SweepOutcome:
    started = time.perf_counter()
    check_sweep_request(request)
    cache = {}
    if request.cache_dir is not None:
        from assay.core.compile_cache import cache_env

        cache = cache_env(request.cache_dir)
    # The zygote imports while the sweep plans; it is used by the local executor only (a Ray task is a
    # process of its own on whichever node Ray picks).
    zygote = None
    if request.executor == "local" and not request.fresh_interpreter:
        from assay.compat.run.zygote import PRELOAD_EVAL_ENV, start_zygote

        zygote = start_zygote(cache | ({PRELOAD_EVAL_ENV: "1"} if request.probe.eval_tasks else {}))
    try:
        return _run_sweep(request, started, cache, zygote)
    finally:
        if zygote is not None:
            zygote.close()


def _run_sweep(request: SweepRequest, started: float, cache: dict, zygote) -> SweepOutcome:
    plans, already = plan_sweep(request)
    device_type = plans[0].device.type if plans else "cpu"
    pool_size = max(device_count(device_type), 1)
    needs = {id(plan): plan.request.devices for plan in plans}
    cores = os.cpu_count() or 1

    from assay.compat.run.progress import SweepProgress

    rows: list[dict] = []
    with SweepProgress(len(plans), enabled=request.progress) as progress:
        if request.executor == "ray":
            from assay.compat.run.ray_executor import run_on_ray

            for row in run_on_ray(plans, needs, request, cache, progress):
                write_row(request.out, row)
                rows.append(row)
                progress.finished(row)
        elif request.executor == "local":
            # CPU: slots rather than devices (cores are shared out by thread counts); a probe that needs
            # k slots waits until k are free, so a sharded probe never runs beside others on 2 cores.
            slots = max(request.workers, max(needs.values(), default=1)) if device_type == "cpu" else pool_size
            pool = DevicePool(slots)
            threads_each = max(1, cores // request.workers)

            def run_one(plan: ProbePlan) -> dict:
                indices = pool.acquire(needs[id(plan)])
                try:
                    progress.started(plan.row["model"])
                    env = child_env(device_type, indices, threads_each) | cache
                    return run_isolated(plan, timeout=request.timeout, memory_limit_bytes=request.memory_limit_bytes, env=env, zygote=zygote)
                finally:
                    pool.release(indices)

            executor = ThreadPoolExecutor(max_workers=request.workers)
            try:
                pending: set[Future] = {executor.submit(run_one, plan) for plan in plans}
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        row = future.result()
                        write_row(request.out, row)  # only this thread writes: one row at a time
                        rows.append(row)
                        progress.finished(row)
            finally:
                # Not `with`: on SIGTERM or Ctrl-C its exit would wait for every queued probe. The queued
                # ones are dropped; the running ones end with the zygote, which run_sweep closes next.
                executor.shutdown(wait=False, cancel_futures=True)
    return SweepOutcome(rows, already, time.perf_counter() - started)


# A probe's phases in order (docs/dataset.md, "Phases"); compile_s is trace_s + backend_compile_s + first_call_s;
# eval_s (--eval) is the device's and the reference's scoring of the tasks.
PHASES = ("load_s", "reference_s", "trace_s", "backend_compile_s", "first_call_s", "generate_s", "eval_s", "compile_cache_io_s", "total_s")


def phase_summary(rows: list[dict]) -> dict:
    """Each phase's seconds summed over the rows (missing: 0), and how many references the cache served."""
    summary: dict = {phase: sum(row.get(phase) or 0.0 for row in rows) for phase in PHASES}
    summary["reference_cache_hits"] = sum(bool(row.get("reference_cache_hit")) for row in rows)
    return summary


def is_failure(row: dict) -> bool:
    return row["status"] in FAILURES
