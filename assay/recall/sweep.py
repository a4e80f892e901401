"""`assay recall sweep`: MQAR accuracy against decoding-state bytes, GLA at several state sizes and
attention at the same widths (Zoology's figure: accuracy vs model dimension / state size, per pair count).

Each point is one model, trained by `train_recall` (same recipe, budget and target for every point) on a
mixture of the pair counts at one length, then scored per pair count. GLA's state is
n_layers x dim^2 x expand_k / n_heads floats, so at one width fewer heads or a larger expand_k give a
larger state for (almost) the same parameters; attention's KV cache at that length is the comparison.
Parameter counts of the GLA settings and attention at each width are checked within 10% (`matched_params`).

sweep.json: one row per (point, pairs) with the `recall train` row fields plus `dim`, `gla_heads`,
`expand_k`; models' checkpoints under OUT/models/ (names carry the width and state setting).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from assay.core.errors import AssayError
from assay.core.files import atomic_write_json
from assay.recall import recipe
from assay.recall.models import has_short_conv, key_width, matched_params
from assay.recall.mqar import check_fits
from assay.recall.shapes import ModelSize, MQARLayout

SWEEP_FILE = "sweep.json"
SWEEP_SCHEMA = "assay.recall.sweep/1"


@dataclass(frozen=True)
class RecallSweepRequest:
    out: Path
    widths: tuple[int, ...] = (32, 64, 128)
    # GLA state settings at each width: (heads, expand_k); state grows with expand_k / heads. One head at
    # expand_k 0.5 holds 4x four heads' state; expand_k 1 would be 11% above attention's parameters at the
    # recipe's 256-id vocabulary (width 32), outside the 10% match.
    gla_states: tuple[tuple[int, float], ...] = ((4, 0.5), (1, 0.5))
    attention_heads: int = 1  # the recipe's (assay.recall.recipe): one 64-wide head tells 64 keys apart
    archs: tuple[str, ...] = ("gla", "qwen3")
    pairs: tuple[int, ...] = (4, 16)
    seq_len: int = 64
    n_layers: int = 2
    hidden_ratio: int = 2  # SwiGLU width = ratio x dim
    init_std: float = recipe.SIZE.init_std
    budget_min: float | None = 3.0
    until_accuracy: float | None = recipe.UNTIL_ACCURACY
    steps: int | None = None
    eval_every: int = 100
    curriculum: bool = False
    short_first: int | None = recipe.SHORT_FIRST  # the length curriculum (RecallTrainRequest.short_first)
    patience: int | None = None  # early stop on a plateau (RecallTrainRequest.patience)
    gla_short_conv: bool = recipe.SIZE.gla_short_conv  # fla's short convolutions in every GLA (ModelSize.gla_short_conv)
    batch: int = recipe.BATCH
    lr: float = 3e-3
    warmup_steps: int = 50
    layout: MQARLayout = field(default_factory=recipe.layout)
    eval_examples: int = 64
    seed: int = 0
    threads: int | None = 1
    progress: bool = False


@dataclass(frozen=True)
class SweepPoint:
    arch: str
    size: ModelSize

    @property
    def tag(self) -> str:
        expand_k = key_width(self.arch, self.size)
        conv = "-conv" if has_short_conv(self.arch, self.size) else ""
        return f"-d{self.size.dim}-h{self.size.n_heads}" + (f"-k{expand_k:g}" if expand_k is not None else "") + conv


@dataclass
class RecallSweepResult:
    rows: list[dict]
    models: list[dict]
    out: Path

    def as_dict(self) -> dict:
        return {"schema": SWEEP_SCHEMA, "rows": self.rows, "models": self.models}


def sweep_points(request: RecallSweepRequest) -> list[SweepPoint]:
    """Every model of the sweep, widths outermost; AssayError when a width's sizes are not matched."""
    points = []
    for dim in request.widths:
        base = ModelSize(dim=dim, n_layers=request.n_layers, n_heads=request.attention_heads, hidden_dim=request.hidden_ratio * dim,
                         vocab_size=request.layout.vocab_size, init_std=request.init_std, gla_short_conv=request.gla_short_conv)
        gla_sizes = [replace(base, n_heads=heads, gla_expand_k=expand_k) for heads, expand_k in request.gla_states]
        for size in gla_sizes:
            if dim % size.n_heads or (dim * size.gla_expand_k) % size.n_heads:
                raise AssayError(f"width {dim}: {size.n_heads} heads do not divide the GLA key/value widths")
            if "gla" in request.archs and "qwen3" in request.archs:
                matched_params(size)  # GLA at this state setting vs attention at this width, within 10%
        if "qwen3" in request.archs:
            points.append(SweepPoint("qwen3", base))
        if "gla" in request.archs:
            points.extend(SweepPoint("gla", size) for size in gla_sizes)
    return points


def _validate(request: RecallSweepRequest) -> None:
    if not request.widths or not request.pairs or not request.archs:
        raise AssayError("--widths, --pairs and --arch each need at least one value")
    if request.attention_heads < 1:
        raise AssayError(f"--attention-heads must be >= 1 (got {request.attention_heads})")
    for dim in request.widths:
        if dim < 8 or dim % request.attention_heads:
            raise AssayError(f"--widths {dim}: expected a multiple of {request.attention_heads} (attention heads), at least 8")
    for heads, expand_k in request.gla_states:
        if heads < 1 or not (expand_k > 0 and math.isfinite(expand_k)):
            raise AssayError(f"--gla-states {heads}:{expand_k}: expected heads >= 1 and expand_k > 0")
    for pairs in request.pairs:
        problem = check_fits(request.layout, request.seq_len, pairs)
        if problem:
            raise AssayError(f"--pairs {pairs}: {problem}")


def run_sweep(request: RecallSweepRequest) -> RecallSweepResult:
    from assay.recall.train import RecallTrainRequest, train_recall

    _validate(request)
    points = sweep_points(request)
    out = Path(request.out)
    result = RecallSweepResult([], [], out)
    for point in points:
        trained = train_recall(RecallTrainRequest(
            out=out / "runs" / f"{point.arch}{point.tag}", archs=(point.arch,), pairs=request.pairs, seq_lens=(request.seq_len,),
            steps=request.steps, budget_min=request.budget_min, until_accuracy=request.until_accuracy, eval_every=request.eval_every,
            curriculum=request.curriculum, short_first=request.short_first, patience=request.patience, batch=request.batch, lr=request.lr, warmup_steps=request.warmup_steps, size=point.size,
            layout=request.layout, eval_examples=request.eval_examples, seed=request.seed, threads=request.threads,
            progress=request.progress, tag=point.tag,
        ))
        result.models.extend(trained.models)
        for row in trained.rows:
            result.rows.append(row | {"dim": point.size.dim, "heads": point.size.n_heads,
                                      "expand_k": key_width(point.arch, point.size),
                                      "short_conv": has_short_conv(point.arch, point.size)})
        _write(result, request)
    return result


def _write(result: RecallSweepResult, request: RecallSweepRequest) -> None:
    settings = asdict(request) | {"out": str(request.out)}
    atomic_write_json(result.out / SWEEP_FILE, result.as_dict() | {"request": settings})


def plot_sweep(rows: list[dict], out: str | Path, chance: float | None = None, title: str | None = None) -> Path:
    """Accuracy vs state (GLA) or KV-cache (attention) bytes per sequence, log x; one panel per pair count.
    Hollow markers: the model stopped on its budget before reaching the target (not converged)."""
    from assay.core.metrics import new_figure, save_figure

    scored = [r for r in rows if r.get("status") == "ok" and r.get("accuracy") is not None]
    if not scored:
        raise AssayError("no scored rows to plot")
    pair_counts = sorted({r["pairs"] for r in scored})
    fig, axes = new_figure(ncols=len(pair_counts), size=(4.2, 4.0))
    styles = {"gla": ("tab:blue", "o", "GLA"), "qwen3": ("tab:red", "s", "attention (Qwen3)")}
    for ax, pairs in zip(axes[0], pair_counts):
        for arch, (colour, marker, label) in styles.items():
            points = sorted((r["state_bytes"], r["accuracy"], r.get("converged")) for r in scored if r["arch"] == arch and r["pairs"] == pairs)
            if not points:
                continue
            ax.plot([p[0] for p in points], [100 * p[1] for p in points], color=colour, linewidth=1, alpha=0.6)
            for x, y, converged in points:
                ax.plot([x], [100 * y], marker=marker, color=colour, markerfacecolor=colour if converged is not False else "white",
                        linestyle="none")
            ax.plot([], [], color=colour, marker=marker, label=label)
        if chance:
            ax.axhline(100 * chance, color="grey", linestyle=":", linewidth=1, label=f"chance ({100 * chance:.2g}%)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("state / KV-cache bytes per sequence (float32)")
        ax.set_ylabel("recall accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(f"{pairs} key-value pairs")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8, title="hollow: budget ran out", title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, out)
