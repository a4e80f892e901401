"""`assay probe MODEL`: the fixed compatibility probe for one checkpoint on one stack.

Load with from_pretrained on the device, generate N tokens greedily with a static cache under
torch.compile, compare with a CPU eager run of the same checkpoint, record one dataset row.
The steps live by concern: resolve.py (what MODEL names), plan.py (the checked request and its row),
reference.py (the CPU eager reference and the comparison); this module runs them.
"""

from __future__ import annotations

import time
import traceback
from assay.compat.probe import recipe, stages
from assay.compat.probe.plan import plan_probe
from assay.compat.probe.reasons import combine, recompile_reasons
from assay.compat.probe.reference import compare_with_reference, record_drift, record_texts, run_reference
from assay.compat.probe.request import ProbePlan, ProbeRequest, classify_exception, one_line
from assay.compat.probe.resolve import resolve_model
from assay.compat.results.schema import IMAGE_TASKS, TEXT_TASKS
from assay.core import compiling
from assay.core.compiling import CompileStats, counting_backend, watch
from assay.core.device import PeakMemory


def probe(request: ProbeRequest) -> dict:
    """Run the probe in this process and return its dataset row (not yet written)."""
    return execute(plan_probe(request))


def execute(plan: ProbePlan) -> dict:
    request, ref, task, device, backend, row = plan.request, plan.ref, plan.task, plan.device, plan.backend, dict(plan.row)
    started = time.perf_counter()

    def finish(status: str, reason: str, error: str | None = None) -> dict:
        if request.eval_tasks and row.get("eval_tasks") is None:  # asked for, but the probe ended before it
            from assay.compat.probe.evaluation import not_run

            not_run(plan, row, f"the probe ended {status}")
        record_texts(row, ref.load_path)
        row.update(status=status, reason=reason, error=error, total_s=time.perf_counter() - started)
        stages.stage(ref.name, f"done: {status}")
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
            stages.stage(ref.name, "load", f"{task} on {device}, {request.dtype}")
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
            stages.stage(ref.name, "compile", f"backend {backend}, the first generate of {request.new_tokens} tokens")
            with watch(stats), recompile_reasons() as recompiles:
                compile_start = time.perf_counter()
                tokens, _, logits = recipe.generate_logits(model, inputs, request.new_tokens, config, output_scores=False)
                row["compile_s"] = time.perf_counter() - compile_start
        except Exception as exc:
            _record_compile_stats(row, stats, recompiles)
            return finish(classify_exception(exc, "compile"), one_line(exc), traceback.format_exc())
        _record_compile_phases(row, dynamo_before)
        try:
            stages.stage(ref.name, "generate", f"{request.new_tokens} tokens, compiled and warm")
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
    stages.stage(ref.name, "reference", "CPU eager" + (", from the reference cache if it holds this run" if request.reference_cache else ""))
    try:
        reference = run_reference(plan, row, model if device.type == "cpu" else None, inputs if device.type == "cpu" else None)
    except Exception as exc:
        return finish(classify_exception(exc, "run"), f"CPU eager reference failed: {one_line(exc)}", traceback.format_exc())
    status, reason = compare_with_reference(row, tokens, reference)
    record_drift(row, plan, tokens, logits, reference)
    # 4. --eval: task accuracy on the device, next to the CPU eager reference's. After FAIL_ACCURACY too:
    # tokens that diverge after a near-tie may still answer every item the same.
    if request.eval_tasks:
        from assay.compat.eval.task_files import task_names
        from assay.compat.probe.evaluation import record_eval, score_on_device

        stages.stage(ref.name, "eval", f"{', '.join(task_names(request.eval_tasks))} on the device, then on the CPU eager reference")
        record_eval(plan, row, score_on_device(plan, model), cpu_model=model if device.type == "cpu" else None)
    return finish(status, reason)


def _execute_sharded(plan: ProbePlan, row: dict, finish) -> dict:
    from assay.compat.probe.sharded import probe_rank

    request = plan.request
    eval_paths = []
    if request.eval_tasks:
        from assay.compat.eval.task_files import task_file

        eval_paths = [str(task_file(spec)) for spec in request.eval_tasks]
    stages.stage(plan.ref.name, "sharded run", f"load, compile and generate over {request.devices} {plan.device.type} processes")
    report = recipe.launch(
        probe_rank, request.devices, plan.device.type,
        args=(plan.ref.load_path, plan.task, plan.device.type, request.dtype, row["parallelism"], request.devices, plan.backend, request.new_tokens,
              eval_paths, request.eval_limit),
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

        from assay.compat.probe.judge import judge_text

        text = AutoTokenizer.from_pretrained(plan.ref.load_path).decode(tokens, skip_special_tokens=True)
        verdict = judge_text(text, resolve_model(request.judge).load_path)
        notes.append(verdict.reason)
    where = f"sharded over {request.devices} ({row['parallelism']} parallel)"
    if request.eval_tasks:  # every rank scored the tasks (the same forwards, so the collectives match); rank 0 reported
        from assay.compat.probe.evaluation import record_eval

        record_eval(plan, row, report["eval"], with_reference=request.reference)
    if request.reference:
        stages.stage(plan.ref.name, "reference", "CPU eager, one device")
        reference = run_reference(plan, row)
        status, reason = compare_with_reference(row, tokens, reference, what="single-device CPU eager")
        record_drift(row, plan, tokens, report.get("logits"), reference)
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

