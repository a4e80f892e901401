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
    out: Path = typer.Option(Path("results"), help="results folder (one Parquet file per stack)"),
    strict: bool = typer.Option(False, help="exit 1 unless the status is PASS or SKIPPED"),
    json_out: bool = typer.Option(False, "--json"),
):
    """Load, generate with a static cache under torch.compile, compare with CPU eager, record the row."""
    _quiet_libraries()
    from assay.compat.probe import ProbeRequest, probe_and_record
    from assay.core.output import STATUS_STYLES, print_json, print_table

    row = probe_and_record(ProbeRequest(model, device, backend, dtype, new_tokens, task, skip), out)
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


def main() -> None:
    try:
        app(standalone_mode=True)
    except AssayError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
