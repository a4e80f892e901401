"""Numerical comparisons shared by every system, and the one table of tolerances.

The norm is relative error against a float64 reference: ||a - ref|| / ||ref||. A tolerance is
looked up by (check, dtype) in TOLERANCES, never written inline in a test or a check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

# Why these numbers: float32 carries 24 bits of mantissa (unit roundoff 6e-8); a reduction over a
# few thousand terms in another order drifts by ~1e-6 relative, so 1e-5 allows reassociation and
# nothing more. bfloat16 has 8 bits (unit roundoff 4e-3); a kernel that rounds its inputs and
# accumulates in float32 lands within 1-2e-2 of the float64 result. float16 has 11 bits.
TOLERANCES: dict[tuple[str, torch.dtype], float] = {
    # a kernel vs the float64 evaluation of the same math (forward or gradient)
    ("kernel", torch.float32): 1e-5,
    ("kernel", torch.bfloat16): 2e-2,
    ("kernel", torch.float16): 4e-3,
    # chunked vs step-by-step recurrence (GLA): more terms, gates multiplied along the sequence
    ("recurrence", torch.float32): 1e-4,
    ("recurrence", torch.bfloat16): 3e-2,
    # float64 (unit roundoff 1.1e-16): a reference checked against its own closed form, order changes only
    ("recurrence", torch.float64): 1e-12,
    # two implementations of one model's forward (native vs Transformers), logits
    ("model_logits", torch.float32): 1e-5,
    ("model_logits", torch.bfloat16): 3e-2,
    # one model's parameter gradient computed two ways (tensor-parallel or FSDP vs single process):
    # the same reductions split across ranks and summed in another order
    ("model_grad", torch.float32): 1e-5,
    ("model_grad", torch.bfloat16): 3e-2,
    # a training loss curve run two ways (sharded vs single process, kernels vs none)
    ("train_loss", torch.float32): 1e-4,
    ("train_loss", torch.bfloat16): 2e-2,
    # an optimizer update computed two ways (sharded vs single-process Muon)
    ("optimizer_update", torch.float32): 1e-5,
    ("optimizer_update", torch.bfloat16): 2e-2,
    # compiled vs eager logits of the same model (reassociation under fusion)
    ("compiled_vs_eager", torch.float32): 1e-4,
    ("compiled_vs_eager", torch.bfloat16): 5e-2,
}


def tolerance(check: str, dtype: torch.dtype) -> float:
    try:
        return TOLERANCES[(check, dtype)]
    except KeyError:
        raise KeyError(f"no tolerance stated for check {check!r} in {dtype}; add it to TOLERANCES") from None


def rel_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """||actual - reference|| / ||reference||, computed in float64. 0 when both are zero."""
    actual64 = actual.detach().to(torch.float64).cpu()
    reference64 = reference.detach().to(torch.float64).cpu()
    diff = torch.linalg.vector_norm(actual64 - reference64).item()
    norm = torch.linalg.vector_norm(reference64).item()
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def max_abs_diff(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return (actual.detach().to(torch.float64).cpu() - reference.detach().to(torch.float64).cpu()).abs().max().item()


@dataclass(frozen=True)
class Comparison:
    check: str
    dtype: str
    max_abs: float
    rel: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.rel <= self.tol


def compare(check: str, actual: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> Comparison:
    dtype = dtype or actual.dtype
    return Comparison(
        check=check,
        dtype=str(dtype).removeprefix("torch."),
        max_abs=max_abs_diff(actual, reference),
        rel=rel_error(actual, reference),
        tol=tolerance(check, dtype),
    )


def assert_close(check: str, actual: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> Comparison:
    result = compare(check, actual, reference, dtype)
    if not result.ok:
        raise AssertionError(
            f"{check} ({result.dtype}): relative error {result.rel:.3e} > tolerance {result.tol:.1e} "
            f"(max abs diff {result.max_abs:.3e})"
        )
    return result


@dataclass(frozen=True)
class TokenMismatch:
    """Where two generations first differ, and whether the device's token was plausible there."""

    position: int
    expected: int
    actual: int
    actual_in_reference_top5: bool | None


def first_mismatch(actual: Sequence[int], expected: Sequence[int]) -> int | None:
    """Index of the first differing token, the shorter length if one is a prefix, None if equal."""
    for index, (a, e) in enumerate(zip(actual, expected)):
        if a != e:
            return index
    if len(actual) != len(expected):
        return min(len(actual), len(expected))
    return None


def compare_tokens(
    actual: Sequence[int], expected: Sequence[int], reference_top5: Sequence[Sequence[int]] | None = None
) -> TokenMismatch | None:
    """None when the token sequences are equal; otherwise the first mismatch with its top-5 verdict.

    reference_top5[i] holds the reference's five most likely tokens at generated position i: a device
    token among them points to numerical drift between near-tied logits, one outside them to garbage.
    """
    position = first_mismatch(actual, expected)
    if position is None:
        return None
    expected_token = expected[position] if position < len(expected) else -1
    actual_token = actual[position] if position < len(actual) else -1
    in_top5 = None
    if reference_top5 is not None and position < len(reference_top5) and actual_token >= 0:
        in_top5 = actual_token in list(reference_top5[position])
    return TokenMismatch(position, int(expected_token), int(actual_token), in_top5)
