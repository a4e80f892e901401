"""`assay probe MODEL`: the fixed compatibility probe for one checkpoint on one stack.

Load with from_pretrained on the device, generate N tokens greedily with a static cache under
torch.compile, compare with a CPU eager run of the same checkpoint, record one dataset row.
"""

from __future__ import annotations

import platform
import time
import traceback
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from assay import __version__
from assay.compat import recipe
from assay.compat.request import DTYPES, OOM_MESSAGES, ModelRef, ProbePlan, ProbeRequest, classify_exception, one_line  # noqa: F401  (public here too)
from assay.compat.reasons import combine, recompile_reasons
from assay.compat.runpy import render_run_py
from assay.compat.schema import IMAGE_TASKS, SCHEMA_VERSION, TEXT_TASKS, empty_row
from assay.core import compiling
from assay.core.compiling import CompileStats, counting_backend, watch
from assay.core.device import PeakMemory, resolve_backend, resolve_device
from assay.core.dtypes import DTYPE_NAMES
from assay.core.errors import AssayError
from assay.core.numerics import compare_tokens
from assay.core.stack import collect_stack
from assay.models.auto import model_code_for

def resolve_model(model: str) -> ModelRef:
    """A local folder must be a checkpoint with a tokenizer (else bad input, docs/errors.md); anything else
    that looks like `org/name` is a Hub id. A checkpoint whose config.json is not JSON is broken, not bad
    input: it keeps its `damage` and is recorded as FAIL_LOAD."""
    from assay.core.checks import inspect_checkpoint
    from assay.zoo.identity import zoo_identity

    path = Path(model).expanduser()
    if path.exists():
        state = inspect_checkpoint(path, weights=False)  # the weights are the load's to judge (FAIL_LOAD)
        zoo = zoo_identity(path)  # the zoo name only for intact zoo files: a damaged copy is its path
        if zoo is not None:
            return ModelRef(str(path.resolve()), f"assay-zoo/{zoo['name']}", state.config, zoo.get("stands_in_for"), zoo.get("task"), state.damage)
        return ModelRef(str(path.resolve()), str(path.resolve()), state.config, damage=state.damage)
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or model.endswith(("/", ".json", ".safetensors"))
    if looks_local or not model.strip():
        raise AssayError(f"{model} is not a checkpoint (no such folder) and not a Hub model id")
    return ModelRef(model, model)


def infer_task(ref: ModelRef, override: str | None) -> str:
    if override:
        return override
    if ref.zoo_task:
        return ref.zoo_task
    architectures = ref.config.get("architectures") or []
    if "vision_config" in ref.config or any("ConditionalGeneration" in a for a in architectures):
        return "image-text-to-text"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "text-generation"
    if not ref.config:  # a Hub id: from_pretrained decides; the common case is a causal LM
        return "text-generation"
    if not architectures and is_causal_lm_type(ref.config.get("model_type")):
        return "text-generation"
    return f"unsupported ({', '.join(architectures) or ref.config.get('model_type', 'unknown')})"


def is_causal_lm_type(model_type: str | None) -> bool:
    """Whether AutoModelForCausalLM builds a model for this config model_type: what from_pretrained does
    for a config without `architectures` (a converted GGUF checkpoint, a hand-written config). Asks the
    Auto class's own mapping, so every architecture Transformers (or an assay registration) adds counts."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    try:
        config_class = CONFIG_MAPPING[model_type] if model_type else None
    except KeyError:
        return False
    return config_class is not None and config_class in AutoModelForCausalLM._model_mapping


def plan_probe(request: ProbeRequest) -> ProbePlan:
    """Check the request (bad input raises AssayError) and lay out its row, before any model work."""
    if request.dtype not in DTYPES:
        raise AssayError(f"unknown dtype {request.dtype!r} (choose from {', '.join(DTYPES)})")
    if request.new_tokens < 1:
        raise AssayError("--new-tokens must be at least 1")
    if request.reference_dtype not in (None, request.dtype, "float64"):
        raise AssayError(f"--reference-dtype {request.reference_dtype!r}: the reference runs in the probe's dtype or in float64")
    device = resolve_device(request.device)
    backend = resolve_backend(request.backend)
    ref = resolve_model(request.model)
    task = infer_task(ref, request.task)
    stack = collect_stack(device.type, backend)
    if request.devices < 1:
        raise AssayError("--devices must be at least 1")
    if request.parallelism not in ("auto", "tensor", "expert"):
        raise AssayError(f"unknown parallelism {request.parallelism!r} (auto, tensor or expert)")
    parallelism = "single" if request.devices == 1 else sharding_plan(ref, request.parallelism)
    if request.devices > 1 and not request.judge and not request.reference:
        # The judge decides here: the real model when the `real` extra is installed (judge.py).
        from assay.compat.judge import default_judge

        judge = default_judge()
        if judge is None:
            raise AssayError("a sharded probe without a single-device reference needs --judge MODEL (or the `real` extra's default judge)")
        request = replace(request, judge=judge)
    if request.judge:
        resolve_model(request.judge)  # a bad judge path is bad input, found before any work
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
        parallelism=parallelism, num_devices=request.devices, model_code=row["model_code"],
    )
    row["command"] = (
        f"assay probe {request.model} --device {request.device} --backend {backend} --dtype {request.dtype} "
        f"--new-tokens {request.new_tokens}"
        + (f" --devices {request.devices}" if request.devices > 1 else "")
        + (f" --judge {request.judge}" if request.judge else "")
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


def probe(request: ProbeRequest) -> dict:
    """Run the probe in this process and return its dataset row (not yet written)."""
    return execute(plan_probe(request))


def execute(plan: ProbePlan) -> dict:
    request, ref, task, device, backend, row = plan.request, plan.ref, plan.task, plan.device, plan.backend, dict(plan.row)
    started = time.perf_counter()

    def finish(status: str, reason: str, error: str | None = None) -> dict:
        row.update(status=status, reason=reason, error=error, total_s=time.perf_counter() - started)
        return row

    if request.skip_reason:
        return finish("SKIPPED", request.skip_reason)
    if ref.damage:
        return finish("FAIL_LOAD", ref.damage)
    if task not in TEXT_TASKS + IMAGE_TASKS:
        return finish("SKIPPED", f"task {task} is outside the probe's scope (text-generation, image-text-to-text)")
    if request.devices > 1:
        return _execute_sharded(plan, row, finish)

    stats = CompileStats()
    meter = PeakMemory(device)
    with meter:
        # 1. load on the device
        try:
            load_start = time.perf_counter()
            model = recipe.load_model(ref.load_path, task, str(device), request.dtype)
            inputs = recipe.make_inputs(ref.load_path, task, str(device))
            row["load_s"] = time.perf_counter() - load_start
            row["cache_kind"] = recipe.cache_kind(model)
            row["prompt_tokens"] = int(inputs["input_ids"].shape[1])
        except Exception as exc:  # any failure to load is a result, not a crash
            return finish(classify_exception(exc, "load"), one_line(exc), traceback.format_exc())

        # 2. compiled generation: the first call compiles, the second measures warm decoding.
        # Forget what earlier probes in this process compiled: dynamo keys its cache on code objects
        # that every Transformers model shares, and its recompile limit would silently leave later
        # models eager.
        compiling.reset()
        config = recipe.compile_config(counting_backend(backend, stats))
        dynamo_before = _dynamo_seconds()
        try:
            with watch(stats), recompile_reasons() as recompiles:
                compile_start = time.perf_counter()
                tokens, _, logits = recipe.generate_logits(model, inputs, request.new_tokens, config, output_scores=False)
                row["compile_s"] = time.perf_counter() - compile_start
        except Exception as exc:
            _record_compile_stats(row, stats, recompiles)
            return finish(classify_exception(exc, "compile"), one_line(exc), traceback.format_exc())
        _record_compile_phases(row, dynamo_before)
        try:
            with watch(stats), recompile_reasons() as more_recompiles:
                decode_start = time.perf_counter()
                recipe.generate(model, inputs, request.new_tokens, config)
                row["generate_s"] = time.perf_counter() - decode_start
                row["decode_tokens_per_s"] = request.new_tokens / row["generate_s"]
        except Exception as exc:
            _record_compile_stats(row, stats, recompiles + more_recompiles)
            return finish(classify_exception(exc, "run"), one_line(exc), traceback.format_exc())
    row["peak_memory_bytes"] = meter.peak_bytes
    row["memory_kind"] = meter.kind
    row["generated_tokens"] = tokens
    _record_compile_stats(row, stats, recompiles + more_recompiles)
    if stats.graphs == 0:
        # Nothing reached the backend: dynamo ran everything eager (skipped frames, recompile limit).
        # Equal tokens would then say nothing about the compiler.
        return finish("FAIL_COMPILE", f"torch.compile(backend={backend!r}) compiled no graph: the model ran eager")

    # 3. the reference: CPU eager, same checkpoint and dtype. From the reference cache when it holds this
    # run; else on the model object already loaded when the device under test is the CPU (one load serves
    # both runs: the compiled run changes no weight, and generate(disable_compile=True) runs it eager).
    try:
        reference = run_reference(plan, row, model if device.type == "cpu" else None, inputs if device.type == "cpu" else None)
    except Exception as exc:
        return finish(classify_exception(exc, "run"), f"CPU eager reference failed: {one_line(exc)}", traceback.format_exc())
    status, reason = compare_with_reference(row, tokens, reference)
    record_drift(row, plan, tokens, logits, reference)
    return finish(status, reason)


def reference_dtype(request: ProbeRequest) -> str:
    return request.reference_dtype or request.dtype


def record_drift(row: dict, plan: ProbePlan, tokens: list[int], logits, reference: tuple) -> None:
    """The logit drift columns (drift.py): the compiled run's logits against the reference's."""
    from assay.compat.drift import compared_steps, logit_drift

    reference_logits = reference[2]
    if logits is None or reference_logits is None:
        return
    steps = compared_steps(tokens, reference[0])
    row.update(logit_drift(logits, reference_logits, steps).row_columns(reference_dtype(plan.request)))


def run_reference(plan: ProbePlan, row: dict, model=None, inputs=None) -> tuple[list[int], list[list[int]], "torch.Tensor"]:
    """The CPU eager reference: (tokens, top-5 token ids per step, logits [steps, vocab]), from the
    reference cache or run here.

    `model`/`inputs`: already loaded on the CPU in the probe's dtype (used unless the reference is
    asked in float64). Fills the row's reference_s and reference_cache_hit (None when no cache was
    consulted: disabled, or a Hub id that cannot be keyed by content).
    """
    start = time.perf_counter()
    dtype = reference_dtype(plan.request)
    cache, key = None, None
    if plan.request.reference_cache is not None:
        from assay.compat.reference_cache import ReferenceCache, default_root, reference_key

        cache = ReferenceCache(default_root() if plan.request.reference_cache == "auto" else plan.request.reference_cache)
        key = reference_key(plan)
    if key is not None:
        cached = cache.load(key, plan.request.new_tokens)
        cached_logits = cache.load_logits(key, plan.request.new_tokens) if cached is not None else None
        # An entry from before logits were kept is a miss: the rerun stores them, and the row gets its drift.
        row["reference_cache_hit"] = cached_logits is not None
        if cached_logits is not None:
            row["reference_s"] = time.perf_counter() - start
            return (*cached, cached_logits)
    if model is None or dtype != plan.request.dtype:
        model = recipe.load_model(plan.ref.load_path, plan.task, "cpu", dtype)
        inputs = recipe.make_inputs(plan.ref.load_path, plan.task, "cpu")
        inputs = {name: value.to(getattr(torch, dtype)) if value.is_floating_point() else value for name, value in inputs.items()}
    tokens, top5, logits = recipe.generate_logits(model, inputs, plan.request.new_tokens, None)
    if key is not None:
        cache.store(key, tokens, top5, plan.ref.name)
        cache.store_logits(key, logits)
    row["reference_s"] = time.perf_counter() - start
    return tokens, top5, logits


def compare_with_reference(row: dict, tokens: list[int], reference: tuple[list[int], list[list[int]]], what: str = "CPU eager") -> tuple[str, str]:
    """The one token comparison: fills the reference and mismatch columns, returns (status, reason)."""
    reference_tokens, top5 = reference[0], reference[1]
    row["reference_tokens"] = reference_tokens
    mismatch = compare_tokens(tokens, reference_tokens, top5)
    if mismatch is None:
        return "PASS", f"{len(tokens)} greedy tokens equal the {what} reference"
    row.update(
        first_mismatch=mismatch.position, mismatch_expected=mismatch.expected, mismatch_actual=mismatch.actual,
        mismatch_in_top5=mismatch.actual_in_reference_top5,
    )
    verdict = "in the reference's top-5 (numerical drift)" if mismatch.actual_in_reference_top5 else "not in the reference's top-5 (garbage)"
    return "FAIL_ACCURACY", f"token {mismatch.position} differs: device {mismatch.actual}, reference {mismatch.expected}; device token {verdict}"


def _execute_sharded(plan: ProbePlan, row: dict, finish) -> dict:
    from assay.compat.sharded import probe_rank

    request = plan.request
    report = recipe.launch(
        probe_rank, request.devices, plan.device.type,
        args=(plan.ref.load_path, plan.task, plan.device.type, request.dtype, row["parallelism"], request.devices, plan.backend, request.new_tokens),
    )
    for key in ("load_s", "compile_s", "decode_tokens_per_s", "prompt_tokens", "peak_memory_bytes", "memory_kind"):
        row[key] = report.get(key)
    stats = report.get("stats") or {}
    row.update(graphs=stats.get("graphs"), graph_breaks=stats.get("graph_breaks"), recompiles=stats.get("recompiles"))
    if report["failure"]:
        status, reason, error = report["failure"]
        return finish(status, f"sharded over {request.devices} ({row['parallelism']} parallel): {reason}", error)
    tokens = report["tokens"]
    row["generated_tokens"] = tokens
    # Checks: token equality with a single-device run is the stronger one and decides when present;
    # the judge decides only without it (fluency is not correctness: compat.md).
    notes = []
    verdict = None
    if request.judge:
        from transformers import AutoTokenizer

        from assay.compat.judge import judge_text

        text = AutoTokenizer.from_pretrained(plan.ref.load_path).decode(tokens, skip_special_tokens=True)
        verdict = judge_text(text, resolve_model(request.judge).load_path)
        notes.append(verdict.reason)
    where = f"sharded over {request.devices} ({row['parallelism']} parallel)"
    if request.reference:
        status, reason = compare_with_reference(row, tokens, run_reference(plan, row), what="single-device CPU eager")
        return finish(status, f"{where}: {reason}" + "".join(f"; {n}" for n in notes))
    if verdict is not None and not verdict.fluent:
        return finish("FAIL_ACCURACY", f"{where}: {verdict.reason}")
    return finish("PASS", f"{where}: {verdict.reason}")


def _dynamo_seconds() -> tuple[float, float]:
    """(dynamo's frame compiles, the backend compiler's part of them) so far in this process, in seconds."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    return sum(metrics.get("_compile.compile_inner", ())), sum(metrics.get("OutputGraph.call_user_compiler", ()))


def _record_compile_phases(row: dict, before: tuple[float, float]) -> None:
    """Split the first compiled generate (compile_s) into dynamo tracing, the backend compiler, and the
    rest: running the first call itself (guards, eager prefill parts, the generated code's first run)."""
    total, backend = (after - was for after, was in zip(_dynamo_seconds(), before))
    row["trace_s"] = total - backend
    row["backend_compile_s"] = backend
    row["first_call_s"] = max(row["compile_s"] - total, 0.0)


def _record_compile_stats(row: dict, stats: CompileStats, recompiles: list[str] = ()) -> None:
    row["compile_reasons"] = combine(stats.break_reasons, list(recompiles))
    row["graphs"] = stats.graphs
    row["graph_breaks"] = stats.graph_breaks
    row["recompiles"] = stats.recompiles
    row["compile_cache_hit"] = stats.cache_hit


def probe_and_record(request: ProbeRequest, out: str | Path, timeout: float | None = None, memory_limit_bytes: int | None = None) -> dict:
    """Probe and write the row. With a timeout or memory limit the probe runs in its own process."""
    from assay.compat.dataset import check_results_target, init_results, write_row

    check_results_target(out)  # a bad --out fails before minutes of work, not after
    plan = plan_probe(request)
    init_results(out)  # created only once the request is known good: bad input leaves nothing behind
    if timeout is None and memory_limit_bytes is None:
        row = execute(plan)
    else:
        from assay.compat.isolate import run_isolated

        row = run_isolated(plan, timeout=timeout, memory_limit_bytes=memory_limit_bytes)
    write_row(out, row)
    return row
