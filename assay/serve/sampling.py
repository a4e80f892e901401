"""How the next token is chosen from a row of logits: greedy, or sampled at a temperature with the
request's own seeded generator.

    sampling = Sampling.create(temperature=0.7, seed=1)   # AssayError for a bad temperature
    tokens = sample_tokens(logits, [sampling, ...])       # logits [N, vocab] -> N token ids

Sampling runs on the CPU, outside the compiled decode graph, so a seed gives the same tokens whether
the decode step was compiled or eager.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from assay.core.errors import AssayError


@dataclass
class Sampling:
    """One request's sampling settings and random stream (None for greedy)."""

    temperature: float = 0.0
    generator: torch.Generator | None = None

    @classmethod
    def create(cls, temperature: float = 0.0, seed: int | None = None) -> Sampling:
        """Checked settings; a request without a seed gets a random one, so two such requests differ."""
        try:
            temperature = float(temperature)
        except (TypeError, ValueError):
            raise AssayError(f"temperature must be a number, got {temperature!r}") from None
        if not 0.0 <= temperature < float("inf"):
            raise AssayError(f"temperature must be a finite number >= 0, got {temperature!r}")
        generator = None
        if temperature > 0:
            generator = torch.Generator(device="cpu").manual_seed(seed if seed is not None else random.getrandbits(63))
        return cls(temperature, generator)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_tokens(logits: torch.Tensor, rows: Sequence[Sampling]) -> list[int]:
    """logits [N, vocab] (any float dtype, any device) -> the next token of each row."""
    # Greedy rows in one argmax; sampled rows each with their own generator.
    logits = logits.float().cpu()
    tokens = logits.argmax(-1).tolist()
    for row, sampling in enumerate(rows):
        if not sampling.greedy:
            probs = torch.softmax(logits[row] / sampling.temperature, dim=-1)
            tokens[row] = int(torch.multinomial(probs, 1, generator=sampling.generator).item())
    return tokens


__all__ = ["Sampling", "sample_tokens"]
