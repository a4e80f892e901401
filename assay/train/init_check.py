"""--check-init: did the checkpoint's weights load? The first batch's loss of the loaded weights against a
random initialisation of the same architecture (same seed) and ln(vocab)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assay.core.errors import AssayError
from assay.train import distributed
from assay.train.loss import next_token_loss
from assay.train.model_paths import TrainModel

# Loaded weights count as loaded when their first-step loss is at most this fraction of the lower of
# (random-init loss, ln(vocab)). Untrained weights sit at or above ln(vocab); the guide's published
# Qwen3 scored 6.54 against 12.43 random / 11.93 ln(vocab), i.e. 0.55 of it.
LOADED_LOSS_RATIO = 0.8


@dataclass(frozen=True)
class CheckInit:
    """The --check-init result: the three losses and the verdict."""

    loaded_loss: float
    random_loss: float
    ln_vocab: float
    weights_loaded: bool
    verdict: str


def check_init(loaded: TrainModel, inputs: torch.Tensor, labels: torch.Tensor, layout: distributed.Layout, seed: int) -> CheckInit:
    """First-step loss of the loaded weights vs a random init of the same architecture vs ln(vocab)."""
    if not loaded.has_checkpoint_weights:
        raise AssayError("--check-init compares the checkpoint's weights with random ones; a --flavour model has none")
    twin = loaded.random_twin(seed)
    with torch.no_grad():
        loaded_loss = float(distributed.mean_over_ranks(next_token_loss(loaded.logits(inputs), labels), layout))
        random_loss = float(distributed.mean_over_ranks(next_token_loss(twin.logits(inputs), labels), layout))
    del twin
    ln_vocab = math.log(loaded.vocab_size)
    threshold = LOADED_LOSS_RATIO * min(random_loss, ln_vocab)
    weights_loaded = loaded_loss <= threshold
    if weights_loaded:
        verdict = (
            f"weights loaded: first-step loss {loaded_loss:.3f} is far below random init {random_loss:.3f} "
            f"and ln(vocab) {ln_vocab:.3f}"
        )
    else:
        verdict = (
            f"weights NOT loaded (or untrained): first-step loss {loaded_loss:.3f} is not clearly below random init "
            f"{random_loss:.3f} / ln(vocab) {ln_vocab:.3f} (needs <= {threshold:.3f})"
        )
    return CheckInit(loaded_loss, random_loss, ln_vocab, weights_loaded, verdict)
