"""One request's position in its grammar: the tokens allowed next, and the tokens it has accepted.

    matcher = grammar.matcher()
    matcher.fill(bitmask, row)          # bitmask: int32 [rows, ceil(vocab / 32)] on the CPU, bit set = allowed
    matcher.accept(token_id)            # False: the token broke the grammar (the matcher is then in error)
    matcher.is_terminated()             # the grammar is complete: only a stop token (or nothing) may follow
    matcher.rollback(n)                 # undo the last n accepted tokens (speculative decoding, stop strings)

Filling does not change the state, and llguidance drops the GIL while it computes a mask, so a fill can run
on another thread while the model's forward runs (masks.py).
"""

from __future__ import annotations

import llguidance
import torch

BITS = 32  # tokens per int32 word of a bitmask


def check_bitmask(bitmask: torch.Tensor) -> None:
    """llguidance writes a mask through the tensor's data pointer: it must be a contiguous int32 CPU matrix.
    (llguidance.torch checks the same and makes the same pointer calls, but importing it applies torch.compile to
    a kernel, which imports dynamo and inductor: about 2.5 CPU-seconds on every server start.)"""
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2 or not bitmask.is_contiguous():
        raise ValueError(f"a token bitmask must be a contiguous int32 CPU matrix, got {bitmask.dtype} {tuple(bitmask.shape)} on {bitmask.device}")


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS - 1) // BITS


class GuidedMatcher:
    """Wraps an llguidance.LLMatcher; made by Grammar.matcher()."""

    def __init__(self, matcher: llguidance.LLMatcher):
        self._matcher = matcher
        self.accepted = 0  # tokens accepted so far (what rollback can undo)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into bitmask[row]."""
        check_bitmask(bitmask)
        words = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        """The allowed next tokens as a bool [vocab_size] tensor (tests and debugging; the engine uses fill)."""
        bitmask = torch.zeros(1, bitmask_words(vocab_size), dtype=torch.int32)
        self.fill(bitmask, 0)
        return unpack_bits(bitmask)[0, :vocab_size]

    def accept(self, token_id: int) -> bool:
        accepted = self._matcher.consume_token(int(token_id))
        self.accepted += int(accepted)
        return accepted

    def is_terminated(self) -> bool:
        """True once the grammar can take no more text (after its last token, and after a stop token)."""
        return self._matcher.is_stopped()

    def is_accepting(self) -> bool:
        """True when the text so far is a complete output (a stop token would be allowed now)."""
        return self._matcher.is_accepting()

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self.accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self.accepted} accepted")
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise RuntimeError(f"llguidance refused to roll back {num_tokens} tokens: {self.error}")
        self.accepted -= num_tokens

    @property
    def error(self) -> str:
        """Why the matcher stopped accepting, or '' (a token outside the mask, or a grammar the lexer gave up on)."""
        return self._matcher.get_error()

    @property
    def handle(self) -> llguidance.LLMatcher:
        """The library's matcher, for batched fills (llguidance.LLExecutor)."""
        return self._matcher


# Bit b of a word (1 << 31 is the sign bit, -2**31 as an int32).
_BIT_VALUES = torch.tensor([1 << b if b < BITS - 1 else -(1 << b) for b in range(BITS)], dtype=torch.int32)


def unpack_bits(bitmask: torch.Tensor) -> torch.Tensor:
    """int32 [rows, words] -> bool [rows, words * 32]: token t is allowed when bit t % 32 of word t // 32 is set."""
    return (bitmask.unsqueeze(-1) & _BIT_VALUES.to(bitmask.device)).ne(0).flatten(1)
