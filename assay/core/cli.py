"""The CLI pieces every system's `commands.py` shares: the common options, the quiet-logging set-up, and
how a SIGTERM ends a command (one line, exit 143).

Options are factories (typer.Option is a default value, so each parameter needs its own instance):
`device: str = device_option(help="...")`. The flag names are part of the public surface (design.md).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import typer

DEVICE_HELP = "cpu, cuda, neuron, xpu, mps, ..."
BACKEND_HELP = "torch.compile backend: inductor, aot_eager, eager, neuron, ..."
DTYPE_HELP = "float32, bfloat16 or float16"


def device_option(default: str = "cpu", help: str = DEVICE_HELP):  # noqa: A002 (Typer's own keyword)
    return typer.Option(default, "--device", help=help)


def backend_option(default: str = "inductor", help: str = BACKEND_HELP):  # noqa: A002
    return typer.Option(default, "--backend", help=help)


def dtype_option(default: str = "float32", help: str = DTYPE_HELP):  # noqa: A002
    return typer.Option(default, "--dtype", help=help)


def json_option(help: str = "print JSON"):  # noqa: A002
    return typer.Option(False, "--json", help=help)


def quiet_libraries() -> None:
    """Silence Transformers' load bars and advice: they go to stderr and drown our own progress display.

    Call it inside a command, before the heavy imports; it imports Transformers only if it is installed.
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass


# 128 + SIGTERM: what a shell reports for a job that SIGTERM ended, here as an exit status after cleanup.
TERMINATED_EXIT = 128 + signal.SIGTERM
TERMINATED_LINE = "assay: terminated (SIGTERM)"


class Terminated(BaseException):
    """SIGTERM arrived. Raised in the main thread, like KeyboardInterrupt for SIGINT, so that finally
    blocks and context managers run (staging folders removed, worker processes ended) before the CLI
    prints TERMINATED_LINE and exits TERMINATED_EXIT. A BaseException: `except Exception` never eats it."""


def exit_on_sigterm() -> None:
    """Make SIGTERM end this command as Terminated. Not installed where something else owns the signal:
    a torchrun rank (its agent signals the ranks; a rank blocked in a collective would not run a Python
    handler until torchrun's SIGKILL), or a thread other than the main one. A command that stops
    gracefully on SIGTERM (`assay serve`) installs its own handler for the time it serves."""
    if os.environ.get("TORCHELASTIC_RUN_ID") or threading.current_thread() is not threading.main_thread():
        return
    owner = os.getpid()

    def on_sigterm(signum, frame):
        if os.getpid() != owner:  # a child forked from this process inherited the handler: die as SIGTERM means
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        signal.signal(signal.SIGTERM, _second_sigterm)
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)


def _second_sigterm(signum, frame) -> None:
    """A second SIGTERM while the first one's cleanup runs: leave now."""
    print(TERMINATED_LINE, file=sys.stderr, flush=True)
    os._exit(TERMINATED_EXIT)
