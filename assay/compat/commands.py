"""`assay probe|results|diff|sweep|merge`: the compatibility system's commands. Flags in, one call, a table
(or --json) out."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import backend_option, device_option, dtype_option, json_option, quiet_libraries
from assay.core.errors import AssayError
from assay.core.values import at_least, positive

RESULT_COLUMNS = ["model", "status", "dtype", "load_s", "compile_s", "decode_tokens_per_s", "total_s", "peak_memory_mb", "graphs", "graph_breaks", "recompiles", "reason"]
EVAL_COLUMNS = ["eval"]  # shown when a row has an eval: its status and, per task, device / reference accuracy
RESULT_HEADERS = {"decode_tokens_per_s": "tok/s", "peak_memory_mb": "peak MB", "graph_breaks": "breaks", "compile_s": "compile_s*"}
RESULT_FOOTNOTE = "compile_s*: first compiled generate (compilation + one generation); tok/s: second, warm generate"


def reference_cache_option():
    return typer.Option(None, "--reference-cache", help="folder of cached CPU eager references (default: $XDG_CACHE_HOME/assay/references)")


def no_reference_cache_option():
    return typer.Option(False, "--no-reference-cache", help="run the CPU eager reference every time; read and write no reference cache")


def reference_cache_setting(folder: Optional[Path], disabled: bool) -> Optional[str]:
    """ProbeRequest.reference_cache from the two flags: "auto", a folder, or None (no cache)."""
    if folder is not None and disabled:
        raise AssayError("--reference-cache and --no-reference-cache exclude each other")
    if disabled:
        return None
    if folder is None:
        return "auto"
    if folder.exists() and not folder.is_dir():
        raise AssayError(f"--reference-cache {folder} is not a folder")
    return str(folder.expanduser().resolve())


def eval_option():
    return typer.Option(None, "--eval", help="lm-eval tasks to score on the device and on the CPU eager reference: embedded names "
                        "(assay_cloze, assay_next_sentence, or `embedded` for both) or paths of lm-eval task YAML files, comma-separated")


def eval_limit_option():
    return typer.Option(None, "--eval-limit", help="with --eval: score only each task's first N documents (lm-eval's --limit); "
                        "the row records it, and its run.py scores the same documents")


def eval_setting(tasks: Optional[str]) -> tuple[str, ...]:
    if tasks is None:
        return ()
    from assay.compat.eval.task_files import parse_eval_tasks  # no lm_eval import: only the names and files are checked

    return parse_eval_tasks(tasks)


def reference_dtype_option():
    return typer.Option(None, "--reference-dtype", help="the CPU eager reference's dtype: the probe's (default) or float64, for the logit drift columns")


def _gib(value: Optional[float]) -> Optional[int]:
    return int(value * 2**30) if value is not None else None


def _display_rows(rows: list[dict]) -> list[dict]:
    return [r | {"peak_memory_mb": (r["peak_memory_bytes"] or 0) / 2**20 if r.get("peak_memory_bytes") else None, "eval": eval_summary(r)} for r in rows]


def _columns(rows: list[dict]) -> list[str]:
    """The result table's columns, with the eval's before the reason when any row has one."""
    if not any(r.get("eval_tasks") for r in rows):
        return RESULT_COLUMNS
    return RESULT_COLUMNS[:-1] + EVAL_COLUMNS + RESULT_COLUMNS[-1:]


def eval_summary(row: dict) -> Optional[str]:
    """ "AGREE: assay_cloze 0.31/0.31, ..." (device / reference accuracy per task), or why there is none."""
    if not row.get("eval_tasks"):
        return None
    if row.get("eval_accuracy") is None:
        return f"{row.get('eval_status') or '-'}: {row.get('eval_reason')}"
    references = row.get("eval_reference_accuracy") or [None] * len(row["eval_tasks"])
    shown = lambda value: "-" if value is None else f"{value:.2f}"  # noqa: E731
    tasks = ", ".join(f"{t} {shown(a)}/{shown(r)}" for t, a, r in zip(row["eval_tasks"], row["eval_accuracy"], references))
    return f"{row.get('eval_status') or 'device only'}: {tasks}"


def failed(row: dict) -> bool:
    """What --strict exits 1 on: a status other than PASS or SKIPPED, or an eval that disagreed or failed."""
    return row["status"] not in ("PASS", "SKIPPED") or row.get("eval_status") in ("DISAGREE", "FAIL")


def probe_command(
    model: str = typer.Argument(..., help="Hub id (Qwen/Qwen3-0.6B) or checkpoint folder"),
    device: str = device_option(),
    backend: str = backend_option(),
    dtype: str = dtype_option(),
    new_tokens: int = typer.Option(32, "--new-tokens", help="tokens to generate"),
    task: Optional[str] = typer.Option(None, help="override the task inferred from the checkpoint"),
    skip: Optional[str] = typer.Option(None, help="record a deliberate SKIPPED row with this reason instead of running"),
    devices: int = typer.Option(1, help="shard the model over this many devices (processes the probe starts itself)"),
    judge: Optional[str] = typer.Option(None, help="a small causal LM that scores the sharded output's fluency (default with --no-reference: SmolLM2-135M-Instruct, the `real` extra)"),
    no_reference: bool = typer.Option(False, "--no-reference", help="sharded: skip the single-device reference (the judge decides)"),
    parallelism: str = typer.Option("auto", help="sharded: auto (tensor where a TP plan exists, else expert), tensor or expert"),
    out: Path = typer.Option(Path("results"), help="results folder (one Parquet file per stack)"),
    timeout: Optional[float] = typer.Option(None, help="seconds; runs the probe in its own process and records TIMEOUT past it"),
    memory_limit_gb: Optional[float] = typer.Option(None, "--memory-limit-gb", help="address-space limit for the probe's own process (OOM past it)"),
    strict: bool = typer.Option(False, help="exit 1 unless the status is PASS or SKIPPED"),
    reference_cache: Optional[Path] = reference_cache_option(),
    no_reference_cache: bool = no_reference_cache_option(),
    reference_dtype: Optional[str] = reference_dtype_option(),
    triage: bool = typer.Option(False, "--triage", help="on FAIL_COMPILE, FAIL_ACCURACY or CRASH: minify the failure into repro_py (assay triage)"),
    triage_budget: float = typer.Option(600.0, "--triage-budget", help="seconds for --triage in all"),
    eval_tasks: Optional[str] = eval_option(),
    eval_limit: Optional[int] = eval_limit_option(),
    json_out: bool = json_option(),
):
    """Load, generate with a static cache under torch.compile, compare with CPU eager, record the row."""
    # Flags first: bad input fails here, before torch is imported and before --out exists.
    at_least("--new-tokens", new_tokens, 1)
    at_least("--devices", devices, 1)
    positive("--timeout", timeout)
    positive("--memory-limit-gb", memory_limit_gb)
    positive("--triage-budget", triage_budget)
    evals = eval_setting(eval_tasks)
    from assay.compat.probe.request import ProbeRequest
    from assay.compat.probe.request_checks import check_probe_request

    limit = _gib(memory_limit_gb)
    request = ProbeRequest(model, device, backend, dtype, new_tokens, task, skip, devices=devices, judge=judge, reference=not no_reference, parallelism=parallelism,
                           reference_cache=reference_cache_setting(reference_cache, no_reference_cache), reference_dtype=reference_dtype,
                           eval_tasks=evals, eval_limit=eval_limit)
    check_probe_request(request)  # paths, names and numbers: before torch is imported
    quiet_libraries()
    from assay.compat.run.single import probe_and_record
    from assay.core.output import STATUS_STYLES, print_json, print_table

    row = probe_and_record(request, out, timeout=timeout, memory_limit_bytes=limit, progress=True)
    from assay.compat.run.triage import TRIAGED, triage_row

    if triage and row["status"] in TRIAGED:
        from assay.compat.results.dataset import write_row

        row.update(triage_row(row, triage_budget).row_columns())
        write_row(out, row)
    if json_out:
        print_json({k: v for k, v in row.items() if k not in ("run_py", "versions")})
    else:
        print_table(_display_rows([row]), _columns([row]), title=f"probe on {row['stack_id']}", styles=STATUS_STYLES, headers=RESULT_HEADERS)
        if row.get("error"):
            typer.echo(row["error"].strip().splitlines()[-1], err=True)
        if row.get("eval_status") in ("DISAGREE", "FAIL"):
            typer.echo(f"eval {row['eval_status']}: {row['eval_reason']}", err=True)
    if strict and failed(row):
        raise typer.Exit(1)


def results_command(
    folder: Path = typer.Argument(..., help="results folder"),
    stack_filter: Optional[str] = typer.Option(None, "--stack", help="stack_id (or part of it)"),
    status: Optional[str] = typer.Option(None, help="only this status"),
    model: Optional[str] = typer.Option(None, help="part of the model name"),
    json_out: bool = json_option(),
):
    """What was tested, on which stack, with what result."""
    from assay.compat.results.dataset import query
    from assay.compat.results.schema import STATUSES
    from assay.core.output import STATUS_STYLES, print_json, print_table

    if status and status.upper() not in STATUSES:
        raise AssayError(f"unknown status {status!r} (one of {', '.join(STATUSES)})")
    rows = query(folder, stack=stack_filter, status=status, model=model)
    if json_out:
        print_json([{k: v for k, v in r.items() if k not in ("run_py",)} for r in rows])
        return
    stacks = sorted({r["stack_id"] for r in rows})
    for stack_id in stacks:
        stack_rows = [r for r in rows if r["stack_id"] == stack_id]
        passed = sum(r["status"] == "PASS" for r in stack_rows)
        tested = sum(r["status"] != "SKIPPED" for r in stack_rows)
        print_table(
            _display_rows(stack_rows), _columns(stack_rows), styles=STATUS_STYLES, headers=RESULT_HEADERS,
            title=f"{stack_id}: {passed}/{tested} PASS  ({stack_rows[0]['stack_label']})",
        )
    if rows:
        typer.echo(RESULT_FOOTNOTE)
    if not rows:
        typer.echo("no results recorded" + (" matching the filters" if (stack_filter or status or model) else ""))


def diff_command(
    folder: Path = typer.Argument(..., help="results folder"),
    base: str = typer.Option(..., help="the stack to compare from (stack_id or an unambiguous part)"),
    new: str = typer.Option(..., help="the stack to compare to"),
    json_out: bool = json_option(),
):
    """Per model, the status change between two stacks: regressions first; pass rate over models on both."""
    from assay.compat.results.diff import diff_stacks
    from assay.core.output import print_json, print_table

    result = diff_stacks(folder, base, new)
    if json_out:
        print_json(result.as_dict())
        return
    rows = [c.__dict__ for c in result.changes]
    columns = ["model", "dtype", "kind", "base_status", "new_status", "base_drift", "new_drift"]
    if any(c.base_eval or c.new_eval for c in result.changes):
        columns += ["base_eval", "new_eval"]
    print_table(rows, columns + ["new_reason"], title=f"{result.base} -> {result.new}",
                styles={"kind": {"regressed": "red", "failure_changed": "yellow", "eval_regressed": "red", "drift_regressed": "yellow", "fixed": "green"}},
                headers={"base_drift": "base logit rel", "new_drift": "new logit rel", "base_eval": "base eval", "new_eval": "new eval"})
    fmt = lambda r: "-" if r is None else f"{100 * r:.0f}%"  # noqa: E731
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items() if v)
    typer.echo(f"pass rate over {result.models_on_both} models tested on both: {fmt(result.base_pass_rate)} -> {fmt(result.new_pass_rate)}; {counts}")


def sweep_command(
    models: Optional[list[str]] = typer.Argument(None, help="Hub ids or checkpoint folders"),
    zoo: Optional[Path] = typer.Option(None, help="probe every checkpoint of a zoo folder"),
    list_file: Optional[Path] = typer.Option(None, "--list", help="a file with one model per line (# comments)"),
    out: Path = typer.Option(Path("results"), help="results folder"),
    device: str = device_option(),
    backend: str = backend_option(),
    dtype: str = dtype_option(),
    new_tokens: int = typer.Option(32, "--new-tokens"),
    workers: int = typer.Option(1, help="probes side by side, each with its share of devices/cores"),
    timeout: float = typer.Option(600.0, help="seconds per probe; past it the probe is killed and recorded TIMEOUT"),
    memory_limit_gb: Optional[float] = typer.Option(None, "--memory-limit-gb", help="address-space limit per probe process"),
    shard: Optional[str] = typer.Option(None, help="i/n: this machine's share of the model list"),
    executor: str = typer.Option("local", help="local or ray"),
    cache_dir: Optional[Path] = typer.Option(None, help="compile-cache folder for the probes (default: torch's)"),
    max_devices: int = typer.Option(1, help="most devices one probe may take (a model goes on the fewest that hold it)"),
    judge: Optional[str] = typer.Option(None, help="a small causal LM that scores sharded probes' fluency (default with --no-reference: SmolLM2-135M-Instruct, the `real` extra)"),
    no_reference: bool = typer.Option(False, "--no-reference", help="sharded probes: skip the single-device reference"),
    devices: Optional[int] = typer.Option(None, help="force this many devices per probe"),
    device_memory_gb: Optional[float] = typer.Option(None, "--device-memory-gb", help="per-device memory when the device cannot say"),
    force: bool = typer.Option(False, help="probe again models already recorded for this stack"),
    fresh_interpreter: bool = typer.Option(False, "--fresh-interpreter", help="start each probe as a new interpreter instead of forking a pre-imported one"),
    strict: bool = typer.Option(False, help="exit 1 if any probe failed"),
    reference_cache: Optional[Path] = reference_cache_option(),
    no_reference_cache: bool = no_reference_cache_option(),
    reference_dtype: Optional[str] = reference_dtype_option(),
    eval_tasks: Optional[str] = eval_option(),
    eval_limit: Optional[int] = eval_limit_option(),
    json_out: bool = json_option(),
):
    """Probe many models, each in its own process: resumable, parallel, sharded across machines."""
    positive("--memory-limit-gb", memory_limit_gb)
    positive("--device-memory-gb", device_memory_gb)
    evals = eval_setting(eval_tasks)
    from assay.compat.run.models_list import collect_models, parse_shard, shard_models
    from assay.compat.probe.request import ProbeRequest, SweepRequest
    from assay.compat.probe.request_checks import check_sweep_request

    chosen = shard_models(collect_models(models or [], str(zoo) if zoo else None, str(list_file) if list_file else None), parse_shard(shard))
    request = SweepRequest(
        models=chosen, out=out, probe=ProbeRequest(model="", device=device, backend=backend, dtype=dtype, new_tokens=new_tokens, judge=judge, reference=not no_reference,
                             reference_cache=reference_cache_setting(reference_cache, no_reference_cache), reference_dtype=reference_dtype,
                             eval_tasks=evals, eval_limit=eval_limit),
        workers=workers, timeout=timeout, memory_limit_bytes=_gib(memory_limit_gb),
        force=force, executor=executor, cache_dir=cache_dir, max_devices=max_devices, devices=devices,
        device_memory_bytes=_gib(device_memory_gb), progress=not json_out,
        fresh_interpreter=fresh_interpreter,
    )
    check_sweep_request(request)  # every flag and model, before torch, the zygote, the progress display or --out
    quiet_libraries()
    from assay.compat.run.sweep import is_failure, phase_summary, run_sweep
    from assay.core.output import STATUS_STYLES, print_json, print_table

    outcome = run_sweep(request)
    if json_out:
        print_json({"rows": [{k: v for k, v in r.items() if k not in ("run_py", "versions")} for r in outcome.rows],
                    "skipped_existing": outcome.skipped_existing, "counts": outcome.counts(), "wall_s": outcome.wall_s,
                    "phases": phase_summary(outcome.rows)})
    else:
        if outcome.rows:
            print_table(_display_rows(sorted(outcome.rows, key=lambda r: r["model"])), _columns(outcome.rows), styles=STATUS_STYLES,
                        headers=RESULT_HEADERS, title=f"sweep: {len(outcome.rows)} probed in {outcome.wall_s:.0f} s")
        if outcome.rows:
            phases = phase_summary(outcome.rows)
            typer.echo("time by phase, summed over probes (s): " + ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in phases.items() if k.endswith("_s"))
                       + f"; reference cache hits {phases['reference_cache_hits']}/{len(outcome.rows)}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(outcome.counts().items())) or "nothing probed"
        typer.echo(f"{counts}; {len(outcome.skipped_existing)} already recorded for this stack (--force redoes them)")
    if strict and any(is_failure(r) or r.get("eval_status") in ("DISAGREE", "FAIL") for r in outcome.rows):
        raise typer.Exit(1)


def merge_command(
    out: Path = typer.Argument(..., help="results folder to merge into"),
    sources: list[Path] = typer.Argument(..., help="result folders to merge (e.g. one per machine)"),
    json_out: bool = json_option(),
):
    """Merge result folders: rows of the same stack combined, one per model (the latest probe wins)."""
    from assay.compat.results.dataset import check_results_target, merge_results
    from assay.core.output import print_json, print_table

    check_results_target(out)
    per_stack = merge_results(out, sources)
    if json_out:
        print_json(per_stack)
    else:
        print_table([{"stack_id": k, "rows": v} for k, v in sorted(per_stack.items())], ["stack_id", "rows"], title=f"merged into {out}")


def triage_command(
    results: Path = typer.Argument(..., help="results folder"),
    model: str = typer.Option(..., help="the row's model (or an unambiguous part of it)"),
    stack: Optional[str] = typer.Option(None, help="stack_id (or an unambiguous part): needed when the model has rows on several stacks"),
    dtype: Optional[str] = typer.Option(None, help="the row's dtype, when it has rows in several"),
    budget: float = typer.Option(600.0, help="seconds for the rerun, the minifier and the check, in all"),
    after: str = typer.Option("dynamo", help="where torch's minifier cuts: dynamo (the FX graph dynamo captured) or aot (the ATen graph)"),
    json_out: bool = json_option(),
):
    """Minify a FAIL_COMPILE, FAIL_ACCURACY or CRASH row with torch's minifier; store and verify the repro."""
    positive("--budget", budget)
    quiet_libraries()
    from assay.compat.run.triage import TriageRequest, check_triage_options, triage as triage_results
    from assay.core.output import print_json, print_table

    check_triage_options(budget, after)
    row = triage_results(TriageRequest(str(results), model, stack, dtype, budget, after))
    shown = {k: row[k] for k in ("model", "stack_id", "status", "repro_lines", "repro_verified", "repro_after", "triage_s", "triage_reason")}
    if json_out:
        print_json(shown | {"repro_py": row["repro_py"]})
        return
    print_table([shown], list(shown), title=f"triage of {row['model']} on {row['stack_id']}")
    if row["repro_py"]:
        typer.echo(f"the repro: assay results {results} --model {row['model']} --json | jq -r '.[0].repro_py' > repro.py")


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)
    app.command("results")(results_command)
    app.command("diff")(diff_command)
    app.command("sweep")(sweep_command)
    app.command("merge")(merge_command)
    app.command("triage")(triage_command)
