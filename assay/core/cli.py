"""The CLI pieces every system's `commands.py` shares: the common options and the quiet-logging set-up.

Options are factories (typer.Option is a default value, so each parameter needs its own instance):
`device: str = device_option(help="...")`. The flag names are part of the public surface (design.md).
"""

from __future__ import annotations

import os

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
