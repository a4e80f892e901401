"""Chunked gated linear attention as a custom operator (`assay::gla_chunk`), and the model seam.

The model's GLAOperator calls `assay.ops.gla_chunk`, plain PyTorch that a compiler traces op by op:
a Python loop over chunks and sub-chunks becomes a graph as long as the sequence, compiled again
for every new length. The operator here is one node in the graph instead (its fake implementation
gives shapes only), and its backward recomputes the forward from the saved inputs (as flash
attention does) rather than keeping the per-chunk [C, C] score tensors alive between forward and
backward: less activation memory, one more forward of the recurrence per step.

Implementations: "torch" (any device: assay.kernels.gla.gla_chunk forward; backward its
vector-Jacobian product through torch.func, which runs gla_chunk's own written-out backward).
A device kernel (Triton, NKI) plugs in as another impl.
Checked against the step-by-step reference `gla_recurrent` (registry: `assay kernels check`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from assay.kernels.gla import gla_chunk, gla_recurrent
from assay.kernels.registry import Case, Kernel, select_impl
from assay.models.common.linear_attention import GLAOperator


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(torch.float32, dtype)


def _impl(q, k, v, g, initial_state) -> str:
    return select_impl(KERNEL, q.device, {"q": q, "k": k, "v": v, "g": g, "initial_state": initial_state})


# ---------------------------------------------------------------- the operators


@torch.library.custom_op("assay::gla_chunk", mutates_args=())
def gla_chunk_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, initial_state: torch.Tensor, scale: float, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] -> o [B, T, H, V], final state."""
    _impl(q, k, v, g, initial_state)
    o, state = gla_chunk(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=True, chunk_size=chunk_size)
    # Contiguous, as the fake implementation says: a compiled graph views its outputs by those strides.
    return o.contiguous(), state.contiguous()


@gla_chunk_op.register_fake
def _(q, k, v, g, initial_state, scale, chunk_size):
    batch, time, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    o = q.new_empty(batch, time, heads, value_dim)
    state = q.new_empty(batch, heads, key_dim, value_dim, dtype=_accumulation_dtype(q.dtype))
    return o, state


@torch.library.custom_op("assay::gla_chunk_backward", mutates_args=())
def gla_chunk_backward_op(
    grad_o: torch.Tensor, grad_state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
    initial_state: torch.Tensor, scale: float, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k, v, g and initial_state, the forward recomputed from the inputs."""

    def forward(q, k, v, g, initial_state):
        return gla_chunk(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=True, chunk_size=chunk_size)

    # torch.func, not torch.autograd: inside an operator autograd is below the dispatcher and records nothing.
    _, vjp = torch.func.vjp(forward, q, k, v, g, initial_state)
    return tuple(grad.contiguous() for grad in vjp((grad_o, grad_state)))


@gla_chunk_backward_op.register_fake
def _(grad_o, grad_state, q, k, v, g, initial_state, scale, chunk_size):
    return tuple(x.new_empty(x.shape) for x in (q, k, v, g, initial_state))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, initial_state, scale, chunk_size = inputs
    ctx.save_for_backward(q, k, v, g, initial_state)
    ctx.scale, ctx.chunk_size = scale, chunk_size


def _backward(ctx, grad_o, grad_state):
    q, k, v, g, initial_state = ctx.saved_tensors
    grads = gla_chunk_backward_op(grad_o.contiguous(), grad_state.contiguous(), q, k, v, g, initial_state, ctx.scale, ctx.chunk_size)
    return (*grads, None, None)


gla_chunk_op.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- functional form and module


def gla_chunk_kernel(q, k, v, g, initial_state=None, chunk_size=64, scale=None):
    """(o, final_state) as gla_chunk(..., output_final_state=True), through the operator; same shapes."""
    batch, _, heads, key_dim = q.shape
    scale = key_dim**-0.5 if scale is None else float(scale)
    if initial_state is None:
        initial_state = q.new_zeros(batch, heads, key_dim, v.shape[-1], dtype=_accumulation_dtype(q.dtype))
    return gla_chunk_op(q, k, v, g, initial_state, scale, chunk_size)


def gla_recurrent_reference(q, k, v, g, initial_state=None, chunk_size=64, scale=None):
    """The step-by-step recurrence the operator must equal (chunk_size has no meaning for it)."""
    return gla_recurrent(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=True)


class KernelGLAOperator(GLAOperator):
    """Drop-in for GLAOperator at `layers.{i}.attention.gla`: the same calls, the operator inside."""

    def forward(self, q, k, v, g, initial_state=None, output_final_state=False):
        # q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] -> o [B, T, H, V], state or None
        o, state = gla_chunk_kernel(q, k, v, g, initial_state, self.chunk_size)
        return o, (state if output_final_state else None)

    @classmethod
    def from_module(cls, module: GLAOperator) -> KernelGLAOperator:
        return cls(module.chunk_size)


# ---------------------------------------------------------------- what the check and the bench run


def make_inputs(case: Case, dtype: torch.dtype, generator: torch.Generator) -> dict:
    s = case.sizes
    shape_k = (s["batch"], s["seq"], s["heads"], s["key_dim"])

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    # The model's gate: logsigmoid of a projection over a normaliser (16 in the GLA design; 1 gives fast decay).
    g = F.logsigmoid(randn(*shape_k)) / s.get("normalizer", 16)
    inputs = {
        "q": randn(*shape_k), "k": randn(*shape_k), "v": randn(s["batch"], s["seq"], s["heads"], s["value_dim"]), "g": g,
        "initial_state": randn(s["batch"], s["heads"], s["key_dim"], s["value_dim"]),
    }
    return {name: tensor.to(dtype) for name, tensor in inputs.items()} | {"chunk_size": s.get("chunk", 64)}


KERNEL = Kernel(
    name="gla_chunk",
    summary="chunked gated linear attention as one operator (assay::gla_chunk); backward recomputes the forward",
    target=GLAOperator,
    build=KernelGLAOperator.from_module,
    function=gla_chunk_kernel,
    reference=gla_recurrent_reference,
    make_inputs=make_inputs,
    outputs=("o", "state"),
    grad_inputs=("q", "k", "v", "g", "initial_state"),
    cases=(
        Case("B2 T37 H2 K16 V32", dict(batch=2, seq=37, heads=2, key_dim=16, value_dim=32)),
        Case("B1 T130 H4 K8 V16 C32 fast-decay", dict(batch=1, seq=130, heads=4, key_dim=8, value_dim=16, chunk=32, normalizer=1)),
        Case("B3 T5 H3 K6 V10 C16", dict(batch=3, seq=5, heads=3, key_dim=6, value_dim=10, chunk=16)),
    ),
    bench_cases=(
        Case("B2 T512 H4 K64 V128 C64", dict(batch=2, seq=512, heads=4, key_dim=64, value_dim=128)),
        Case("B1 T2048 H4 K64 V128 C128", dict(batch=1, seq=2048, heads=4, key_dim=64, value_dim=128, chunk=128)),
    ),
    impls=("torch",),
    device_impls={},
)
