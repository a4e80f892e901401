"""Rotary embedding as a custom operator (`assay::rope`), its backward operator, and the model seam.

The operator works in the kernel layout [batch, heads, seq, head_dim] (as the reference system's
rope_hf); the model keeps [batch, seq, heads, head_dim], so `rope_bthd` transposes in and back (views,
no copies: the operator reads and writes through strides). The float32 cos/sin cache is an input
that receives no gradient; backward is its own operator (`assay::rope_backward`) and reads the cache
that forward saved.

Implementations: "torch" (any device: x * cos plus the rotated term built from two half-row products,
no concatenation; the same products and sums as the model's rotate-half form, so float32 and bfloat16
results are identical to it) and "triton" (CUDA; triton_rope.py).
"""

from __future__ import annotations

import torch

from assay.kernels.registry import Case, Kernel, ShapeConstraint, check_constraints, select_impl
from assay.models.common.rope import RotaryEmbedding, rotary_cos_sin, rotate_half

CONSTRAINTS = (
    ShapeConstraint("q", -1, "rotate-half pairs channel i with channel i + head_dim/2", multiple_of=2),
    ShapeConstraint("cos", -1, "the cache holds one angle per channel, both halves", multiple_of=2),
)


# ---------------------------------------------------------------- the torch implementation


def _rotate_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    # x: [B, H, T, D]; cos, sin: [T, D] -> [B, H, T, D] laid out like x
    half = x.shape[-1] // 2
    # The reference multiplies in x's dtype (cache cast first); doing the same keeps bfloat16 equal too.
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    # x * cos over whole rows, then the rotated term (two half-row products into one buffer) added once:
    # three passes and two allocations where x*cos + rotate_half(x)*sin makes five of each. Negation is
    # exact, so each element is the same product-product-sum as the reference's.
    out = torch.mul(x, cos, out=torch.empty_like(x))  # laid out like x, as the fake implementation says
    rotated = torch.empty_like(x)
    if backward:
        # Autograd of x*cos + rotate_half(x)*sin: dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1.
        torch.mul(x2, sin[:, half:], out=rotated[..., :half])
        torch.mul(x1, -sin[:, :half], out=rotated[..., half:])
    else:
        torch.mul(x2, -sin[:, :half], out=rotated[..., :half])
        torch.mul(x1, sin[:, half:], out=rotated[..., half:])
    return out.add_(rotated)


def _impl(q, k, cos, sin) -> str:
    return select_impl(KERNEL, q.device, {"q": q, "k": k, "cos": cos, "sin": sin})


# ---------------------------------------------------------------- the operators


@torch.library.custom_op("assay::rope", mutates_args=())
def rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, Hq, T, D]; k: [B, Hkv, T, D]; cos, sin: [T, D] -> rotated q, k (kernel layout)."""
    if _impl(q, k, cos, sin) == "triton":
        from assay.kernels import triton_rope

        return triton_rope.rope_forward(q, k, cos.contiguous(), sin.contiguous())
    return _rotate_torch(q, cos, sin, backward=False), _rotate_torch(k, cos, sin, backward=False)


@rope_op.register_fake
def _(q, k, cos, sin):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("assay::rope_backward", mutates_args=())
def rope_backward_op(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation reversed, from the cache forward saved: gradients of q and k."""
    if _impl(grad_q, grad_k, cos, sin) == "triton":
        from assay.kernels import triton_rope

        return triton_rope.rope_backward(grad_q, grad_k, cos.contiguous(), sin.contiguous())
    return _rotate_torch(grad_q, cos, sin, backward=True), _rotate_torch(grad_k, cos, sin, backward=True)


@rope_backward_op.register_fake
def _(grad_q, grad_k, cos, sin):
    return torch.empty_like(grad_q), torch.empty_like(grad_k)


def _setup_context(ctx, inputs, output) -> None:
    _, _, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    grad_q_in, grad_k_in = rope_backward_op(grad_q, grad_k, cos, sin)
    return grad_q_in, grad_k_in, None, None  # the cache is derived from the spec: no gradient


rope_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- layout wrapper and module


def rope_bhtd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator in its own layout: q, k [B, H, T, D]; cos, sin [T, D] (float32 cache)."""
    return rope_op(q, k, cos, sin)


def rope_bthd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's layout: q [B, T, Hq, D], k [B, T, Hkv, D] -> rotated, same layout (transposed in and back)."""
    check_constraints(KERNEL, {"q": q, "k": k, "cos": cos, "sin": sin}, impl=None)
    q_rot, k_rot = rope_op(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q_rot.transpose(1, 2), k_rot.transpose(1, 2)


def rope_reference_bthd(q, k, cos, sin):
    """The model's own rotary (RotaryEmbedding.forward), the math the operator must equal."""
    cos = cos[None, :, None, :].to(q.dtype)
    sin = sin[None, :, None, :].to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_reference_bhtd(q, k, cos, sin):
    """The same math in the kernel layout [B, H, T, D] (as the reference system's rope_hf takes it)."""
    q_rot, k_rot = rope_reference_bthd(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q_rot.transpose(1, 2), k_rot.transpose(1, 2)


class KernelRotaryEmbedding(RotaryEmbedding):
    """Drop-in for RotaryEmbedding at `layers.{i}.attention.rope`: same call, the custom operator inside."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [T, D]
        return rope_bthd(q, k, cos, sin)

    @classmethod
    def from_module(cls, module: RotaryEmbedding) -> "KernelRotaryEmbedding":
        return cls()


# ---------------------------------------------------------------- what the check and the bench run


def make_inputs(case: Case, dtype: torch.dtype, generator: torch.Generator) -> dict:
    s = case.sizes
    q = torch.randn(s["batch"], s["seq"], s["heads"], s["head_dim"], generator=generator).to(dtype)
    k = torch.randn(s["batch"], s["seq"], s["kv_heads"], s["head_dim"], generator=generator).to(dtype)
    cos, sin = rotary_cos_sin(s["head_dim"], s["seq"], 1_000_000.0)
    return {"q": q, "k": k, "cos": cos, "sin": sin}


KERNEL = Kernel(
    name="rope",
    summary="rotary embedding, [B,H,T,D] operator behind a [B,T,H,D] wrapper; backward op reuses the saved cos/sin",
    target=RotaryEmbedding,
    build=KernelRotaryEmbedding.from_module,
    function=rope_bthd,
    reference=rope_reference_bthd,
    make_inputs=make_inputs,
    outputs=("q", "k"),
    grad_inputs=("q", "k"),
    no_grad_inputs=("cos", "sin"),
    cases=(
        Case("B2 T37 H4/2 D16", dict(batch=2, seq=37, heads=4, kv_heads=2, head_dim=16)),
        Case("B1 T128 H8/8 D64", dict(batch=1, seq=128, heads=8, kv_heads=8, head_dim=64)),
        Case("B3 T5 H3/1 D6", dict(batch=3, seq=5, heads=3, kv_heads=1, head_dim=6)),
    ),
    bench_cases=(
        Case("B2 T512 H16/8 D128", dict(batch=2, seq=512, heads=16, kv_heads=8, head_dim=128)),
        Case("B1 T2048 H8/2 D64", dict(batch=1, seq=2048, heads=8, kv_heads=2, head_dim=64)),
    ),
    constraints=CONSTRAINTS,
)
