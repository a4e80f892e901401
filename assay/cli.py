"""The `assay` command: one sub-command per job. Parses flags, calls one function, prints its result.

Exit codes (design.md): 0 success; 1 the job ran and found a failure (--strict); 2 bad usage or input,
with one line on stderr.

This module only registers commands: each system's live in its own `commands.py` (its `register(app)`),
which imports the system itself inside each command, so `assay --help` stays light.
"""

from __future__ import annotations

import os
import sys

import typer

from assay.app.commands import register as register_app
from assay.compat.commands import register as register_compat
from assay.core.cli import TERMINATED_EXIT, TERMINATED_LINE, Terminated, exit_on_sigterm
from assay.core.commands import register as register_core
from assay.core.errors import AssayError
from assay.core.files import disk_full_error
from assay.kernels.commands import register as register_kernels
from assay.recall.commands import register as register_recall
from assay.serve.bench_commands import register as register_serve_bench
from assay.selftest.commands import register as register_selftest
from assay.serve.commands import register as register_serve
from assay.train.commands import register as register_train
from assay.zoo.commands import register as register_zoo

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=__doc__.splitlines()[0])

# The order is the order of `assay --help` (commands first, then groups, each in registration order).
for register in (register_zoo, register_core, register_compat, register_train, register_app, register_kernels,
                 register_recall, register_serve, register_serve_bench, register_selftest):
    register(app)


def main() -> None:
    exit_on_sigterm()
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
    except Terminated:
        typer.echo(TERMINATED_LINE, err=True)
        sys.exit(TERMINATED_EXIT)
    except BaseException as exc:  # noqa: BLE001 (DCP's CheckpointException is a BaseException)
        # A write that ran out of room is the machine's state, not a bug: one line, whatever wrote it.
        full = None if isinstance(exc, SystemExit) else disk_full_error(exc)
        if full is None:
            raise
        reason = os.strerror(full.errno) if isinstance(full, OSError) else full
        where = getattr(full, "filename2", None) or getattr(full, "filename", None)  # copyfile: (source, target)
        typer.echo(f"error: {reason.lower()}" + (f" writing {where}" if where else ""), err=True)
        sys.exit(2)
