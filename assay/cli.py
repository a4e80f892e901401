"""The `assay` command: one sub-command per job. Parses flags, calls one function, prints its result.

Exit codes (design.md): 0 success; 1 the job ran and found a failure (--strict); 2 bad usage or input,
with one line on stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from assay.core.errors import AssayError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=__doc__.splitlines()[0])
zoo_app = typer.Typer(no_args_is_help=True, help="The tiny model zoo.")
app.add_typer(zoo_app, name="zoo")

RESULT_COLUMNS = ["model", "status", "dtype", "load_s", "compile_s", "decode_tokens_per_s", "total_s", "peak_memory_mb", "graphs", "graph_breaks", "recompiles", "reason"]
RESULT_HEADERS = {"decode_tokens_per_s": "tok/s", "peak_memory_mb": "peak MB", "graph_breaks": "breaks", "compile_s": "compile_s*"}
RESULT_FOOTNOTE = "compile_s*: first compiled generate (compilation + one generation); tok/s: second, warm generate"


def _quiet_libraries() -> None:
    # Transformers' load bars and advice go to stderr and drown our own progress display.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass


def _display_rows(rows: list[dict]) -> list[dict]:
    return [r | {"peak_memory_mb": (r["peak_memory_bytes"] or 0) / 2**20 if r.get("peak_memory_bytes") else None} for r in rows]


@app.command()
def stack(
    device: str = typer.Option("cpu", help="device type to describe"),
    backend: str = typer.Option("inductor", help="torch.compile backend whose compiler is recorded"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
):
    """The software/hardware fingerprint results are recorded under, and its stack_id."""
    from assay.core.device import resolve_backend, resolve_device
    from assay.core.output import print_json, print_key_values
    from assay.core.stack import collect_stack

    stack_info = collect_stack(resolve_device(device).type, resolve_backend(backend))
    record = stack_info.as_dict()
    if json_out:
        print_json(record)
        return
    flat = {"stack_id": record["stack_id"], "label": record["label"], "python": record["python"]}
    flat |= {f"lib {k}": v for k, v in record["libraries"].items()}
    flat |= {f"compiler {k}": v for k, v in record["compiler"].items()}
    flat |= {f"vendor {k}": v for k, v in record["vendor_packages"].items()}
    flat |= {"device": f"{record['device_type']} x{record['device_count']} ({record['device_name']})", "os": record["os"]}
    print_key_values(flat, title="assay stack")


@zoo_app.command("build")
def zoo_build(
    out: Path = typer.Argument(..., help="folder to write the checkpoints into"),
    only: Optional[str] = typer.Option(None, help="comma-separated entry names (default: all)"),
    force: bool = typer.Option(False, help="rebuild entries that already exist"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Write the tiny real-architecture checkpoints (offline, deterministic) and their catalog."""
    _quiet_libraries()
    from assay.core.output import print_json, print_table
    from assay.zoo import ZOO, build_zoo

    names = [n.strip() for n in only.split(",")] if only else None
    folders = build_zoo(out, names=names, force=force, progress=not json_out)
    rows = [{"entry": f.name, "path": str(f), "stands_in_for": ZOO[f.name].stands_in_for, "task": ZOO[f.name].task, "architecture": ZOO[f.name].architecture} for f in folders]
    if json_out:
        print_json(rows)
    else:
        print_table(rows, ["entry", "stands_in_for", "task", "architecture", "path"], title=f"zoo: {len(rows)} checkpoints")


@app.command()
def probe(
    model: str = typer.Argument(..., help="Hub id (Qwen/Qwen3-0.6B) or checkpoint folder"),
    device: str = typer.Option("cpu", help="cpu, cuda, neuron, xpu, mps, ..."),
    backend: str = typer.Option("inductor", help="torch.compile backend: inductor, aot_eager, eager, neuron, ..."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16"),
    new_tokens: int = typer.Option(32, "--new-tokens", help="tokens to generate"),
    task: Optional[str] = typer.Option(None, help="override the task inferred from the checkpoint"),
    skip: Optional[str] = typer.Option(None, help="record a deliberate SKIPPED row with this reason instead of running"),
    devices: int = typer.Option(1, help="shard the model over this many devices (processes the probe starts itself)"),
    judge: Optional[str] = typer.Option(None, help="a small causal LM that scores the sharded output's fluency"),
    no_reference: bool = typer.Option(False, "--no-reference", help="sharded: skip the single-device reference (the judge decides)"),
    parallelism: str = typer.Option("auto", help="sharded: auto (tensor where a TP plan exists, else expert), tensor or expert"),
    out: Path = typer.Option(Path("results"), help="results folder (one Parquet file per stack)"),
    timeout: Optional[float] = typer.Option(None, help="seconds; runs the probe in its own process and records TIMEOUT past it"),
    memory_limit_gb: Optional[float] = typer.Option(None, "--memory-limit-gb", help="address-space limit for the probe's own process (OOM past it)"),
    strict: bool = typer.Option(False, help="exit 1 unless the status is PASS or SKIPPED"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Load, generate with a static cache under torch.compile, compare with CPU eager, record the row."""
    _quiet_libraries()
    from assay.compat.probe import ProbeRequest, probe_and_record
    from assay.core.output import STATUS_STYLES, print_json, print_table

    if timeout is not None and timeout <= 0:
        raise AssayError("--timeout must be positive")
    limit = int(memory_limit_gb * 2**30) if memory_limit_gb else None
    request = ProbeRequest(model, device, backend, dtype, new_tokens, task, skip, devices=devices, judge=judge, reference=not no_reference, parallelism=parallelism)
    row = probe_and_record(request, out, timeout=timeout, memory_limit_bytes=limit)
    if json_out:
        print_json({k: v for k, v in row.items() if k not in ("run_py", "versions")})
    else:
        print_table(_display_rows([row]), RESULT_COLUMNS, title=f"probe on {row['stack_id']}", styles=STATUS_STYLES, headers=RESULT_HEADERS)
        if row.get("error"):
            typer.echo(row["error"].strip().splitlines()[-1], err=True)
    if strict and row["status"] not in ("PASS", "SKIPPED"):
        raise typer.Exit(1)


@app.command()
def results(
    folder: Path = typer.Argument(..., help="results folder"),
    stack_filter: Optional[str] = typer.Option(None, "--stack", help="stack_id (or part of it)"),
    status: Optional[str] = typer.Option(None, help="only this status"),
    model: Optional[str] = typer.Option(None, help="part of the model name"),
    json_out: bool = typer.Option(False, "--json"),
):
    """What was tested, on which stack, with what result."""
    from assay.compat.dataset import query
    from assay.compat.schema import STATUSES
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
            _display_rows(stack_rows), RESULT_COLUMNS, styles=STATUS_STYLES, headers=RESULT_HEADERS,
            title=f"{stack_id}: {passed}/{tested} PASS  ({stack_rows[0]['stack_label']})",
        )
    if rows:
        typer.echo(RESULT_FOOTNOTE)
    if not rows:
        typer.echo("no results recorded" + (" matching the filters" if (stack_filter or status or model) else ""))


@app.command()
def diff(
    folder: Path = typer.Argument(..., help="results folder"),
    base: str = typer.Option(..., help="the stack to compare from (stack_id or an unambiguous part)"),
    new: str = typer.Option(..., help="the stack to compare to"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Per model, the status change between two stacks: regressions first; pass rate over models on both."""
    from assay.compat.diff import diff_stacks
    from assay.core.output import print_json, print_table

    result = diff_stacks(folder, base, new)
    if json_out:
        print_json(result.as_dict())
        return
    rows = [c.__dict__ for c in result.changes]
    print_table(rows, ["model", "dtype", "kind", "base_status", "new_status", "new_reason"], title=f"{result.base} -> {result.new}",
                styles={"kind": {"regressed": "red", "failure_changed": "yellow", "fixed": "green"}})
    fmt = lambda r: "-" if r is None else f"{100 * r:.0f}%"  # noqa: E731
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items() if v)
    typer.echo(f"pass rate over {result.models_on_both} models tested on both: {fmt(result.base_pass_rate)} -> {fmt(result.new_pass_rate)}; {counts}")


@app.command()
def sweep(
    models: Optional[list[str]] = typer.Argument(None, help="Hub ids or checkpoint folders"),
    zoo: Optional[Path] = typer.Option(None, help="probe every checkpoint of a zoo folder"),
    list_file: Optional[Path] = typer.Option(None, "--list", help="a file with one model per line (# comments)"),
    out: Path = typer.Option(Path("results"), help="results folder"),
    device: str = typer.Option("cpu"),
    backend: str = typer.Option("inductor"),
    dtype: str = typer.Option("float32"),
    new_tokens: int = typer.Option(32, "--new-tokens"),
    workers: int = typer.Option(1, help="probes side by side, each with its share of devices/cores"),
    timeout: float = typer.Option(600.0, help="seconds per probe; past it the probe is killed and recorded TIMEOUT"),
    memory_limit_gb: Optional[float] = typer.Option(None, "--memory-limit-gb", help="address-space limit per probe process"),
    shard: Optional[str] = typer.Option(None, help="i/n: this machine's share of the model list"),
    executor: str = typer.Option("local", help="local or ray"),
    cache_dir: Optional[Path] = typer.Option(None, help="compile-cache folder for the probes (default: torch's)"),
    max_devices: int = typer.Option(1, help="most devices one probe may take (a model goes on the fewest that hold it)"),
    judge: Optional[str] = typer.Option(None, help="a small causal LM that scores sharded probes' fluency"),
    no_reference: bool = typer.Option(False, "--no-reference", help="sharded probes: skip the single-device reference"),
    devices: Optional[int] = typer.Option(None, help="force this many devices per probe"),
    device_memory_gb: Optional[float] = typer.Option(None, "--device-memory-gb", help="per-device memory when the device cannot say"),
    force: bool = typer.Option(False, help="probe again models already recorded for this stack"),
    fresh_interpreter: bool = typer.Option(False, "--fresh-interpreter", help="start each probe as a new interpreter instead of forking a pre-imported one"),
    strict: bool = typer.Option(False, help="exit 1 if any probe failed"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Probe many models, each in its own process: resumable, parallel, sharded across machines."""
    _quiet_libraries()
    from assay.compat.models_list import collect_models, parse_shard, shard_models
    from assay.compat.probe import ProbeRequest
    from assay.compat.sweep import SweepRequest, is_failure, run_sweep
    from assay.core.output import STATUS_STYLES, print_json, print_table

    chosen = shard_models(collect_models(models or [], str(zoo) if zoo else None, str(list_file) if list_file else None), parse_shard(shard))
    request = SweepRequest(
        models=chosen, out=out, probe=ProbeRequest(model="", device=device, backend=backend, dtype=dtype, new_tokens=new_tokens, judge=judge, reference=not no_reference),
        workers=workers, timeout=timeout, memory_limit_bytes=int(memory_limit_gb * 2**30) if memory_limit_gb else None,
        force=force, executor=executor, cache_dir=cache_dir, max_devices=max_devices, devices=devices,
        device_memory_bytes=int(device_memory_gb * 2**30) if device_memory_gb else None, progress=not json_out,
        fresh_interpreter=fresh_interpreter,
    )
    outcome = run_sweep(request)
    if json_out:
        print_json({"rows": [{k: v for k, v in r.items() if k not in ("run_py", "versions")} for r in outcome.rows],
                    "skipped_existing": outcome.skipped_existing, "counts": outcome.counts(), "wall_s": outcome.wall_s})
    else:
        if outcome.rows:
            print_table(_display_rows(sorted(outcome.rows, key=lambda r: r["model"])), RESULT_COLUMNS, styles=STATUS_STYLES,
                        headers=RESULT_HEADERS, title=f"sweep: {len(outcome.rows)} probed in {outcome.wall_s:.0f} s")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(outcome.counts().items())) or "nothing probed"
        typer.echo(f"{counts}; {len(outcome.skipped_existing)} already recorded for this stack (--force redoes them)")
    if strict and any(is_failure(r) for r in outcome.rows):
        raise typer.Exit(1)


@app.command()
def merge(
    out: Path = typer.Argument(..., help="results folder to merge into"),
    sources: list[Path] = typer.Argument(..., help="result folders to merge (e.g. one per machine)"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Merge result folders: rows of the same stack combined, one per model (the latest probe wins)."""
    from assay.compat.dataset import merge_results
    from assay.core.output import print_json, print_table

    per_stack = merge_results(out, sources)
    if json_out:
        print_json(per_stack)
    else:
        print_table([{"stack_id": k, "rows": v} for k, v in sorted(per_stack.items())], ["stack_id", "rows"], title=f"merged into {out}")


cache_app = typer.Typer(no_args_is_help=True, help="Compile caches, carried between machines of the same stack.")
app.add_typer(cache_app, name="cache")


@cache_app.command("export")
def cache_export(
    archive: Path = typer.Argument(..., help="the .tar.gz to write"),
    cache_dir: Optional[Path] = typer.Option(None, help="cache folder (default: torch's inductor cache folder)"),
    device: str = typer.Option("cpu", help="device type the cache was built for"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Write the compile cache to an archive labelled with the compiler versions it needs."""
    from assay.core.compile_cache import export_cache
    from assay.core.output import print_json, print_key_values

    info = export_cache(archive, cache_dir, device)
    print_json(info) if json_out else print_key_values({"archive": info["archive"], "files": info["files"], **info["fingerprint"]}, title="cache exported")


@cache_app.command("import")
def cache_import(
    archive: Path = typer.Argument(..., help="an archive written by `assay cache export`"),
    cache_dir: Optional[Path] = typer.Option(None, help="cache folder (default: torch's inductor cache folder)"),
    device: str = typer.Option("cpu", help="device type of this machine's probes"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Load a compile cache; refuses, clearly, one built by another stack."""
    from assay.core.compile_cache import import_cache
    from assay.core.output import print_json, print_key_values

    info = import_cache(archive, cache_dir, device)
    print_json(info) if json_out else print_key_values({"cache_dir": info["cache_dir"], "files": info["files"]}, title="cache imported")


from assay.train.commands import register as _register_train  # noqa: E402

_register_train(app)
from assay.app.commands import register as _register_app  # noqa: E402

_register_app(app)
from assay.kernels.commands import register as _register_kernels  # noqa: E402

_register_kernels(app)
from assay.recall.commands import register as _register_recall  # noqa: E402

_register_recall(app)
from assay.serve.commands import register as _register_serve  # noqa: E402

_register_serve(app)
from assay.serve.bench_commands import register as _register_serve_bench  # noqa: E402

_register_serve_bench(app)
from assay.selftest.commands import register as _register_selftest  # noqa: E402

_register_selftest(app)


def main() -> None:
    try:
        from assay.core.plugins import load_plugins

        load_plugins()
        # Not standalone: a usage error (unknown option, bad value) is one line and exit 2 like any
        # other bad input, instead of Click's usage box.
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Abort:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except typer.TyperException as exc:  # Click's usage errors (Typer vendors Click)
        if type(exc).__name__ == "NoArgsIsHelpError" and getattr(exc, "ctx", None) is not None:
            typer.echo(exc.ctx.get_help())  # a group called without a sub-command: its help, as Click does
        else:
            typer.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except AssayError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
