"""`assay serve-bench`: flags in, one call to run_serve_bench, a table (or --json) out; --out / --plot files."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import backend_option, device_option, json_option, quiet_libraries
from assay.core.values import comma_list
from assay.models import builtin_arch_names


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    return comma_list(flag, text, int)


def _modes(text: str) -> tuple[str, ...]:
    aliases = {"no-buckets": "none", "nobuckets": "none", "bucket": "buckets"}
    return tuple(aliases.get(item, item) for item in comma_list("--modes", text, required=False))


def serve_bench_command(
    model: str = typer.Option(..., "--model", help=f"checkpoint folder of a registered architecture ({', '.join(builtin_arch_names())})"),
    arrivals: str = typer.Option("poisson", "--arrivals", help="poisson, burst or fixed"),
    rate: float = typer.Option(20.0, "--rate", help="poisson: requests per second"),
    burst_size: int = typer.Option(8, "--burst-size", help="burst: requests per burst"),
    burst_interval: float = typer.Option(1.0, "--burst-interval", help="burst: seconds between bursts"),
    concurrency: str = typer.Option("8", "--concurrency", help="fixed: sequences at once, a list runs each (1,8,32,64)"),
    requests: int = typer.Option(100, "--requests", help="requests per run"),
    prompt_tokens: str = typer.Option("128", "--prompt-tokens", help="prompt length; a list runs each (2048,8192)"),
    max_tokens: int = typer.Option(32, "--max-tokens", help="output tokens per request"),
    modes: str = typer.Option("buckets", "--modes", help="buckets, none (--no-buckets) and/or eager, comma-separated"),
    buckets: str = typer.Option("auto", "--buckets", help="decode widths compiled at warm-up (auto: powers of two up to --max-seqs)"),
    max_seqs: int = typer.Option(64, "--max-seqs", help="slots in the pool"),
    device: str = device_option(),
    backend: str = backend_option(),
    state_dtype: str = typer.Option("float32", "--state-dtype", help="float32 or bfloat16 (the pool's storage)"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16 (the weights; logits stay float32)"),
    time_limit: float = typer.Option(300.0, "--time-limit", help="seconds per run; unfinished requests are then aborted"),
    seed: int = typer.Option(0, "--seed", help="arrival times and prompt offsets"),
    max_prefill_tokens: Optional[int] = typer.Option(None, "--max-prefill-tokens", help="prompt tokens prefilled per step at most (default: all that fit)"),
    check_eager: bool = typer.Option(False, "--check-eager", help="also run eager on every compiled decode step; report the logit difference"),
    reuse_cache: bool = typer.Option(False, "--reuse-compile-cache", help="keep the inductor cache between runs (default: a fresh one per run)"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the JSON result here"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG: compile share, throughput, latency"),
    json_out: bool = json_option(),
):
    """Synthetic arrivals against the serving engine: compile share, tokens/s, TTFT/TPOT, state memory."""
    from assay.core.files import atomic_write_json
    from assay.core.output import print_json, print_table
    from assay.serve.bench import SUMMARY_COLUMNS, ServeBenchRequest, plot_serve_bench, run_serve_bench
    from assay.serve.engine.scheduler import resolve_buckets

    quiet_libraries()
    request = ServeBenchRequest(
        model=model, arrivals=arrivals, rate=rate, burst_size=burst_size, burst_interval_s=burst_interval,
        concurrency=_int_list("--concurrency", concurrency), requests=requests,
        prompt_tokens=_int_list("--prompt-tokens", prompt_tokens), max_tokens=max_tokens, modes=_modes(modes),
        buckets=resolve_buckets(buckets, max_seqs), max_seqs=max_seqs, device=device, backend=backend, state_dtype=state_dtype, dtype=dtype,
        time_limit_s=time_limit, seed=seed, check_eager=check_eager, fresh_compile_cache=not reuse_cache,
        max_prefill_tokens=max_prefill_tokens,
    )
    request.validate()
    result = run_serve_bench(request, progress=not json_out)
    payload = result.as_dict()
    if out is not None:
        atomic_write_json(out, payload)
    if plot is not None:
        plot_serve_bench(payload["runs"], plot, title=f"serve-bench {Path(model).name} ({arrivals}, {device})")
    if json_out:
        print_json(payload)
    else:
        print_table([run.summary() for run in result.runs], SUMMARY_COLUMNS, title=f"serve-bench {model} ({arrivals})")


def register(app: typer.Typer) -> None:
    app.command("serve-bench")(serve_bench_command)
