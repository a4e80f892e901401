"""`assay recall train`'s request and its checks, without torch: the command checks a request before it
imports the trainer, so a wrong flag answers at once (not after importing torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from assay.core.errors import AssayError
from assay.recall import recipe
from assay.recall.shapes import ARCHS, ModelSize, MQARLayout


@dataclass(frozen=True)
class RecallTrainRequest:
    """Defaults: the recipe that converges (assay.recall.recipe; docs/recall.md says why each)."""

    out: Path
    archs: tuple[str, ...] = ARCHS
    pairs: tuple[int, ...] = recipe.PAIRS
    seq_lens: tuple[int, ...] = (recipe.SEQ_LEN,)
    steps: int | None = None
    budget_min: float | None = recipe.BUDGET_MIN  # CPU minutes of this process per model (time.process_time)
    # Stop a model once every trained pair count reaches this validation accuracy (None: train the budget).
    until_accuracy: float | None = recipe.UNTIL_ACCURACY
    eval_every: int = 100  # steps between validation scores (with until_accuracy or curriculum)
    val_examples: int = 32  # validation sequences per pair count
    curriculum: bool = False
    # A length curriculum: train on sequences of this many tokens (as many tokens per step, the pair
    # counts that fit) until their validation reaches until_accuracy, then at the full length. None: off.
    short_first: int | None = recipe.SHORT_FIRST
    # Early stop on a plateau: this many validations in a row (at the full length) without the lowest
    # pair count's accuracy rising by PLATEAU_MIN_GAIN over the best so far. None: train to the budget.
    patience: int | None = None
    batch: int = recipe.BATCH
    # Set: each length gets batch = tokens_per_step // seq_len, so every model sees the same tokens per step.
    tokens_per_step: int | None = None
    lr: float = 3e-3
    warmup_steps: int = 20
    size: ModelSize = recipe.SIZE
    layout: MQARLayout = field(default_factory=recipe.layout)
    eval_examples: int = 64
    seed: int = 0
    device: str = "cpu"
    # torch threads while training. 1 by default: a tiny model's step is hundreds of small ops, and on a
    # shared 2-core machine a second thread waits on a descheduled peer (measured: 0.14 s vs 1.5 s a step).
    threads: int | None = 1
    progress: bool = False
    # Checkpoint folder names are f"{arch}-L{seq_len}{tag}" (a sweep trains several sizes into one folder).
    tag: str = ""


def validate_train_request(request: RecallTrainRequest) -> None:
    """Every value of the request; bad input raises AssayError (one line, exit 2 from the command)."""
    if request.steps is None and request.budget_min is None:
        raise AssayError("give a training budget: --steps N and/or --budget-min M")
    if request.steps is not None and request.steps < 1:
        raise AssayError(f"--steps must be >= 1 (got {request.steps})")
    if request.budget_min is not None and not (request.budget_min > 0 and math.isfinite(request.budget_min)):
        raise AssayError(f"--budget-min must be a positive number of minutes (got {request.budget_min})")
    if request.until_accuracy is not None and not 0 < request.until_accuracy <= 1:
        raise AssayError(f"--until-accuracy must be in (0, 1] (got {request.until_accuracy})")
    if request.curriculum and request.until_accuracy is None:
        raise AssayError("--curriculum adds pair counts when the active ones reach --until-accuracy: give it")
    if request.short_first is not None:
        if request.until_accuracy is None:
            raise AssayError("--short-first moves to the full length when the short sequences reach --until-accuracy: give it")
        if request.short_first < 4:
            raise AssayError(f"--short-first {request.short_first}: needs >= 4 tokens (one key-value pair and its query)")
    if request.patience is not None and request.patience < 1:
        raise AssayError(f"--patience must be >= 1 validation (got {request.patience})")
    if request.eval_every < 1 or request.val_examples < 1:
        raise AssayError("--eval-every and --val-examples must be >= 1")
    for arch in request.archs:
        if arch not in ARCHS:
            raise AssayError(f"unknown --arch {arch!r} (one of {', '.join(ARCHS)})")
    if not request.archs or not request.pairs or not request.seq_lens:
        raise AssayError("--arch, --pairs and --seq-len each need at least one value")
    for seq_len in request.seq_lens:
        if seq_len < 4 or seq_len > request.size.max_seq_len:
            raise AssayError(f"--seq-len {seq_len}: expected 4 to {request.size.max_seq_len}")
    if not (request.size.init_std > 0 and math.isfinite(request.size.init_std)):
        raise AssayError(f"--init-std must be a positive number (got {request.size.init_std})")
    if request.batch < 1 or request.eval_examples < 1:
        raise AssayError("--batch and --eval-examples must be >= 1")
    if request.tokens_per_step is not None and request.tokens_per_step < max(request.seq_lens):
        raise AssayError(f"--tokens-per-step {request.tokens_per_step} is less than one sequence of {max(request.seq_lens)}")
