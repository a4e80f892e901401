"""What every Triton kernel in assay shares: output rounding, dtype codes, launch options.

Imported only where a Triton implementation runs (CUDA, or CPU under TRITON_INTERPRET=1); importing
it without Triton installed is an ImportError, which the registry never triggers.

Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before the first
`assay.kernels.triton_*` import of the process (the tests start a fresh interpreter for that).
"""

from __future__ import annotations

import contextlib
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


# How tl.dot multiplies, passed as a constexpr: half-precision operands natively (tensor cores, float32
# accumulation); float32 operands in full precision ("ieee", not TF32, whose 10-bit mantissa would
# miss the float32 tolerance); or half-precision operands widened to float32 first, which is exact
# (a bfloat16 x bfloat16 product fits float32) and is what the interpreter needs: its dot multiplies
# the raw 16-bit integers that hold bfloat16 values.
DOT_NATIVE, DOT_IEEE, DOT_WIDEN = 0, 1, 2


def dot_mode(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return DOT_IEEE
    return DOT_WIDEN if interpreting() else DOT_NATIVE


def device_guard(tensor: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the current device; a rank may hold another)."""
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def launch_options() -> dict:
    """No fused multiply-add: the elementwise kernels then round each product and sum as PyTorch does,
    so float32 results equal the eager reference bit for bit (the interpreter takes no such option)."""
    return {} if interpreting() else {"enable_fp_fusion": False}


@triton.jit
def dot(a, b, acc, DOT_MODE: tl.constexpr):
    """acc + a @ b in float32, as DOT_MODE says (see dot_mode)."""
    if DOT_MODE == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif DOT_MODE == 1:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


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
