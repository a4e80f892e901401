"""`assay sweep --executor ray`: each probe a Ray task asking for its devices/cores.

The task runs the same isolated probe as the local executor (its own process, killed at the
timeout), on whichever node of the cluster Ray places it; rows come back to the sweep's process,
which alone writes the dataset. Ray is optional (`pip install ray`); without it this executor
refuses with one clear line.
"""

from __future__ import annotations

from typing import Iterator

from assay.compat.probe.request import ProbePlan
from assay.core.errors import AssayError

RESOURCE_NAME = {"cuda": "num_gpus"}  # other accelerators are custom resources named after the device type


def _probe_task(plan_json: str, timeout: float, memory_limit_bytes, env: dict) -> dict:
    # The plan travels as its JSON (what the probe's child reads too), not as a pickled object.
    from assay.compat.run.isolate import run_isolated

    return run_isolated(ProbePlan.from_json(plan_json), timeout=timeout, memory_limit_bytes=memory_limit_bytes, env=env)


def run_on_ray(plans: list[ProbePlan], needs: dict, request, cache_env: dict, progress) -> Iterator[dict]:
    try:
        import ray
    except ImportError:
        raise AssayError("--executor ray needs Ray: pip install ray") from None
    if not ray.is_initialized():
        # RAY_ADDRESS (or a running local cluster) is joined; otherwise a local instance is started.
        ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    remote = ray.remote(_probe_task)
    pending = {}
    for plan in plans:
        k = needs[id(plan)]
        device_type = plan.device.type
        options: dict = {"num_cpus": 1, "max_retries": 0}
        if device_type in RESOURCE_NAME:
            options[RESOURCE_NAME[device_type]] = k
        elif device_type != "cpu":
            options["resources"] = {device_type: k}
        else:
            options["num_cpus"] = k
        env = cache_env | {"OMP_NUM_THREADS": str(k)}
        pending[remote.options(**options).remote(plan.to_json(), request.timeout, request.memory_limit_bytes, env)] = plan
        progress.started(plan.row["model"])
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            plan = pending.pop(ref)
            try:
                yield ray.get(ref)
            except Exception as exc:  # the Ray task itself failed (node lost, ...): still a row
                row = dict(plan.row)
                row.update(status="CRASH", reason=f"Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", error=str(exc)[-4000:])
                yield row
