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

# What `assay --help` says: written for a user deciding what to run, not for the code's reader.
HELP = """Check which language models run correctly on a PyTorch device and compiler, train them, serve them.

Start with `assay zoo build zoo/`, then `assay probe zoo/qwen3 --out results/`. `assay COMMAND --help` gives a command's options; README.md walks through the rest."""

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=HELP)

# The order is the order of `assay --help` (commands first, then groups, each in registration order).
for register in (register_zoo, register_core, register_compat, register_train, register_app, register_kernels,
                 register_recall, register_serve, register_serve_bench, register_selftest):
    register(app)

# One line per command in `assay --help`, grouped by what a user is doing (each command's own --help keeps
# its full description). A command missing here fails tests/test_cli_version.py.
USER_HELP: dict[str, tuple[str, str]] = {
    "zoo": ("Get started", "Build the tiny offline model zoo, or get the real SmolLM2."),
    "stack": ("Get started", "Show the machine's fingerprint that results are filed under."),
    "convert": ("Get started", "Turn a GGUF checkpoint into a plain Transformers folder."),
    "probe": ("Check models", "Check one model: do its tokens on the device match CPU eager?"),
    "sweep": ("Check models", "Probe many models, each in its own process; resumable."),
    "results": ("Check models", "Show recorded results as a table or JSON."),
    "diff": ("Check models", "Compare two stacks: which models regressed or were fixed."),
    "merge": ("Check models", "Combine result folders from several machines."),
    "triage": ("Check models", "Shrink a failing probe to the smallest graph that fails."),
    "cache": ("Check models", "Carry compile caches between machines of the same stack."),
    "app": ("Browse results", "Open the web app over a results folder."),
    "publish": ("Browse results", "Write results as a Hugging Face dataset (and push it)."),
    "export-space": ("Browse results", "Write the web app as a Hugging Face Space folder."),
    "catalog": ("Browse results", "Refresh the list of public models the web app shows."),
    "train": ("Train", "Train a checkpoint: Transformers, native, or with kernels."),
    "plot": ("Train", "Plot loss and throughput from a training metrics file."),
    "kernels": ("Train", "Check or benchmark the custom kernels."),
    "serve": ("Serve", "Serve a model over an OpenAI-compatible HTTP API."),
    "serve-bench": ("Serve", "Benchmark the serving engine with synthetic traffic."),
    "recall": ("Serve", "Measure what a model recalls: associative recall, needle."),
    "selftest": ("Check a device", "Check a GPU or other device in one go, every system."),
}


def _command_name(entry) -> str:
    return entry.name or entry.callback.__name__.removesuffix("_command").replace("_", "-")


for entry in [*app.registered_commands, *app.registered_groups]:
    panel, line = USER_HELP.get(_command_name(entry), ("Other", None))
    entry.rich_help_panel, entry.short_help = panel, line


def _print_version(asked: bool) -> None:
    if asked:
        from assay import __version__

        typer.echo(f"assay {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print assay's version and exit.")) -> None:
    pass


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
