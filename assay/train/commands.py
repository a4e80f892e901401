"""`assay train` and `assay plot`: flags in, one call, the result out (a table, or --json). Rank 0 prints."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import backend_option, device_option, dtype_option, json_option, quiet_libraries
from assay.core.errors import AssayError
from assay.core.checks import check_checkpoint, check_output_file, check_output_folder
from assay.core.values import at_least, comma_list, fraction, positive


def _split_list(text: Optional[str]) -> Optional[tuple[str, ...]]:
    if text is None:
        return None
    return comma_list("--kernels", text, required=False)


def train_command(
    model: str = typer.Option(..., "--model", help="checkpoint folder (config.json, weights, tokenizer)"),
    path: str = typer.Option("native", "--path", help="model path: native (assay.models) or hf (AutoModelForCausalLM)"),
    flavour: Optional[str] = typer.Option(None, "--flavour", help="native only: a named size of the family, randomly initialised"),
    overrides: Optional[str] = typer.Option(None, "--spec", help="native only: field overrides, e.g. layers=4,experts=8,top_k=2"),
    allow_sliced_checkpoint: bool = typer.Option(
        False, "--allow-sliced-checkpoint", "--slice-experts",
        help="native only: load the first layers (and experts) of a larger checkpoint when --spec asks for fewer"),
    kernels: Optional[str] = typer.Option(None, "--kernels", help="comma-separated kernel replacements (assay.kernels.registry)"),
    kernels_filter: Optional[str] = typer.Option(None, "--kernels-filter", help="module-name pattern the replacements apply to"),
    kernels_dry_run: bool = typer.Option(False, "--kernels-dry-run", help="show the replacements, do not train"),
    steps: int = typer.Option(10, "--steps", help="total optimizer steps of the run"),
    batch: int = typer.Option(4, "--batch", help="global batch: sequences per step over all data-parallel ranks"),
    seq_len: int = typer.Option(128, "--seq-len", help="tokens per sequence"),
    lr: float = typer.Option(1e-3, "--lr", help="peak learning rate (AdamW)"),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="linear LR warmup steps (default: 10% of --steps, at least 1)"),
    min_lr_ratio: float = typer.Option(0.1, "--min-lr-ratio", help="the cosine decays to lr x this"),
    weight_decay: float = typer.Option(0.1, "--weight-decay"),
    grad_clip: float = typer.Option(1.0, "--grad-clip", help="max global gradient norm (0: no clipping)"),
    seed: int = typer.Option(0, "--seed", help="data order and random init"),
    data: Optional[str] = typer.Option(None, "--data", help="a .txt/.json/.jsonl/.parquet file or a datasets name (default: the embedded corpus)"),
    text_field: str = typer.Option("text", "--text-field", help="the text column/field of JSON, Parquet or datasets data"),
    data_split: str = typer.Option("train", "--data-split", help="split of a datasets name"),
    device: str = device_option(help="cpu, cuda, neuron, xpu, ... (one per rank under torchrun)"),
    dtype: str = dtype_option(),
    compile_blocks: bool = typer.Option(False, "--compile", help="torch.compile each transformer block"),
    backend: str = backend_option(help="torch.compile backend name"),
    compile_mode: str = typer.Option(
        "default", "--compile-mode", help="torch.compile mode with --compile (inductor): default or max-autotune-no-cudagraphs"
    ),
    activation_checkpointing: str = typer.Option(
        "none", "--activation-checkpointing", help="none, full (recompute each block) or selective (keep matmul outputs)"
    ),
    loss_chunk_tokens: Optional[int] = typer.Option(
        None, "--loss-chunk-tokens", help="tokens per chunk of the output-head loss (default: chunks once the fp32 logits pass 256 MiB; 0: never)"
    ),
    dp_shard: Optional[int] = typer.Option(None, "--dp-shard", help="FSDP2 degree (default: processes / --tp)"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree (native path)"),
    metrics: Optional[Path] = typer.Option(None, "--metrics", help="JSONL file, one object per step"),
    export_hf: Optional[Path] = typer.Option(None, "--export-hf", help="write the trained model as a Transformers checkpoint here"),
    check_init: bool = typer.Option(False, "--check-init", help="first-step loss: loaded weights vs random init vs ln(vocab); exit 1 if not loaded"),
    checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint-dir", help="DCP checkpoints (step-N folders)"),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="save every N steps (0: at the end only)"),
    keep_checkpoints: int = typer.Option(2, "--keep-checkpoints", help="newest checkpoints kept"),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint in --checkpoint-dir"),
    peak_flops: str = typer.Option("auto", "--peak-flops", help="MFU denominator per device: auto (table), measure, or FLOP/s"),
    timing_warmup: int = typer.Option(1, "--timing-warmup", help="first steps timed apart from the steady state (compile, warm-up)"),
    json_out: bool = json_option(),
):
    """Train a checkpoint through one of the model paths (hf, native, native with kernels)."""
    _check_flags(model, flavour, steps, batch, seq_len, lr, warmup_steps, min_lr_ratio, weight_decay, grad_clip, tp, dp_shard,
                 checkpoint_every, keep_checkpoints, timing_warmup, check_init or kernels_dry_run, metrics, export_hf, checkpoint_dir)
    from assay.train.data import DataSource
    from assay.train.optimization import OptimConfig
    from assay.train.trainer import TrainingDiverged, TrainRequest, train

    quiet_libraries()
    if warmup_steps is None:
        warmup_steps = max(1, steps // 10)
    request = TrainRequest(
        model=model, path=path, flavour=flavour, overrides=overrides, allow_sliced_checkpoint=allow_sliced_checkpoint,
        kernels=_split_list(kernels), kernels_filter=kernels_filter, kernels_dry_run=kernels_dry_run,
        steps=steps, batch=batch, seq_len=seq_len,
        optim=OptimConfig(lr=lr, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio, weight_decay=weight_decay, grad_clip=grad_clip),
        seed=seed, data=DataSource(data, text_field, data_split), device=device, dtype=dtype, compile=compile_blocks,
        backend=backend, compile_mode=compile_mode, activation_checkpointing=activation_checkpointing, loss_chunk_tokens=loss_chunk_tokens,
        dp_shard=dp_shard, tp=tp, metrics=metrics, export_hf=export_hf, check_init=check_init,
        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints, resume=resume,
        peak_flops=peak_flops, timing_warmup_steps=timing_warmup, progress=not json_out,
    )
    from assay.train.distributed import launched_world

    is_main = launched_world()[1] == 0
    try:
        result = train(request)
    except TrainingDiverged as diverged:
        if is_main:
            typer.echo(f"error: {diverged}", err=True)
        raise typer.Exit(1)
    if is_main:
        _print_result(result, json_out)
    if result.check_init is not None and not result.check_init.weights_loaded:
        raise typer.Exit(1)


def _check_flags(model, flavour, steps, batch, seq_len, lr, warmup_steps, min_lr_ratio, weight_decay, grad_clip, tp, dp_shard,
                 checkpoint_every, keep_checkpoints, timing_warmup, no_training_needed, metrics, export_hf, checkpoint_dir) -> None:
    """Bad input fails here, before torch is imported and long before training: values, the checkpoint
    (config, weights header, tokenizer), and every output target."""
    # --steps 0 is a run without training: --check-init's first-step loss, or --kernels-dry-run.
    at_least("--steps", steps, 0 if no_training_needed else 1)
    at_least("--batch", batch, 1)
    at_least("--seq-len", seq_len, 1)
    positive("--lr", lr)
    at_least("--warmup-steps", warmup_steps, 0)
    fraction("--min-lr-ratio", min_lr_ratio)
    at_least("--weight-decay", weight_decay, 0)
    at_least("--grad-clip", grad_clip, 0)
    at_least("--tp", tp, 1)
    at_least("--dp-shard", dp_shard, 1)
    at_least("--checkpoint-every", checkpoint_every, 0)
    at_least("--keep-checkpoints", keep_checkpoints, 1)
    at_least("--timing-warmup", timing_warmup, 0)
    check_checkpoint(model, weights=flavour is None)  # a --flavour is randomly initialised: no weights read
    check_output_file("--metrics", metrics)
    check_output_folder("--export-hf", export_hf)
    from assay.train.export import check_export_target  # torch-free: the target is checked before torch loads

    check_export_target(export_hf)
    check_output_folder("--checkpoint-dir", checkpoint_dir)


def _print_result(result, json_out: bool) -> None:
    from assay.core.output import print_json, print_key_values, print_table

    if json_out:
        print_json(result.as_dict())
        return
    if result.check_init is not None:
        check = result.check_init
        print_key_values(
            {"loaded weights": check.loaded_loss, "random init": check.random_loss, "ln(vocab)": check.ln_vocab, "verdict": check.verdict},
            title="check-init: first-step loss",
        )
    if result.kernels is not None:
        dry_run = result.summary.get("stopped") == "kernels dry run"
        print_table([{"replacement": line} for line in result.kernels], ["replacement"],
                    title="kernel replacements" + (" (dry run: nothing replaced, not trained)" if dry_run else ""))
    summary = result.summary
    if not summary.get("steps_run"):
        return
    phases = [
        {"phase": "warm-up", "steps": summary["warmup_steps"], "time_s": summary["warmup_s"], "tokens_per_s": summary["warmup_tokens_per_s"], "mfu": None},
        {"phase": "steady", "steps": summary["steady_steps"], "time_s": summary["steady_step_s_mean"], "tokens_per_s": summary["steady_tokens_per_s"], "mfu": summary["steady_mfu"]},
    ]
    print_table(phases, ["phase", "steps", "time_s", "tokens_per_s", "mfu"], headers={"time_s": "s (warm-up total / steady mean)", "tokens_per_s": "tok/s"},
                title=f"{summary['model']} [{summary['path']}] on {summary['device']} x{summary['world_size']}")
    shown = ("first_loss", "final_loss", "steps_run", "dp_shard", "tp", "params_total", "active_matmul_params", "flops_per_token",
             "peak_flops", "peak_flops_source", "peak_memory_bytes", "checkpoint", "exported")
    print_key_values({key: summary.get(key) for key in shown} | ({"compile": summary["compile"]} if summary.get("compile") else {}))


def plot_command(
    metrics: Path = typer.Argument(..., help="training metrics JSONL (assay train --metrics)"),
    out: Path = typer.Option(..., "-o", "--out", help="PNG to write"),
    title: Optional[str] = typer.Option(None, "--title"),
):
    """Draw loss and throughput per step from a training metrics file to PNG."""
    from assay.train.plot import plot_metrics

    check_output_file("-o", out)
    if out.suffix.lower() != ".png":
        raise AssayError(f"-o {out}: the plot is written as PNG; name the file .png")
    written = plot_metrics(metrics, out, title=title)
    typer.echo(str(written))


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.command("plot")(plot_command)
