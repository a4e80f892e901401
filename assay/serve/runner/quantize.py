"""Weight-only quantization of a served model's linear layers (`assay serve --quantize int8`).

int8: each nn.Linear's weight [N, K] becomes int8 with one scale per output row (symmetric, max |w| / 127),
and its matmul runs through PyTorch's weight-only int8 kernel, torch._weight_int8pack_mm, with the
activations rounded to bfloat16 at its input and its output in bfloat16 (the kernel's fast path on a CPU with
AVX512-BF16 or AMX, and the dtype its CUDA kernel takes). A call of DEQUANTIZED_ROWS rows or more (a
prefill) multiplies by the dequantized weight in the input's dtype instead: there the matmul's arithmetic,
not the weight's bytes, sets the time. A decode step reads a quarter of float32's weight bytes. The output keeps
the layer's dtype, so the rest of the model (norms, attention, the KV cache, the logits) is unchanged.

Measured on SmolLM2-135M-Instruct (docs/serve.md, "Weight-only int8"): each layer's output differs from
float32 by about 1% (relative norm), the held-out next-token loss by well under 1%.

An embedding stays in the served dtype: a tied output head gets an int8 copy and the lookup keeps the
float table. A head that is not an nn.Linear (Gemma 3's soft-capped output) stays in the served dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.serve.runner.dtypes import check_quantize

# The dtype the int8 kernel's activations (and scales) are in: bfloat16 is the CPU kernel's vectorised path (its
# float32 path is a scalar loop, 5-30x slower at 8-32 rows, measured here) and what its CUDA kernel takes.
ACTIVATION_DTYPE = torch.bfloat16
INT8_MAX = 127
# From this many rows (a prefill's tokens) the layer multiplies by its dequantized weight in the input's dtype:
# the int8 kernel is 1.25-1.38x slower than float32's GEMM at 128-4,096 rows of SmolLM2's layers on 2 AVX-512
# cores, dequantize-then-GEMM 1.03-1.08x (docs/serve.md, "Weight-only int8"); at 16-32 rows the kernel is
# 0.78-1.0x of float32's GEMM and dequantizing costs more than it saves. Decode steps (up to 64 rows) keep
# the kernel. A 32 x 128-token prefill of SmolLM2 in int8: 8.05 s through the kernel, 6.42 s so (float32: 6.12 s).
DEQUANTIZED_ROWS = 128
# ... but only a weight of at most this many elements: a larger float copy is a fresh allocation on every call,
# whose page faults cost more than the kernel loses (SmolLM2's 49152 x 576 head at 128 rows, as a prompt's
# logprobs ask: 126 ms dequantized against the kernel's 68 ms).
DEQUANTIZED_MAX_ELEMENTS = 8 * 2**20


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], float32 scale [N]): symmetric, one scale per output row, max |w| / 127."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / INT8_MAX
    return torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8).contiguous(), scale


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (q * s)^T + b: q [N, K] int8, s [N] one scale per output row, x and x @ (q * s)^T rounded to bfloat16."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight_int8, scale = int8_rows(linear.weight)  # [N, K], [N]
        # Buffers, not parameters: nothing here trains, and the slot model's dtype cast leaves them alone.
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale.to(ACTIVATION_DTYPE))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N], x's dtype
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] >= DEQUANTIZED_ROWS and self.weight_int8.numel() <= DEQUANTIZED_MAX_ELEMENTS:  # a prefill
            return nn.functional.linear(x, self.dequantized().to(x.dtype), self.bias)
        y = torch._weight_int8pack_mm(rows.to(ACTIVATION_DTYPE), self.weight_int8, self.scale)
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:  # [N, K] float32: the weight the kernel multiplies by
        return self.weight_int8.float() * self.scale.float()[:, None]

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}, int8 weights, bfloat16 activations"


def quantize_linears(model: nn.Module, scheme: str) -> int:
    """Every nn.Linear inside `model` replaced, in place, by its `scheme` form; the number replaced.
    Before the first decode: a compiled step is traced with the modules it first sees."""
    check_quantize(scheme)
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8WeightOnlyLinear(child))
                replaced += 1
    if replaced == 0:
        raise AssayError(f"--quantize {scheme}: the model has no linear layer to quantize")
    return replaced


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, Int8WeightOnlyLinear) for module in model.modules())


def quantize_slot_model(slot_model, scheme: str, device: torch.device) -> None:
    """The slot model's linears in `scheme`, once (a slot model already quantized is left as it is)."""
    check_quantize(scheme)
    check_device(device)
    if not is_quantized(slot_model.model):
        quantize_linears(slot_model.model, scheme)


def check_device(device: torch.device) -> None:
    """One int8 matmul on `device`: a device without the kernel fails here with one line, before serving."""
    try:
        torch._weight_int8pack_mm(torch.ones(1, 32, dtype=ACTIVATION_DTYPE, device=device),
                                  torch.ones(8, 32, dtype=torch.int8, device=device), torch.ones(8, dtype=ACTIVATION_DTYPE, device=device))
    except (RuntimeError, NotImplementedError) as error:
        raise AssayError(f"--quantize int8: {device.type} has no weight-only int8 matmul (torch._weight_int8pack_mm: "
                         f"{str(error).splitlines()[0]})") from None
