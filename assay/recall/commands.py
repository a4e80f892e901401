"""`assay recall train|needle|report`: flags in, one function call, a table (or --json) and a PNG out."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import device_option, json_option
from assay.core.checks import check_checkpoint, check_output_file, check_output_folder
from assay.core.values import comma_list

NEEDLE_COLUMNS = ["length", "depth", "accuracy", "correct", "trials", "status"]


def _ints(flag: str, text: str) -> tuple[int, ...]:
    return comma_list(flag, text, int)


def _floats(flag: str, text: str) -> tuple[float, ...]:
    return comma_list(flag, text, float)


def _names(text: str) -> tuple[str, ...]:
    return comma_list("--arch", text, required=False)


def _given(**options) -> dict:
    """The options the user gave (not None): the rest keep their dataclass defaults, defined once there."""
    return {name: value for name, value in options.items() if value is not None}


def _state_setting(text: str) -> tuple[int, float]:
    heads, _, expand_k = text.partition(":")
    return int(heads), float(expand_k)


def register(app: typer.Typer) -> None:
    recall_app = typer.Typer(no_args_is_help=True, help="Recall under a fixed state: associative recall and needle probes, GLA vs attention.")
    app.add_typer(recall_app, name="recall")

    @recall_app.command("train")
    def train(
        out: Path = typer.Option(Path("recall"), "--out", help="folder for results.json, recall.png and the trained checkpoints"),
        arch: str = typer.Option("gla,qwen3", "--arch", help="architectures: gla, qwen3 (attention)"),
        pairs: Optional[str] = typer.Option(None, "--pairs", help="key-value pair counts to score (and train on, mixed) (recipe: 4,16)"),
        seq_len: Optional[str] = typer.Option(None, "--seq-len", help="sequence lengths: one model per architecture and length (recipe: 64)"),
        budget_min: Optional[float] = typer.Option(None, "--budget-min", help="CPU minutes of this process per model (wall minutes are recorded beside) (recipe: 10)"),
        until_accuracy: Optional[float] = typer.Option(None, "--until-accuracy", help="stop a model once every pair count reaches this validation accuracy (0-1; 0: train the whole budget) (recipe: 0.95)"),
        eval_every: int = typer.Option(100, "--eval-every", help="steps between validation scores"),
        curriculum: bool = typer.Option(False, "--curriculum", help="start on the fewest pairs, add the next count when the active ones reach --until-accuracy"),
        short_first: Optional[int] = typer.Option(None, "--short-first", help="train first on sequences of this many tokens (as many tokens per step), move to the full length when they reach --until-accuracy (0: off) (recipe: 16)"),
        patience: Optional[int] = typer.Option(None, "--patience", help="stop a model after this many validations without its lowest accuracy rising half a point (a plateau: converged, short of the target)"),
        short_conv: Optional[bool] = typer.Option(None, "--short-conv/--no-short-conv", help="GLA with fla's short convolutions on q, k, v (use_short_conv, 4 taps) (recipe: on)"),
        steps: Optional[int] = typer.Option(None, "--steps", help="optimizer steps per model (the schedule's length)"),
        batch: Optional[int] = typer.Option(None, "--batch", help="sequences per step (recipe: 64)"),
        tokens_per_step: Optional[int] = typer.Option(None, "--tokens-per-step", help="instead of --batch: batch = this // seq_len per length"),
        lr: float = typer.Option(3e-3, "--lr", help="peak learning rate (AdamW, warmup + cosine)"),
        dim: Optional[int] = typer.Option(None, "--dim", help="model width (both architectures) (recipe: 64)"),
        layers: Optional[int] = typer.Option(None, "--layers", help="layers (recipe: 2)"),
        heads: Optional[int] = typer.Option(None, "--heads", help="heads (recipe: 1)"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="SwiGLU width (recipe: 128)"),
        init_std: Optional[float] = typer.Option(None, "--init-std", help="std of the random initial matrices, both architectures (recipe: 0.05)"),
        keys: Optional[int] = typer.Option(None, "--keys", help="key (and value) tokens in the MQAR vocabulary; chance is 1/keys (recipe: 64)"),
        filler: Optional[int] = typer.Option(None, "--filler", help="filler token ids; the vocabulary is 64 + 2 x keys + filler (recipe: 64)"),
        eval_examples: int = typer.Option(64, "--eval-examples", help="scored sequences per pair count"),
        seed: int = typer.Option(0, "--seed"),
        device: str = device_option(),
        threads: int = typer.Option(1, "--threads", help="torch threads while training (1: fastest for tiny models on a shared CPU)"),
        plot: Optional[Path] = typer.Option(None, "-o", "--plot", help="PNG to draw (default OUT/recall.png)"),
        json_out: bool = json_option(),
    ):
        """Train matched-size GLA and attention models on MQAR for a fixed budget; accuracy per (pairs, seq_len).

        With no flags: the recipe that converges here (4 and 16 pairs at 64 tokens, 16-token sequences
        first, one head, init std 0.05, GLA with short convolutions, 10 CPU minutes a model, stop at 95%)."""
        from dataclasses import replace

        from assay.recall import recipe
        from assay.recall.request import RecallTrainRequest, validate_train_request
        from assay.recall.shapes import layout_for

        check_output_folder("--out", out)
        check_output_file("--plot", plot)

        size = replace(recipe.SIZE, **_given(dim=dim, n_layers=layers, n_heads=heads, hidden_dim=hidden, init_std=init_std,
                                             gla_short_conv=short_conv))
        # 0 turns the target and the short stage off (the request's None); unset keeps the recipe's.
        off = {name: None for name, value in (("until_accuracy", until_accuracy), ("short_first", short_first)) if value == 0}
        request = RecallTrainRequest(
            out=out, archs=_names(arch), steps=steps, eval_every=eval_every, curriculum=curriculum, tokens_per_step=tokens_per_step,
            lr=lr, patience=patience, size=size, layout=layout_for(recipe.KEYS if keys is None else keys, recipe.FILLER if filler is None else filler),
            eval_examples=eval_examples, seed=seed, device=device, threads=threads, progress=not json_out,
            **_given(pairs=None if pairs is None else _ints("--pairs", pairs), seq_lens=None if seq_len is None else _ints("--seq-len", seq_len), budget_min=budget_min,
                     until_accuracy=until_accuracy, short_first=short_first, batch=batch) | off,
        )
        validate_train_request(request)  # before torch is imported: a wrong flag answers at once
        from assay.core.output import print_json, print_table
        from assay.recall.report import TABLE_COLUMNS, TABLE_HEADERS, plot_accuracy, table_rows
        from assay.recall.train import train_recall

        result = train_recall(request)
        png = plot_accuracy(result.rows, plot or out / "recall.png", chance=request.layout.chance) if any(r["status"] == "ok" for r in result.rows) else None
        if json_out:
            print_json(result.as_dict() | {"plot": str(png) if png else None})
        else:
            print_table(table_rows(result.rows), TABLE_COLUMNS, headers=TABLE_HEADERS,
                        title=f"MQAR recall (chance {100 * request.layout.chance:.2g}%; params {result.params})")
            typer.echo(f"results: {out / 'results.json'}" + (f"  plot: {png}" if png else ""))

    @recall_app.command("sweep")
    def sweep(
        out: Path = typer.Option(..., "--out", help="folder for sweep.json, sweep.png and the checkpoints"),
        widths: str = typer.Option("32,64,128", "--widths", help="model widths (both architectures)"),
        gla_states: str = typer.Option("4:0.5,1:0.5", "--gla-states", help="GLA state settings per width, heads:expand_k"),
        arch: str = typer.Option("gla,qwen3", "--arch", help="architectures: gla, qwen3 (attention)"),
        pairs: str = typer.Option("4,16", "--pairs", help="key-value pair counts (trained mixed, scored each)"),
        seq_len: int = typer.Option(64, "--seq-len"),
        budget_min: Optional[float] = typer.Option(3.0, "--budget-min", help="CPU minutes per model"),
        until_accuracy: Optional[float] = typer.Option(None, "--until-accuracy", help="stop a model once every pair count reaches this validation accuracy (0: train the whole budget) (recipe: 0.95)"),
        steps: Optional[int] = typer.Option(None, "--steps", help="optimizer steps per model (the schedule's length)"),
        curriculum: bool = typer.Option(False, "--curriculum", help="start on the fewest pairs, add counts as they reach the target"),
        short_first: Optional[int] = typer.Option(None, "--short-first", help="train first on sequences of this many tokens, then the full length, as recall train (0: off) (recipe: 16)"),
        attention_heads: Optional[int] = typer.Option(None, "--attention-heads", help="attention's heads at every width (recipe: 1)"),
        patience: Optional[int] = typer.Option(None, "--patience", help="stop a model after this many validations without its lowest accuracy rising half a point (as recall train)"),
        short_conv: Optional[bool] = typer.Option(None, "--short-conv/--no-short-conv", help="every GLA with fla's short convolutions on q, k, v (recipe: on)"),
        batch: Optional[int] = typer.Option(None, "--batch", help="sequences per step (recipe: 64)"),
        lr: float = typer.Option(3e-3, "--lr"),
        init_std: Optional[float] = typer.Option(None, "--init-std", help="std of the random initial matrices, both architectures (default: ModelSize's)"),
        keys: Optional[int] = typer.Option(None, "--keys", help="key (and value) tokens; chance is 1/keys (recipe: 64)"),
        filler: Optional[int] = typer.Option(None, "--filler", help="filler token ids; the vocabulary is 64 + 2 x keys + filler (recipe: 64)"),
        eval_examples: int = typer.Option(64, "--eval-examples"),
        seed: int = typer.Option(0, "--seed"),
        plot: Optional[Path] = typer.Option(None, "-o", "--plot", help="PNG to draw (default OUT/sweep.png)"),
        json_out: bool = typer.Option(False, "--json", help="print JSON"),
    ):
        """GLA at several state sizes and attention at the same widths on MQAR: accuracy vs state / KV-cache bytes."""
        from assay.core.output import print_json, print_table
        from assay.recall.shapes import layout_for
        from assay.recall.report import SWEEP_COLUMNS, TABLE_HEADERS, table_rows
        from assay.recall.sweep import RecallSweepRequest, plot_sweep, run_sweep

        from assay.recall import recipe

        request = RecallSweepRequest(
            out=out, widths=_ints("--widths", widths), gla_states=comma_list("--gla-states", gla_states, _state_setting),
            archs=_names(arch), pairs=_ints("--pairs", pairs), seq_len=seq_len, budget_min=budget_min,
            steps=steps, curriculum=curriculum, lr=lr, layout=layout_for(recipe.KEYS if keys is None else keys, recipe.FILLER if filler is None else filler),
            patience=patience, eval_examples=eval_examples, seed=seed, progress=not json_out,
            **_given(init_std=init_std, attention_heads=attention_heads, batch=batch, gla_short_conv=short_conv, short_first=short_first,
                     until_accuracy=until_accuracy)
            | {name: None for name, value in (("until_accuracy", until_accuracy), ("short_first", short_first)) if value == 0},
        )
        result = run_sweep(request)
        png = plot_sweep(result.rows, plot or out / "sweep.png", chance=request.layout.chance)
        if json_out:
            print_json(result.as_dict() | {"plot": str(png)})
        else:
            print_table(table_rows(result.rows), SWEEP_COLUMNS, headers=TABLE_HEADERS,
                        title=f"MQAR sweep at {seq_len} tokens (chance {100 * request.layout.chance:.2g}%)")
            typer.echo(f"results: {out / 'sweep.json'}  plot: {png}")

    @recall_app.command("needle")
    def needle(
        model: str = typer.Option(..., "--model", help="a checkpoint folder: native GLA, native Qwen3 or any Transformers causal LM"),
        lengths: str = typer.Option("512,2048,8192", "--lengths", help="prompt lengths in tokens"),
        depths: str = typer.Option("0,0.25,0.5,0.75,1", "--depths", help="needle depths, 0 (start) to 1 (end)"),
        trials: int = typer.Option(4, "--trials", help="prompts per cell"),
        fmt: str = typer.Option("auto", "--format", help="auto, text or tokens (tokens: checkpoints from `recall train`)"),
        device: str = device_option(),
        seed: int = typer.Option(0, "--seed"),
        plot: Optional[Path] = typer.Option(None, "-o", "--plot", help="heat-map PNG to draw"),
        json_out: bool = json_option(),
    ):
        """Needle probe of any checkpoint, no training: accuracy over lengths x depths."""
        from assay.core.output import print_json, print_table
        from assay.recall.needle import NeedleRequest, run_needle
        from assay.recall.models import LAYOUT_FILE
        from assay.recall.needle import _validate
        from assay.recall.report import plot_needle

        request = NeedleRequest(model=model, lengths=_ints("--lengths", lengths), depths=_floats("--depths", depths), trials=trials,
                                format=fmt, device=device, seed=seed, progress=not json_out)
        _validate(request)  # the flags first, then the checkpoint: both before any model loads
        # Text prompts need the checkpoint's tokenizer; token prompts (a `recall train` checkpoint,
        # which has recall.json) do not.
        tokens = fmt == "tokens" or (fmt == "auto" and (Path(model) / LAYOUT_FILE).is_file())
        check_checkpoint(model, tokenizer=not tokens)
        check_output_file("--plot", plot)
        result = run_needle(request)
        png = plot_needle(result.as_dict(), plot) if plot else None
        if json_out:
            print_json(result.as_dict() | {"grid": result.grid(list(request.lengths), list(request.depths)), "plot": str(png) if png else None})
        else:
            rows = [c | {"accuracy": f"{100 * c['accuracy']:.0f}%" if c["accuracy"] is not None else "-",
                         "status": c["status"] if c["status"] == "ok" else f"skipped: {c['reason']}"} for c in result.cells]
            print_table(rows, NEEDLE_COLUMNS, title=f"needle ({result.format}) on {model} [{result.kind}], chance {100 * result.chance:.2g}%")
            if png:
                typer.echo(f"plot: {png}")

    @recall_app.command("report")
    def report(
        folder: Path = typer.Argument(..., help="a `recall train` output folder (or its results.json)"),
        plot: Optional[Path] = typer.Option(None, "-o", "--plot", help="PNG to draw: accuracy vs pairs"),
        json_out: bool = json_option(),
    ):
        """The saved table of a `recall train` run, and its plot."""
        from assay.core.output import print_json, print_table
        from assay.recall.shapes import MQARLayout
        from assay.recall.report import TABLE_COLUMNS, TABLE_HEADERS, load_results, plot_accuracy, table_rows

        check_output_file("--plot", plot)
        data = load_results(folder)
        chance = MQARLayout(**data["request"]["layout"]).chance if "request" in data else None
        png = plot_accuracy(data["rows"], plot, chance=chance) if plot else None
        if json_out:
            print_json(data | {"plot": str(png) if png else None})
        else:
            print_table(table_rows(data["rows"]), TABLE_COLUMNS, headers=TABLE_HEADERS, title=f"MQAR recall: {folder}")
            if png:
                typer.echo(f"plot: {png}")
