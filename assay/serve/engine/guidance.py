"""Decoding under a grammar, as the engine drives it: each guided row's token mask is filled on a worker thread
while the model's forward runs (and made an additive bias there), added to the logits before the draw, and
the drawn token is accepted into the row's matcher.

    guidance = Guidance(max_rows=8, width=49152)
    pending = guidance.start(samplings)               # before the forward (None when no row is guided)
    logits = model(...)
    masked = guidance.constrain(logits, samplings, pending)
    tokens = sample_tokens(masked, samplings)         # log-probabilities still come from `logits`
    guidance.advance(samplings, tokens)
    guidance.finished(sampling)                       # None, "stop" (the grammar is complete) or "error"

The mask is applied outside the compiled decode graph, so the graph is the same for guided and free rows
and a batch can hold any mix of schemas. Log-probabilities are the model's own (before the mask), as vLLM
reports them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from assay.serve.engine.sampling import Sampling
from assay.serve.guided import GuidedMatcher, TokenMasks

log = logging.getLogger("assay.serve")


def _fill_threads() -> int:
    # llguidance's own pool for a batch's masks: none beyond the worker on a small machine, where the forward
    # needs every core; a few on a large one, where a 64-row fill would otherwise outlast the forward.
    return max(1, min(8, (os.cpu_count() or 2) // 4))


class Guidance:
    """The batch's token masks (one TokenMasks, made when the first guided row arrives) and the worker thread
    that turns them into an additive bias while the forward runs.

    width: the model's logits width (its vocabulary, which may differ from the tokenizer's).
    """

    def __init__(self, max_rows: int, width: int):
        self.max_rows = max_rows
        self.width = width
        self._masks: TokenMasks | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="assay-guided-bias")

    def _rows(self, samplings: Sequence[Sampling]) -> dict[int, GuidedMatcher]:
        return {row: s.matcher for row, s in enumerate(samplings) if s.matcher is not None}

    def _masks_for(self, samplings: Sequence[Sampling], rows: dict[int, GuidedMatcher]) -> TokenMasks:
        vocab_size = samplings[next(iter(rows))].params.grammar.vocab_size
        if self._masks is None or self._masks.vocab_size != vocab_size:
            self._masks = TokenMasks(vocab_size, rows=self.max_rows, threads=_fill_threads())
        return self._masks

    def start(self, samplings: Sequence[Sampling]) -> Future[Bias] | None:
        """Start filling the guided rows' masks (their matchers must not change until constrain())."""
        rows = self._rows(samplings)
        if not rows:
            return None
        return self._worker.submit(self._bias, self._masks_for(samplings, rows), rows, len(samplings))

    def _bias(self, masks: TokenMasks, rows: dict[int, GuidedMatcher], count: int) -> Bias:
        """[count, width] float32: 0 where a token is allowed (and on every free row), -inf elsewhere; and the
        guided rows that allow nothing. In numpy, single-threaded and without the GIL: it runs beside the
        forward and must not take the forward's cores from it."""
        filled = masks.fill(rows)
        known = min(self.width, masks.vocab_size)
        words = masks.bitmask[filled].numpy()  # int32 [rows, words]; token t is bit t % 32 of word t // 32
        allowed = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")[:, :known].astype(bool)
        bias = np.zeros((count, self.width), dtype=np.float32)
        bias[filled, :known] = np.where(allowed, np.float32(0), np.float32(-np.inf))
        bias[filled, known:] = -np.inf  # past the tokenizer: ids no text maps to
        return torch.from_numpy(bias), [row for row, any_allowed in zip(filled, allowed.any(-1)) if not any_allowed]

    def constrain(self, logits: torch.Tensor, samplings: Sequence[Sampling], pending: Future[Bias] | None = None) -> torch.Tensor:
        """logits [N, width] -> the logits to draw from: `logits` itself when no row is guided, else a float32
        copy with each guided row's disallowed tokens at -inf (computed now when nothing was started)."""
        rows = self._rows(samplings)
        if not rows:
            return logits
        masks = self._masks_for(samplings, rows)
        bias, dead = pending.result() if pending is not None else self._bias(masks, rows, len(samplings))
        if bias.shape[-1] != logits.shape[-1]:  # a model whose logits are wider or narrower than it said: learn it once
            self.width = logits.shape[-1]
            bias, dead = self._bias(masks, rows, len(samplings))
        # One op after the forward, which is also the copy: the runner's logits stay the model's own (the
        # log-probabilities), and a first token's logits are one row expanded over the request's choices.
        masked = logits.float() + bias.to(logits.device)
        for row in dead:  # a matcher in error allows nothing: draw from the free row (advance() reports it)
            masked[row] = logits[row].float()
        return masked

    @staticmethod
    def advance(samplings: Sequence[Sampling], tokens: Sequence[int]) -> None:
        for sampling, token in zip(samplings, tokens):
            matcher = sampling.matcher
            if matcher is not None and not matcher.is_terminated() and not matcher.accept(token):
                log.error("a guided row's token %d broke its grammar: %s", token, matcher.error)

    @staticmethod
    def finished(sampling: Sampling) -> str | None:
        """Why a guided row ends now: "stop" once its grammar is complete, "error" once its matcher failed."""
        matcher = sampling.matcher
        if matcher is None:
            return None
        if matcher.error:
            return "error"
        return "stop" if matcher.is_terminated() else None


Bias = tuple[torch.Tensor, list[int]]  # the additive mask [rows, width] and the guided rows that allow nothing
