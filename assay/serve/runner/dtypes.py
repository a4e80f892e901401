"""The dtypes a slot pool and the served weights may be held in, by name (no torch: `assay serve` checks its
flags before importing it)."""

from __future__ import annotations

from assay.core.dtypes import dtype_name
from assay.core.errors import AssayError

STATE_DTYPES = ("float32", "bfloat16")  # what a slot pool stores (aliases bf16, fp32 accepted)
WEIGHT_DTYPES = ("float32", "bfloat16")  # what the served model's weights are held in (--dtype)
QUANTIZATIONS = ("int8",)  # what the linear layers' weights may be quantized to (--quantize; serve/runner/quantize.py)


def check_state_dtype(name: str) -> str:
    """The canonical name of a slot pool's dtype (an alias resolved), or AssayError."""
    canonical = dtype_name(name, STATE_DTYPES)
    if canonical is None:
        raise AssayError(f"state dtype {name!r}: expected float32 or bfloat16")
    return canonical


def check_weight_dtype(name: str) -> str:
    """The canonical name of the weights' dtype (--dtype), or AssayError."""
    canonical = dtype_name(name, WEIGHT_DTYPES)
    if canonical is None:
        raise AssayError(f"--dtype {name!r}: expected float32 or bfloat16")
    return canonical


def check_quantize(name: str | None) -> None:
    """None (no quantization) or one of QUANTIZATIONS, else AssayError."""
    if name is not None and name not in QUANTIZATIONS:
        raise AssayError(f"--quantize {name!r}: expected one of {', '.join(QUANTIZATIONS)}")
