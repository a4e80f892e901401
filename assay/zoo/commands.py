"""`assay zoo build`: write the tiny real-architecture checkpoints and their catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import json_option, quiet_libraries


def zoo_build_command(
    out: Path = typer.Argument(..., help="folder to write the checkpoints into"),
    only: Optional[str] = typer.Option(None, help="comma-separated entry names (default: all)"),
    force: bool = typer.Option(False, help="rebuild entries that already exist"),
    json_out: bool = json_option(),
):
    """Write the tiny real-architecture checkpoints (offline, deterministic) and their catalog."""
    quiet_libraries()
    from assay.core.output import print_json, print_table
    from assay.zoo import ZOO, build_zoo

    names = [n.strip() for n in only.split(",")] if only else None
    folders = build_zoo(out, names=names, force=force, progress=not json_out)
    rows = [{"entry": f.name, "path": str(f), "stands_in_for": ZOO[f.name].stands_in_for, "task": ZOO[f.name].task, "architecture": ZOO[f.name].architecture} for f in folders]
    if json_out:
        print_json(rows)
    else:
        print_table(rows, ["entry", "stands_in_for", "task", "architecture", "path"], title=f"zoo: {len(rows)} checkpoints")


def register(app: typer.Typer) -> None:
    zoo_app = typer.Typer(no_args_is_help=True, help="The tiny model zoo.")
    app.add_typer(zoo_app, name="zoo")
    zoo_app.command("build")(zoo_build_command)
