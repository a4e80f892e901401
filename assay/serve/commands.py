"""`assay serve`: flags in, an engine warmed up, the OpenAI-compatible HTTP server until SIGINT/SIGTERM.

The flags are not written here: each is a field of ServeRequest (the engine's in EngineConfig, the server's in
settings.py) with its flag and help, and `options` turns those fields into the command's Typer options.
"""

from __future__ import annotations

import inspect
import logging
import sys
import typing
from dataclasses import MISSING, fields

import typer

from assay.core.checks import check_checkpoint
from assay.core.cli import quiet_libraries
from assay.core.errors import AssayError
from assay.serve.settings import ServeRequest, check_request, engine_config

# Not settings of the engine or the server: how many of them run, and where.
_EXECUTION = [
    inspect.Parameter("executor", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                      default=typer.Option("local", "--executor", help="local (this process) or ray (Ray Serve replicas)")),
    inspect.Parameter("replicas", inspect.Parameter.KEYWORD_ONLY, annotation=int,
                      default=typer.Option(1, "--replicas", help="--executor ray: engine replicas, one device each")),
]


def options(settings: type) -> list[inspect.Parameter]:
    """One Typer option per dataclass field with a "flag" in its metadata (required fields first), typed as
    the field is (or as its metadata's "type", for a value given as text)."""
    hints = typing.get_type_hints(settings)
    parameters = []
    for spec in fields(settings):
        if "flag" not in spec.metadata:
            continue
        cli = dict(spec.metadata)
        flag, annotation = cli.pop("flag"), cli.pop("type", hints[spec.name])
        default = ... if spec.default is MISSING else spec.default
        parameters.append(inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=typer.Option(default, flag, **cli)))
    return sorted(parameters, key=lambda parameter: parameter.default.default is not ...)


def serve_command(executor: str, replicas: int, **settings) -> None:
    """Serve a checkpoint over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /health, /metrics)."""
    # The checkpoint (config, weights header, tokenizer: the HTTP API takes and returns text) before
    # anything is imported or loaded.
    check_checkpoint(settings["model"])
    request = ServeRequest(**(settings | {"api_key": settings["api_key"] or None}))
    # Every flag before torch is imported (serve() checks them again, for callers other than this command).
    if executor not in ("local", "ray"):
        raise AssayError(f"unknown --executor {executor!r}: local or ray")
    if executor == "local" and replicas != 1:
        raise AssayError("--replicas needs --executor ray (a local server is one engine)")
    check_request(request)
    engine_config(request)
    show_progress()
    announce = lambda line: print(line, flush=True)  # noqa: E731
    if executor == "ray":
        from assay.serve.ray.deployment import serve_with_ray

        quiet_libraries()
        serve_with_ray(request, replicas, announce=announce)
    else:
        from assay.serve.launch import serve

        serve(request, announce=announce)
    sys.stdout.flush()


def show_progress() -> None:
    """The start-up's progress (the "assay.serve" log at INFO: loading, the pool, each width compiled) on
    stderr, one plain line each, so a terminal and a log file read the same; stdout keeps the URL line."""
    logger = logging.getLogger("assay.serve")
    if not any(getattr(handler, "assay_progress", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.assay_progress = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # once, even where the root logger has a handler too


_PARAMETERS = options(ServeRequest) + _EXECUTION
serve_command.__signature__ = inspect.Signature(_PARAMETERS)
serve_command.__annotations__ = {parameter.name: parameter.annotation for parameter in _PARAMETERS}


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
