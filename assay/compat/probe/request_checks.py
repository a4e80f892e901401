"""The probe's and the sweep's flags, checked before torch is imported and before --out exists.

A wrong path, name or number is the user's mistake: it gets its one line in a fraction of a second,
not after the 2-4 s that importing torch and dynamo take. What needs torch (is the device there, is
the backend registered) is plan.py's, right after. Only the standard library and torch-free modules.
"""

from __future__ import annotations

from dataclasses import replace

from assay.compat.probe.request import ModelRef, ProbeRequest, SweepRequest
from assay.core.dtypes import DTYPE_NAMES
from assay.compat.probe.resolve import resolve_model
from assay.core.errors import AssayError
from assay.core.values import at_least, positive

EXECUTORS = ("local", "ray")
PARALLELISMS = ("auto", "tensor", "expert")


def check_probe_request(request: ProbeRequest) -> ModelRef:
    """The request's own values and its model and judge paths; the model as resolved."""
    if request.dtype not in DTYPE_NAMES:
        raise AssayError(f"unknown dtype {request.dtype!r} (choose from {', '.join(DTYPE_NAMES)})")
    if request.new_tokens < 1:
        raise AssayError("--new-tokens must be at least 1")
    if request.reference_dtype not in (None, request.dtype, "float64"):
        raise AssayError(f"--reference-dtype {request.reference_dtype!r}: the reference runs in the probe's dtype or in float64")
    if request.devices < 1:
        raise AssayError("--devices must be at least 1")
    if request.eval_limit is not None:
        if not request.eval_tasks:
            raise AssayError("--eval-limit needs --eval: it limits the documents each task scores")
        if request.eval_limit < 1:
            raise AssayError("--eval-limit must be at least 1")
    if request.parallelism not in PARALLELISMS:
        raise AssayError(f"unknown parallelism {request.parallelism!r} (auto, tensor or expert)")
    ref = resolve_model(request.model)
    if request.judge:
        resolve_model(request.judge)  # a bad judge path is bad input, found before any work
    return ref


def check_sweep_request(request: SweepRequest) -> None:
    """Every flag of the sweep and every model it names, checked before anything starts (the zygote,
    the progress display) and before the results folder is created: one line, nothing left behind."""
    from assay.compat.results.dataset import check_results_target
    from assay.core.checks import check_output_folder

    at_least("--workers", request.workers, 1)
    positive("--timeout", request.timeout)
    positive("--memory-limit-gb", request.memory_limit_bytes)
    at_least("--max-devices", request.max_devices, 1)
    at_least("--devices", request.devices, 1)
    positive("--device-memory-gb", request.device_memory_bytes)
    if request.executor not in EXECUTORS:
        raise AssayError(f"unknown --executor {request.executor!r} (local or ray)")
    check_output_folder("--cache-dir", request.cache_dir)
    check_results_target(request.out)
    for model in request.models:
        check_probe_request(replace(request.probe, model=model))
