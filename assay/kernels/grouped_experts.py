"""Mixture-of-experts experts as one custom operator (`assay::grouped_experts`), its backward operator,
and the model seam `layers.{i}.moe.experts`.

Forward: the (token, slot) pairs are sorted by expert (a stable sort, so within an expert tokens keep
their order), the tokens gathered once, and each of the three projections is one grouped matrix
multiply over the expert groups; outputs are weighted and summed back per token with one index_add.
Backward is its own operator and reads what forward saved: the sort, the group offsets and the two
projections before the activation (h1, h3); it recomputes silu(h1) * h3 and the down projection
instead of keeping them.

Grouped multiplies, per implementation:
  "grouped_mm"  torch._grouped_mm: on CPU in torch 2.13 it takes float32, bfloat16 and float16 with
                rows of a multiple of 16 bytes, forward and backward, and gives the same bits as
                F.linear per expert (measured here); not float64.
  "loop"        one matmul per expert over its contiguous rows (any dtype, any size).
  "triton"      triton_grouped_mm.py (CUDA).
The routing (softmax and top-k in float32, optional renormalisation) stays in the model's MoE; the
weights arrive in x's dtype, as the model passes them.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from assay.kernels.registry import Case, Kernel, ShapeConstraint, select_impl
from assay.models.common.feed_forward import GroupedExperts, grouped_mm_runs

_ALIGN = "torch._grouped_mm reads rows of a multiple of 16 bytes"
CONSTRAINTS = (
    ShapeConstraint("x", -1, _ALIGN, multiple_of_bytes=16, impls=("grouped_mm",), on_violation="fallback", fallback="loop"),
    ShapeConstraint("w1", 1, _ALIGN, multiple_of_bytes=16, impls=("grouped_mm",), on_violation="fallback", fallback="loop"),
)


# ---------------------------------------------------------------- grouped multiplies per implementation


def _refine_impl(impl: str, tensors) -> str:
    x = tensors["x"]
    if impl == "grouped_mm" and not grouped_mm_runs(x.device.type, x.dtype):
        return "loop"
    return impl


def _bounds(offsets: torch.Tensor) -> list[tuple[int, int]]:
    ends = offsets.tolist()  # one host sync: the loop needs the group sizes
    return list(zip([0] + ends[:-1], ends))


def _mm_by_group(impl: str, a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, transpose: bool) -> torch.Tensor:
    """a: [M, K] rows sorted by group -> [M, N]: group e times w[e].T (transpose=True, an nn.Linear
    weight [E, N, K]: the forward projections) or times w[e] ([E, K, N]: gradients of the inputs)."""
    b = w.transpose(1, 2) if transpose else w
    if impl == "triton":
        from assay.kernels import triton_grouped_mm

        return triton_grouped_mm.grouped_mm(a, b, offsets)
    if impl == "grouped_mm":
        return torch._grouped_mm(a, b, offs=offsets)
    out = a.new_empty(a.shape[0], b.shape[-1])
    for expert, (start, end) in enumerate(_bounds(offsets)):
        # The calls the per-expert reference makes (F.linear forward, mm in its backward): the same bits.
        rows = a[start:end]
        out[start:end] = F.linear(rows, w[expert]) if transpose else torch.mm(rows, w[expert])
    return out


def _weight_grad_by_group(impl: str, g: torch.Tensor, a: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """g: [M, P], a: [M, Q], rows sorted by group -> [E, P, Q], g_e^T a_e (zero for an empty group)."""
    if impl == "triton":
        from assay.kernels import triton_grouped_mm

        return triton_grouped_mm.grouped_mm_weight(g, a, offsets)
    if impl == "grouped_mm":
        return torch._grouped_mm(g.t(), a, offs=offsets)
    out = g.new_zeros(offsets.shape[0], g.shape[1], a.shape[1])
    for expert, (start, end) in enumerate(_bounds(offsets)):
        if end > start:
            out[expert] = torch.mm(g[start:end].t(), a[start:end])
    return out


def _sort_by_expert(top_k_index: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """order: (token, slot) pair ids sorted by expert, stable; offsets: [E] int32 group ends."""
    flat = top_k_index.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    return order, torch.cumsum(counts, 0).to(torch.int32)


def _impl(x, w1, w2, w3) -> str:
    return select_impl(KERNEL, x.device, {"x": x, "w1": w1, "w2": w2, "w3": w3})


# ---------------------------------------------------------------- the operators


@torch.library.custom_op("assay::grouped_experts", mutates_args=())
def grouped_experts_op(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: [N, dim]; w1, w3: [E, hidden, dim]; w2: [E, dim, hidden]; top_k_index, top_k_weights: [N, k]
    -> out [N, dim], and for backward: h1, h3 [N*k, hidden], order [N*k], offsets [E]."""
    impl = _impl(x, w1, w2, w3)
    top_k = top_k_index.shape[1]
    order, offsets = _sort_by_expert(top_k_index, w1.shape[0])
    token_ids = order // top_k
    x_sorted = x[token_ids]
    h1 = _mm_by_group(impl, x_sorted, w1, offsets, transpose=True)
    h3 = _mm_by_group(impl, x_sorted, w3, offsets, transpose=True)
    down = _mm_by_group(impl, F.silu(h1) * h3, w2, offsets, transpose=True)
    weighted = down * top_k_weights.flatten()[order, None]
    out = torch.zeros_like(x).index_add_(0, token_ids, weighted)
    return out, h1, h3, order, offsets


@grouped_experts_op.register_fake
def _(x, w1, w2, w3, top_k_index, top_k_weights):
    pairs = top_k_index.numel()
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty(pairs, w1.shape[1]),
        x.new_empty(pairs, w1.shape[1]),
        top_k_index.new_empty(pairs, dtype=torch.int64),
        top_k_index.new_empty(w1.shape[0], dtype=torch.int32),
    )


@torch.library.custom_op("assay::grouped_experts_backward", mutates_args=())
def grouped_experts_backward_op(
    grad_out: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, top_k_weights: torch.Tensor,
    h1: torch.Tensor, h3: torch.Tensor, order: torch.Tensor, offsets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of x, w1, w2, w3 and top_k_weights, in the order and association PyTorch autograd
    uses for the per-expert loop (so float32 results match it where the sums have two terms)."""
    impl = _impl(x, w1, w2, w3)
    top_k = top_k_weights.shape[1]
    token_ids = order // top_k
    grad_sorted = grad_out[token_ids]
    silu_h1 = F.silu(h1)
    hidden = silu_h1 * h3
    down = _mm_by_group(impl, hidden, w2, offsets, transpose=True)
    grad_weights_sorted = (grad_sorted * down).sum(-1)
    grad_down = grad_sorted * top_k_weights.flatten()[order, None]
    grad_hidden = _mm_by_group(impl, grad_down, w2, offsets, transpose=False)
    grad_w2 = _weight_grad_by_group(impl, grad_down, hidden, offsets)
    grad_h3 = grad_hidden * silu_h1
    grad_h1 = torch.ops.aten.silu_backward(grad_hidden * h3, h1)
    x_sorted = x[token_ids]
    grad_w1 = _weight_grad_by_group(impl, grad_h1, x_sorted, offsets)
    grad_w3 = _weight_grad_by_group(impl, grad_h3, x_sorted, offsets)
    grad_x_sorted = _mm_by_group(impl, grad_h1, w1, offsets, transpose=False) + _mm_by_group(impl, grad_h3, w3, offsets, transpose=False)
    grad_x = torch.zeros_like(x).index_add_(0, token_ids, grad_x_sorted)
    grad_weights = torch.empty_like(grad_weights_sorted).index_copy_(0, order, grad_weights_sorted).view_as(top_k_weights)
    return grad_x, grad_w1, grad_w2, grad_w3, grad_weights.to(top_k_weights.dtype)


@grouped_experts_backward_op.register_fake
def _(grad_out, x, w1, w2, w3, top_k_weights, h1, h3, order, offsets):
    contiguous = torch.contiguous_format
    return (
        torch.empty_like(x, memory_format=contiguous),
        torch.empty_like(w1, memory_format=contiguous),
        torch.empty_like(w2, memory_format=contiguous),
        torch.empty_like(w3, memory_format=contiguous),
        torch.empty_like(top_k_weights, memory_format=contiguous),
    )


def _setup_context(ctx, inputs, output) -> None:
    x, w1, w2, w3, _, top_k_weights = inputs
    _, h1, h3, order, offsets = output
    ctx.save_for_backward(x, w1, w2, w3, top_k_weights, h1, h3, order, offsets)


def _backward(ctx, grad_out, _grad_h1, _grad_h3, _grad_order, _grad_offsets):
    x, w1, w2, w3, top_k_weights, h1, h3, order, offsets = ctx.saved_tensors
    grad_x, grad_w1, grad_w2, grad_w3, grad_weights = grouped_experts_backward_op(
        grad_out.contiguous(), x, w1, w2, w3, top_k_weights, h1, h3, order, offsets
    )
    return grad_x, grad_w1, grad_w2, grad_w3, None, grad_weights


grouped_experts_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- functional form, reference and module


def grouped_experts(x, w1, w2, w3, top_k_index, top_k_weights) -> torch.Tensor:
    """x: [N, dim]; top_k_index, top_k_weights: [N, top_k] -> [N, dim] (the GroupedExperts call)."""
    return grouped_experts_op(x, w1, w2, w3, top_k_index, top_k_weights)[0]


def grouped_experts_reference(x, w1, w2, w3, top_k_index, top_k_weights) -> torch.Tensor:
    """The model's per-expert loop (GroupedExperts.forward) with the given weights."""
    return _reference_module(w1, w2, w3)(x, top_k_index, top_k_weights)


def _reference_module(w1, w2, w3) -> GroupedExperts:
    module = GroupedExperts.__new__(GroupedExperts)
    torch.nn.Module.__init__(module)
    module.n_experts = w1.shape[0]
    module.use_grouped_mm = False  # the per-expert loop: what the kernel is checked against
    # Plain tensors, not Parameters: the caller's tensors (and their autograd graph) are used as they are.
    module.__dict__.update(w1=w1, w2=w2, w3=w3)
    return module


class KernelGroupedExperts(GroupedExperts):
    """Drop-in for GroupedExperts at `layers.{i}.moe.experts`: the same Parameters (state-dict keys
    w1/w2/w3 unchanged, optimizer references still valid), the custom operator inside."""

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # x: [N, dim]; top_k_index, top_k_weights: [N, top_k] -> [N, dim]
        return grouped_experts(x, self.w1, self.w2, self.w3, top_k_index, top_k_weights)

    @classmethod
    def from_module(cls, module: GroupedExperts) -> "KernelGroupedExperts":
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.n_experts = module.n_experts
        new.w1, new.w2, new.w3 = module.w1, module.w2, module.w3
        return new


# ---------------------------------------------------------------- what the check and the bench run


def route_top_k(router_logits: torch.Tensor, top_k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's routing: softmax in float32, top-k, optional renormalisation -> (index, float32 weights)."""
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, index = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return index, weights


def make_inputs(case: Case, dtype: torch.dtype, generator: torch.Generator) -> dict:
    s = case.sizes
    tokens, dim, hidden, experts = s["tokens"], s["dim"], s["hidden"], s["experts"]
    x = torch.randn(tokens, dim, generator=generator)
    # Weights of about unit output scale, so the check's relative errors are not dominated by tiny values.
    w1 = torch.randn(experts, hidden, dim, generator=generator) * dim**-0.5
    w3 = torch.randn(experts, hidden, dim, generator=generator) * dim**-0.5
    w2 = torch.randn(experts, dim, hidden, generator=generator) * hidden**-0.5
    index, weights = route_top_k(torch.randn(tokens, experts, generator=generator) * 2.0, s["top_k"])
    return {"x": x.to(dtype), "w1": w1.to(dtype), "w2": w2.to(dtype), "w3": w3.to(dtype), "top_k_index": index, "top_k_weights": weights.to(dtype)}


KERNEL = Kernel(
    name="grouped_experts",
    summary="MoE experts: tokens sorted by expert, grouped matmuls (torch._grouped_mm / loop / Triton), backward op",
    target=GroupedExperts,
    build=KernelGroupedExperts.from_module,
    function=grouped_experts,
    reference=grouped_experts_reference,
    make_inputs=make_inputs,
    outputs=("out",),
    grad_inputs=("x", "w1", "w2", "w3", "top_k_weights"),
    cases=(
        Case("N24 d64 h32 E8 k2", dict(tokens=24, dim=64, hidden=32, experts=8, top_k=2)),
        Case("N64 d64 h32 E16 k4", dict(tokens=64, dim=64, hidden=32, experts=16, top_k=4)),
        Case("N13 d33 h17 E5 k2", dict(tokens=13, dim=33, hidden=17, experts=5, top_k=2)),
    ),
    bench_cases=(
        Case("N1024 d256 h128 E64 k4", dict(tokens=1024, dim=256, hidden=128, experts=64, top_k=4)),
        Case("N512 d512 h256 E8 k2", dict(tokens=512, dim=512, hidden=256, experts=8, top_k=2)),
    ),
    constraints=CONSTRAINTS,
    impls=("grouped_mm", "loop", "triton"),
    refine_impl=_refine_impl,
)
