"""`assay serve`: flags in, an engine warmed up, the OpenAI-compatible HTTP server until SIGINT/SIGTERM."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from assay.core.cli import backend_option, device_option, quiet_libraries
from assay.core.checks import check_checkpoint
from assay.core.errors import AssayError
from assay.models import builtin_arch_names


def serve_command(
    model: str = typer.Option(..., "--model", help=f"checkpoint folder of a registered architecture ({', '.join(builtin_arch_names())}; config.json, weights, tokenizer)"),
    device: str = device_option(),
    backend: str = backend_option(help="torch.compile backend of the decode step"),
    max_seqs: int = typer.Option(64, "--max-seqs", help="slots in the pool: sequences decoded together"),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="decode widths, e.g. 1,2,4,8 (default: powers of two up to --max-seqs)"),
    no_buckets: bool = typer.Option(False, "--no-buckets", help="decode at the exact running count (each new count compiles)"),
    eager: bool = typer.Option(False, "--eager", help="no torch.compile: exact, reproducible logits"),
    state_dtype: str = typer.Option("float32", "--state-dtype", help="dtype of each slot's state: float32 or bfloat16"),
    dtype: str = typer.Option("float32", "--dtype", help="dtype of the weights: float32 or bfloat16 (logits stay float32)"),
    max_waiting: int = typer.Option(256, "--max-waiting", help="requests queued for a slot before new ones get 429"),
    max_prompt_tokens: int = typer.Option(8192, "--max-prompt-tokens", help="longest prompt accepted"),
    max_new_tokens: int = typer.Option(4096, "--max-new-tokens", help="largest max_tokens accepted"),
    max_prefill_tokens: Optional[int] = typer.Option(None, "--max-prefill-tokens", show_default=False, help="prompt tokens (padding included) prefilled per step at most; a longer prompt is prefilled in chunks between decode steps (default 2048)"),
    long_prefill_token_threshold: Optional[int] = typer.Option(None, "--long-prefill-token-threshold", show_default=False, help="a prompt of more tokens is long: shorter prompts are prefilled first and one long prompt at a time takes the rest of the budget (default 512; 0: first come, first served)"),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="KV-cache models: positions per slot (default prompt + new tokens; past the model's positions only where its rope scaling reaches)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 for every interface)"),
    port: int = typer.Option(8000, "--port", help="port to listen on (0: a free port, printed)"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="the name clients pass as model (default: the folder name)"),
    executor: str = typer.Option("local", "--executor", help="local (this process) or ray (Ray Serve replicas)"),
    replicas: int = typer.Option(1, "--replicas", help="--executor ray: engine replicas, one device each"),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="ASSAY_API_KEY", show_default=False, show_envvar=True,
        help="every /v1/* route needs 'Authorization: Bearer KEY' (/health and /metrics stay open); prefer the environment variable ASSAY_API_KEY (not in the process list)",
    ),
    max_request_bytes: Optional[int] = typer.Option(
        None, "--max-request-bytes", show_default=False,
        help="a larger request body is refused (413) before it is parsed (default 16777216: 16 MiB)",
    ),
):
    """Serve a checkpoint over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /health, /metrics)."""
    # The checkpoint (config, weights header, tokenizer: the HTTP API takes and returns text) before
    # anything is imported or loaded.
    check_checkpoint(model)
    from assay.serve.launch import serve
    from assay.serve.settings import ServeRequest, check_request, engine_config

    request = ServeRequest(
        model=model, device=device, backend=backend, max_seqs=max_seqs, buckets=buckets, no_buckets=no_buckets, eager=eager,
        state_dtype=state_dtype, dtype=dtype, max_waiting=max_waiting, max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
        max_len=max_len, max_prefill_tokens=max_prefill_tokens, long_prefill_token_threshold=long_prefill_token_threshold, host=host, port=port, served_model_name=served_model_name, api_key=api_key or None,
        **({} if max_request_bytes is None else {"max_request_bytes": max_request_bytes}),
    )
    # Every flag before torch is imported (serve() checks them again, for callers other than this command).
    if executor not in ("local", "ray"):
        raise AssayError(f"unknown --executor {executor!r}: local or ray")
    if executor == "local" and replicas != 1:
        raise AssayError("--replicas needs --executor ray (a local server is one engine)")
    check_request(request)
    engine_config(request)
    quiet_libraries()
    announce = lambda line: print(line, flush=True)  # noqa: E731
    if executor == "ray":
        from assay.serve.ray_deployment import serve_with_ray

        serve_with_ray(request, replicas, announce=announce)
    else:
        serve(request, announce=announce)
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
