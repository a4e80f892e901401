"""Causal attention as a custom operator (`assay::attention`), its backward operator, and the model
seam `layers.{i}.attention.sdpa`.

The operator works in the kernel layout [batch, heads, seq, head_dim] (as SDPA and the Triton kernel
take it); the model keeps [batch, seq, heads, head_dim], so `attention_bthd` transposes in and back.
Forward returns the output and the row log-sum-exp; backward is its own operator and recomputes the
probabilities from the saved log-sum-exp (nothing of size seq x seq is kept). Grouped-query attention
(fewer key/value heads) is native to both implementations: no repeated keys.

Implementations: "torch" (PyTorch's fused flash-attention kernels, `_scaled_dot_product_flash_attention_for_cpu`
and its backward: the kernels F.scaled_dot_product_attention itself runs on CPU, so float32 results are
identical to the model's CausalAttention; on another device, SDPA's math) and "triton" (CUDA;
triton_attention.py). Default scale head_dim ** -0.5, as the model's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from assay.kernels.registry import Case, Kernel, ShapeConstraint, check_constraints, select_impl
from assay.models.common.attention import CausalAttention

CONSTRAINTS = (
    ShapeConstraint(
        "q", -1, "the Triton kernel holds a head_dim row of each tile in registers", at_most=256,
        impls=("triton",), on_violation="fallback", fallback="torch",
    ),
)


def _like(tensor: torch.Tensor, layout_of: torch.Tensor) -> torch.Tensor:
    """tensor with the strides that torch.empty_like(layout_of) has (what the fake implementation promises)."""
    target = torch.empty_like(layout_of, dtype=tensor.dtype)
    if target.stride() == tensor.stride():
        return tensor
    return target.copy_(tensor)


def _has_cpu_flash(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _forward_torch(q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    if _has_cpu_flash(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
        return out, lse
    # Another device: the math, in float32 for the log-sum-exp.
    scores = (q.float() @ _expand_kv(k, q).float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = (torch.exp(scores - lse[..., None]) @ _expand_kv(v, q).float()).to(q.dtype)
    return out, lse


def _backward_torch(grad_out, q, k, v, out, lse) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _has_cpu_flash(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, True)
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    k_full, v_full = _expand_kv(k, q).float(), _expand_kv(v, q).float()
    scores = (q.float() @ k_full.transpose(-2, -1)) * scale
    causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    probs = torch.exp(scores.masked_fill(~causal, float("-inf")) - lse[..., None])
    grad = grad_out.float()
    grad_v = probs.transpose(-2, -1) @ grad
    grad_probs = grad @ v_full.transpose(-2, -1)
    grad_scores = probs * (grad_probs - (grad * out.float()).sum(-1, keepdim=True))
    grad_q = (grad_scores @ k_full) * scale
    grad_k = (grad_scores.transpose(-2, -1) @ q.float()) * scale
    fold = lambda t: t.unflatten(1, (k.shape[1], group)).sum(2)  # noqa: E731  sum over the heads sharing a key head
    return grad_q.to(q.dtype), fold(grad_k).to(k.dtype), fold(grad_v).to(v.dtype)


def _expand_kv(kv: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kv.repeat_interleave(q.shape[1] // kv.shape[1], dim=1)


def _impl(q, k, v) -> str:
    return select_impl(KERNEL, q.device, {"q": q, "k": k, "v": v})


# ---------------------------------------------------------------- the operators


@torch.library.custom_op("assay::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, T, D]; k, v: [B, Hkv, T, D] -> out [B, H, T, D] (laid out like q), lse [B, H, T] float32."""
    if _impl(q, k, v) == "triton":
        from assay.kernels import triton_attention

        out = torch.empty_like(q)
        lse = triton_attention.attention_forward(q, k, v, out)
        return out, lse
    out, lse = _forward_torch(q, k, v)
    return _like(out, q), lse.contiguous()


@attention_op.register_fake
def _(q, k, v):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("assay::attention_backward", mutates_args=())
def attention_backward_op(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k, v from the saved output and log-sum-exp."""
    if _impl(q, k, v) == "triton":
        from assay.kernels import triton_attention

        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        triton_attention.attention_backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v)
        return grad_q, grad_k, grad_v
    grad_q, grad_k, grad_v = _backward_torch(grad_out, q, k, v, out, lse)
    return _like(grad_q, q), _like(grad_k, k), _like(grad_v, v)


@attention_backward_op.register_fake
def _(grad_out, q, k, v, out, lse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    return attention_backward_op(grad_out, q, k, v, out, lse)


attention_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- layout wrapper, reference, module


def attention_bhtd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The operator in its own layout: q [B, H, T, D]; k, v [B, Hkv, T, D] -> [B, H, T, D]."""
    check_constraints(KERNEL, {"q": q, "k": k, "v": v}, impl=None)
    return attention_op(q, k, v)[0]


def attention_bthd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The model's layout: q [B, T, H, D]; k, v [B, T, Hkv, D] -> [B, T, H, D] (transposed in and back)."""
    return attention_bhtd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def attention_reference_bthd(q, k, v):
    """The model's CausalAttention (SDPA, causal, grouped-query)."""
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
    ).transpose(1, 2)


class KernelCausalAttention(CausalAttention):
    """Drop-in for CausalAttention at `layers.{i}.attention.sdpa`: same call, the custom operator inside."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] -> [B, T, Hq, D]
        return attention_bthd(q, k, v)

    @classmethod
    def from_module(cls, module: CausalAttention) -> "KernelCausalAttention":
        return cls()


# ---------------------------------------------------------------- what the check and the bench run


def make_inputs(case: Case, dtype: torch.dtype, generator: torch.Generator) -> dict:
    s = case.sizes
    shape_q = (s["batch"], s["seq"], s["heads"], s["head_dim"])
    shape_kv = (s["batch"], s["seq"], s["kv_heads"], s["head_dim"])
    return {
        "q": torch.randn(shape_q, generator=generator).to(dtype),
        "k": torch.randn(shape_kv, generator=generator).to(dtype),
        "v": torch.randn(shape_kv, generator=generator).to(dtype),
    }


KERNEL = Kernel(
    name="attention",
    summary="causal attention with grouped-query heads, [B,H,T,D] operator behind a [B,T,H,D] wrapper; backward op from saved log-sum-exp",
    target=CausalAttention,
    build=KernelCausalAttention.from_module,
    function=attention_bthd,
    reference=attention_reference_bthd,
    make_inputs=make_inputs,
    outputs=("out",),
    grad_inputs=("q", "k", "v"),
    cases=(
        Case("B2 T37 H4/2 D16", dict(batch=2, seq=37, heads=4, kv_heads=2, head_dim=16)),
        Case("B1 T64 H2/2 D32", dict(batch=1, seq=64, heads=2, kv_heads=2, head_dim=32)),
        Case("B1 T19 H3/1 D24", dict(batch=1, seq=19, heads=3, kv_heads=1, head_dim=24)),
    ),
    bench_cases=(
        Case("B2 T512 H8/4 D64", dict(batch=2, seq=512, heads=8, kv_heads=4, head_dim=64)),
        Case("B1 T1024 H4/2 D128", dict(batch=1, seq=1024, heads=4, kv_heads=2, head_dim=128)),
    ),
    constraints=CONSTRAINTS,
)
