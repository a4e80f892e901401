"""A batch's token masks: filled for the guided rows (on a worker thread, while the forward runs) and applied
to the logits in place before sampling.

    masks = TokenMasks(vocab_size=compiler.vocab_size, rows=8)
    pending = masks.start_fill({0: matcher_a, 3: matcher_b})   # before the forward: llguidance drops the GIL
    logits = model(...)                                        # [rows, width]; width may exceed vocab_size
    masks.apply(logits, pending.result())                      # rows 0 and 3 masked; the others untouched
    tokens = sample(logits); matcher_a.accept(tokens[0]); ...

Width and vocabulary: a model's logits are often padded past its tokenizer (a multiple of 64 or 128), and a
tokenizer can hold added tokens past the model's head. A guided row allows only tokens the grammar allows,
so logits past the tokenizer's vocabulary are set to -inf there, and mask bits past the logits' width are
dropped (those tokens cannot be sampled anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import torch

from assay.serve.guided.matcher import GuidedMatcher, bitmask_words, check_bitmask, unpack_bits


class TokenMasks:
    """A preallocated bitmask for up to `rows` rows (grown on demand), and the thread that fills it.

    threads: llguidance's own pool for a batch of rows (LLExecutor); 1 keeps the fill off the cores the
    forward uses on a small CPU machine.
    """

    def __init__(self, vocab_size: int, rows: int = 1, threads: int = 1):
        self.vocab_size = vocab_size
        self.bitmask = torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)
        self._executor = llguidance.LLExecutor(num_threads=threads)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="assay-guided-fill")

    def fill(self, matchers: Mapping[int, GuidedMatcher]) -> list[int]:
        """Fill the bitmask rows of `matchers` ({row: matcher}); returns the rows filled, in order."""
        rows = sorted(matchers)
        if not rows:
            return rows
        if rows[-1] >= self.bitmask.shape[0]:
            self.bitmask = torch.full((rows[-1] + 1, self.bitmask.shape[1]), -1, dtype=torch.int32)
        if len(rows) == 1:
            matchers[rows[0]].fill(self.bitmask, rows[0])
        else:
            check_bitmask(self.bitmask)
            row_bytes = self.bitmask.shape[1] * self.bitmask.element_size()
            self._executor.unsafe_compute_mask_ptr([(matchers[r].handle, r) for r in rows], self.bitmask.data_ptr(), row_bytes,
                                                   self.bitmask.shape[0])
        return rows

    def start_fill(self, matchers: Mapping[int, GuidedMatcher]) -> Future[list[int]]:
        """fill() on the worker thread; call .result() after the forward. The caller must not accept tokens
        into these matchers until then."""
        return self._worker.submit(self.fill, dict(matchers))

    def apply(self, logits: torch.Tensor, rows: list[int]) -> list[int]:
        """Mask logits[rows] in place (-inf where not allowed); other rows are not touched. Returns the rows
        where nothing is allowed."""
        return apply_bitmask(logits, self.bitmask, rows, self.vocab_size) if rows else []

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], vocab_size: int) -> list[int]:
    """logits: [batch, width]; bitmask: int32 [>= max(rows) + 1, ceil(vocab_size / 32)], row i for logits row i.
    Returns the rows in which no token is allowed (a matcher in error): the caller decides what they draw."""
    known = min(logits.shape[-1], vocab_size)
    blocked = ~unpack_bits(bitmask[rows].to(logits.device))[:, :known]
    # A handful of whole-batch ops, whatever the number of rows: each torch op costs a round of the intra-op
    # thread pool, which a loaded machine makes dear (per-row ops measured 200 ms a step for 8 rows at load 10).
    first = rows[0]
    if rows == list(range(first, first + len(rows))):  # a contiguous block (every row guided, the usual case)
        _block(logits[first:first + len(rows)], blocked, known)
    else:
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        selected = logits.index_select(0, index)
        _block(selected, blocked, known)
        logits.index_copy_(0, index, selected)
    return [rows[i] for i in blocked.all(-1).nonzero().flatten().tolist()]


def _block(logits: torch.Tensor, blocked: torch.Tensor, known: int) -> None:
    logits[:, :known].masked_fill_(blocked, float("-inf"))
    logits[:, known:] = float("-inf")  # past the tokenizer: ids no text maps to
