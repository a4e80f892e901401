"""What every Triton kernel in assay shares: output rounding, dtype codes, launch options.

Imported only where a Triton implementation runs (CUDA, or CPU under TRITON_INTERPRET=1); importing
it without Triton installed is an ImportError, which the registry never triggers.

Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before the first
`assay.kernels.triton_*` import of the process (the tests start a fresh interpreter for that).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Output dtype codes passed to kernels as a constexpr (a kernel is compiled once per code).
OUT_FLOAT32, OUT_BFLOAT16, OUT_FLOAT16 = 0, 1, 2
_OUT_CODES = {torch.float32: OUT_FLOAT32, torch.bfloat16: OUT_BFLOAT16, torch.float16: OUT_FLOAT16}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def out_code(dtype: torch.dtype) -> int:
    try:
        return _OUT_CODES[dtype]
    except KeyError:
        raise TypeError(f"the Triton kernels take float32, bfloat16 or float16 tensors, not {dtype}") from None


def launch_options() -> dict:
    """No fused multiply-add: the elementwise kernels then round each product and sum as PyTorch does,
    so float32 results equal the eager reference bit for bit (the interpreter takes no such option)."""
    return {} if interpreting() else {"enable_fp_fusion": False}


@triton.jit
def round_to_output(x, OUT_DTYPE: tl.constexpr):
    """float32 -> the output dtype, rounding to nearest even.

    bfloat16 is rounded with integer arithmetic, which gives the same bits on a GPU and in Triton's
    interpreter (whose own float32 -> bfloat16 cast truncates). NaN payloads are not preserved.
    """
    if OUT_DTYPE == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif OUT_DTYPE == 2:
        return x.to(tl.float16)
    else:
        return x
