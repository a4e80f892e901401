"""What a choice's own tokens do to its next logits: the repetition, presence and frequency penalties and
min_tokens, read from the choice's token history (its prompt and what it generated).

    history = TokenHistory.start(params, prompt, vocab_size)     # None when the params ask for none of them
    logits = penalize(logits, params, history)                    # logits [vocab] float32 -> a new tensor
    history.append(token)                                         # after each token the choice emits

Semantics (docs/serve.md, "Sampling"), in this order, on the model's raw logits before temperature:
- min_tokens: the stop token ids (the model's end-of-text ones among them unless ignore_eos) get -inf while
  fewer than min_tokens tokens were generated (Transformers' MinNewTokensLengthLogitsProcessor);
- repetition_penalty p: every token of the prompt or the output so far has its logit divided by p when
  positive, multiplied by p otherwise (Transformers' RepetitionPenaltyLogitsProcessor, vLLM's);
- frequency_penalty f, presence_penalty r (OpenAI's, vLLM's; output tokens only): logit -= f * count, then
  logit -= r * (count > 0), two subtractions as vLLM makes them.

The history is kept as tensors over the vocabulary updated by index (one write per token), so a step reads
it in O(vocab) whatever the length: `seen` (prompt and output, for the repetition penalty), `counts`
(output only, for the other two), each allocated only when its penalty is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from assay.serve.engine.sampling import SamplingParams


@dataclass
class TokenHistory:
    """One choice's tokens as the penalties read them."""

    seen: torch.Tensor | None  # [vocab] bool: in the prompt or generated (repetition_penalty != 1 only)
    counts: torch.Tensor | None  # [vocab] int32: times generated (presence or frequency penalty only)
    stop_ids: torch.Tensor | None  # the stop token ids inside the vocabulary (min_tokens only)
    generated: int = 0

    @classmethod
    def start(cls, params: SamplingParams, prompt: Sequence[int], vocab_size: int) -> TokenHistory | None:
        """A fresh history for one choice of `prompt`; None when params ask for no penalty and no min_tokens."""
        if not params.penalizes:
            return None
        seen = counts = stop_ids = None
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(vocab_size, dtype=torch.bool)
            seen[torch.tensor(list(prompt), dtype=torch.int64)] = True
        if params.presence_penalty or params.frequency_penalty:
            counts = torch.zeros(vocab_size, dtype=torch.int32)
        if params.min_tokens:
            # Ids past the vocabulary can never be sampled, so there is nothing to mask for them.
            stop_ids = torch.tensor(sorted({t for t in params.stop_token_ids if 0 <= t < vocab_size}), dtype=torch.int64)
        return cls(seen, counts, stop_ids)

    def append(self, token: int) -> None:
        self.generated += 1
        if self.seen is not None:
            self.seen[token] = True
        if self.counts is not None:
            self.counts[token] += 1


def penalize(logits: torch.Tensor, params: SamplingParams, history: TokenHistory) -> torch.Tensor:
    """logits [vocab] float32 -> the logits after min_tokens and the penalties (out of place: the raw logits
    stay what the log-probabilities are computed from)."""
    if history.stop_ids is not None and history.generated < params.min_tokens and len(history.stop_ids):
        logits = logits.index_fill(-1, history.stop_ids, float("-inf"))
    if history.seen is not None:
        penalty = params.repetition_penalty
        logits = torch.where(history.seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
    if history.counts is not None:
        if params.frequency_penalty:
            logits = logits - params.frequency_penalty * history.counts
        if params.presence_penalty:
            logits = logits - params.presence_penalty * (history.counts > 0)
    return logits


__all__ = ["TokenHistory", "penalize"]
