"""A probe's plan: the request checked (bad input raises AssayError) and its row laid out, before any
model work: the stack, the task, how the model is sharded, the run.py and the one-line command."""

from __future__ import annotations

import platform
from dataclasses import replace
from datetime import datetime, timezone

from assay import __version__
from assay.compat.probe.request import ModelRef, ProbePlan, ProbeRequest
from assay.compat.probe.request_checks import check_probe_request
from assay.compat.probe.resolve import infer_task
from assay.compat.probe.runpy import render_run_py
from assay.compat.results.schema import SCHEMA_VERSION, empty_row
from assay.core.device import resolve_backend, resolve_device
from assay.core.errors import AssayError
from assay.core.stack import collect_stack
from assay.models.auto import model_code_for


def plan_probe(request: ProbeRequest) -> ProbePlan:
    """Check the request (bad input raises AssayError) and lay out its row, before any model work."""
    ref = check_probe_request(request)
    device = resolve_device(request.device)
    backend = resolve_backend(request.backend)
    task = infer_task(ref, request.task)
    stack = collect_stack(device.type, backend)
    parallelism = "single" if request.devices == 1 else sharding_plan(ref, request.parallelism)
    if request.devices > 1 and not request.judge and not request.reference:
        # The judge decides here: the real model when the `real` extra is installed (judge.py).
        from assay.compat.probe.judge import default_judge

        judge = default_judge()
        if judge is None:
            raise AssayError("a sharded probe without a single-device reference needs --judge MODEL (or the `real` extra's default judge)")
        request = replace(request, judge=judge)
    if request.eval_tasks:
        from assay.compat.eval.task_files import check_eval_tasks

        request = replace(request, eval_tasks=check_eval_tasks(tuple(request.eval_tasks)))
    checks = ["tokens-vs-cpu-eager"] if request.reference else []
    if request.devices > 1 and request.judge:
        checks.append("judge")
    row = empty_row() | {
        "model": ref.name,
        "model_name": ref.name.rsplit("/", 1)[-1],
        "task": task,
        "architecture": (ref.config.get("architectures") or [None])[0] or ref.config.get("model_type"),
        "stands_in_for": ref.stands_in_for,
        "device": str(device),
        "device_name": stack.device_name,
        "backend": backend,
        "dtype": request.dtype,
        "num_devices": request.devices,
        "parallelism": parallelism,
        "stack_id": stack.stack_id,
        "stack_label": stack.label,
        "versions": stack.versions_json(),
        "new_tokens": request.new_tokens,
        "check": "+".join(checks),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "assay_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }
    row["model_code"] = model_code_for(ref.config.get("model_type"))
    row["run_py"] = render_run_py(
        model_path=ref.load_path, task=task, device=str(device), dtype=request.dtype, backend=backend,
        new_tokens=request.new_tokens, stack_label=stack.label, stack_id=stack.stack_id,
        parallelism=parallelism, num_devices=request.devices, model_code=row["model_code"], eval_tasks=request.eval_tasks,
        eval_limit=request.eval_limit,
    )
    row["command"] = (
        f"assay probe {request.model} --device {request.device} --backend {backend} --dtype {request.dtype} "
        f"--new-tokens {request.new_tokens}"
        + (f" --devices {request.devices}" if request.devices > 1 else "")
        + (f" --judge {request.judge}" if request.judge else "")
        + (f" --eval {','.join(request.eval_tasks)}" if request.eval_tasks else "")
        + (f" --eval-limit {request.eval_limit}" if request.eval_limit is not None else "")
        + " --out results/"
    )
    return ProbePlan(request, ref, task, device, backend, row)


def sharding_plan(ref: ModelRef, wanted: str = "auto") -> str:
    """How a model is sharded (compat.md): tensor parallel where it has a TP plan, else expert
    parallel for MoE models with an expert plan; anything else cannot be sharded."""
    from transformers import CONFIG_MAPPING

    model_type = ref.config.get("model_type")
    try:
        config_class = CONFIG_MAPPING[model_type] if model_type else None
    except KeyError:
        config_class = None
    if config_class is None and ref.config:
        raise AssayError(f"{ref.name}: unknown model_type {model_type!r}, cannot plan a sharded probe")
    has_tp = config_class is None or bool(getattr(config_class, "base_model_tp_plan", None))
    has_ep = config_class is not None and bool(getattr(config_class, "base_model_ep_plan", None))
    if wanted == "tensor" and not has_tp or wanted == "expert" and not has_ep:
        raise AssayError(f"{ref.name} ({model_type}) has no {wanted}-parallel plan")
    if wanted != "auto":
        return wanted
    if has_tp:
        return "tensor"
    if has_ep:
        return "expert"
    raise AssayError(f"{ref.name} ({model_type}) has neither a tensor- nor an expert-parallel plan: it can only be probed on one device")
