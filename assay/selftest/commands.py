"""`assay selftest`: flags in, one call to run_selftest, a table (or --json) out; exit 1 unless every part passed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.errors import AssayError
from assay.core.values import comma_list

COLUMNS = ["name", "status", "seconds", "timeout_s", "headline", "error"]
STATUS_STYLES = {"status": {"PASSED": "green", "FAILED": "red", "TIMEOUT": "red", "NOT_RUN": "yellow"}}


def selftest_command(
    device: str = typer.Option("cpu", "--device", help="the device to check: cuda, cpu, xpu, ..."),
    out: Path = typer.Option(..., "--out", help="folder for selftest.json, each part's JSON and log, and the result files"),
    quick: bool = typer.Option(False, "--quick", help="tiny sizes and few steps (aot_eager on the CPU): the plumbing, in about a minute"),
    backend: Optional[str] = typer.Option(None, "--backend", help="torch.compile backend (default: inductor; aot_eager for --quick on the CPU)"),
    models: Optional[str] = typer.Option(None, "--models", help="zoo entries to probe (default: qwen3,gpt2,mixtral; --quick: qwen3)"),
    parts: Optional[str] = typer.Option(None, "--parts", help="run only these parts or groups, e.g. kernels,train or probe"),
    timeouts: Optional[str] = typer.Option(None, "--timeouts", help="per-part time limits in seconds, e.g. kernels=300,probe=90"),
    budget: Optional[float] = typer.Option(None, "--budget", help="seconds for the whole run (default 480; --quick 300): parts past it are cut"),
    zoo: Optional[Path] = typer.Option(None, "--zoo", help="zoo folder to build into and reuse (default: OUT/zoo)"),
    json_out: bool = typer.Option(False, "--json", help="print the summary JSON"),
):
    """Check a device in one go: probes, kernels, training MFU, GLA, serving; each part timed and recorded."""
    from assay.core.output import print_json, print_table
    from assay.selftest import SUMMARY_FILE, SelftestRequest, run_selftest
    from assay.selftest.parts import parse_timeouts

    if budget is not None and not budget > 0:
        raise AssayError(f"--budget must be positive, got {budget:g}")
    if out.exists() and not out.is_dir():
        raise AssayError(f"--out {out} exists and is not a folder")
    request = SelftestRequest(
        out=out, device=device, quick=quick, backend=backend,
        models=comma_list("--models", models) if models is not None else None,
        parts=comma_list("--parts", parts) if parts is not None else None,
        timeouts=parse_timeouts(timeouts), budget_s=budget, zoo=zoo, progress=not json_out,
    )
    if request.models:
        from assay.zoo import ZOO

        unknown = [name for name in request.models if name not in ZOO]
        if unknown:
            raise AssayError(f"--models: {unknown[0]!r} is not a zoo entry (known: {', '.join(ZOO)})")
    result = run_selftest(request)
    if json_out:
        print_json(result.as_dict())
    else:
        counts = ", ".join(f"{status} {n}" for status, n in sorted(result.counts().items()))
        print_table([part.__dict__ for part in result.parts], COLUMNS, styles=STATUS_STYLES, headers={"timeout_s": "limit s"},
                    title=f"selftest on {device} ({'quick, ' if quick else ''}{result.backend}): {counts} in {result.wall_s:.0f} s")
        typer.echo(f"summary: {out / SUMMARY_FILE}")
    if not result.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("selftest")(selftest_command)
