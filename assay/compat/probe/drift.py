"""Logit drift: how far the compiled run's logits are from the reference's, step by step.

Token equality flips only when drift crosses the gap between the two most likely tokens; recording the
drift itself shows a compiler getting less accurate before any token changes (docs/triage.md).

Per compared step s (the steps whose context is the same in both runs: every step up to and including
the first token mismatch; after it the two runs condition on different tokens):
- max_abs[s] = max_i |logit[i] - ref[i]|
- max_rel[s] = max_abs[s] / max_i |ref[i]|  (relative to the step's largest reference logit: an
  element-wise ratio is unbounded at logits near zero, which every vocabulary has)
- cosine[s] = cos(logit, ref) over the vocabulary.
All computed in float64, whatever the run's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitDrift:
    max_abs: list[float]
    max_rel: list[float]
    cosine: list[float]

    def row_columns(self, reference_dtype: str) -> dict:
        """The dataset columns (schema 4): per-step lists and their worst values."""
        return {
            "logit_max_abs": self.max_abs,
            "logit_max_rel": self.max_rel,
            "logit_cosine": self.cosine,
            "logit_max_abs_max": max(self.max_abs) if self.max_abs else None,
            "logit_max_rel_max": max(self.max_rel) if self.max_rel else None,
            "logit_cosine_min": min(self.cosine) if self.cosine else None,
            "logit_reference_dtype": reference_dtype,
        }


def compared_steps(tokens: list[int], reference_tokens: list[int]) -> int:
    """How many steps saw the same context in both runs: up to and including the first mismatch."""
    for step, (token, expected) in enumerate(zip(tokens, reference_tokens)):
        if token != expected:
            return step + 1
    return min(len(tokens), len(reference_tokens))


def logit_drift(logits: torch.Tensor, reference: torch.Tensor, steps: int) -> LogitDrift:
    """logits, reference: [steps, vocab] (any float dtype, any device); the first `steps` rows compared."""
    actual = logits[:steps].detach().to("cpu", torch.float64)
    expected = reference[:steps].detach().to("cpu", torch.float64)
    vocab = min(actual.shape[-1], expected.shape[-1])  # a padded vocabulary: compare the common part
    actual, expected = actual[:, :vocab], expected[:, :vocab]
    max_abs = (actual - expected).abs().amax(dim=-1)
    scale = expected.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    cosine = torch.nn.functional.cosine_similarity(actual, expected, dim=-1, eps=1e-300).clamp(-1.0, 1.0)  # round-off: 1 + 1e-15
    return LogitDrift(max_abs.tolist(), (max_abs / scale).tolist(), cosine.tolist())
