"""The custom operators: registration (schema, fake, autograd), layouts, backward from saved tensors,
float32 equality with the model's own modules, and tracing under torch.compile without graph breaks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from assay.core import compiling
from assay.core.compiling import CompileStats, compile_fn, watch
from assay.kernels import attention, grouped_experts, rope
from assay.kernels.registry import Case, apply_kernels, get_kernel, select_impl
from assay.models.qwen3 import FLAVOURS, Qwen3
from assay.models.qwen3.model import CausalAttention, GroupedExperts, RotaryEmbedding

GEN = lambda seed=0: torch.Generator().manual_seed(seed)  # noqa: E731


class OpLog(TorchDispatchMode):
    """Names of the operators dispatched inside the block (the real dispatcher, nothing replaced)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def rope_inputs(batch=2, seq=11, heads=4, kv_heads=2, head_dim=8, dtype=torch.float32):
    sizes = dict(batch=batch, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    return rope.make_inputs(Case("t", sizes), dtype, GEN())


# ---------------------------------------------------------------- registration


def test_rope_operator_passes_opcheck():
    inputs = rope_inputs()
    q, k = (inputs[name].transpose(1, 2).requires_grad_() for name in ("q", "k"))
    torch.library.opcheck(rope.rope_op, (q, k, inputs["cos"], inputs["sin"]))


def test_attention_operator_passes_opcheck():
    inputs = attention.make_inputs(Case("t", dict(batch=2, seq=9, heads=4, kv_heads=2, head_dim=8)), torch.float32, GEN())
    torch.library.opcheck(attention.attention_op, tuple(inputs[n].transpose(1, 2).requires_grad_() for n in ("q", "k", "v")))


def test_grouped_experts_operator_passes_opcheck():
    inputs = grouped_experts.make_inputs(Case("t", dict(tokens=10, dim=16, hidden=8, experts=4, top_k=2)), torch.float32, GEN())
    for name in ("x", "w1", "w2", "w3", "top_k_weights"):
        inputs[name].requires_grad_()
    torch.library.opcheck(grouped_experts.grouped_experts_op, tuple(inputs[n] for n in ("x", "w1", "w2", "w3", "top_k_index", "top_k_weights")))


# ---------------------------------------------------------------- rope


def test_rope_in_kernel_layout_equals_reference_in_kernel_layout():
    inputs = rope_inputs()
    q, k = inputs["q"].transpose(1, 2).contiguous(), inputs["k"].transpose(1, 2).contiguous()  # [B, H, T, D]
    got = rope.rope_bhtd(q, k, inputs["cos"], inputs["sin"])
    expected = rope.rope_reference_bhtd(q, k, inputs["cos"], inputs["sin"])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_rope_in_model_layout_equals_the_model_rotary_and_keeps_the_layout():
    inputs = rope_inputs()
    got = rope.rope_bthd(inputs["q"], inputs["k"], inputs["cos"], inputs["sin"])
    expected = RotaryEmbedding()(inputs["q"], inputs["k"], inputs["cos"], inputs["sin"])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert got[0].shape == inputs["q"].shape and got[0].is_contiguous() and got[1].is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_gradients_equal_autograd_of_the_model_rotary(dtype):
    inputs = rope_inputs(seq=13, head_dim=6, dtype=dtype)
    q, k = inputs["q"].requires_grad_(), inputs["k"].requires_grad_()
    grads = [torch.randn(t.shape, generator=GEN(1)).to(dtype) for t in (q, k)]
    kernel_grads = torch.autograd.grad(rope.rope_bthd(q, k, inputs["cos"], inputs["sin"]), (q, k), grads)
    model_grads = torch.autograd.grad(RotaryEmbedding()(q, k, inputs["cos"], inputs["sin"]), (q, k), grads)
    assert all(torch.equal(a, b) for a, b in zip(kernel_grads, model_grads))


def test_rope_backward_is_its_own_operator_on_the_saved_cache_which_gets_no_gradient():
    inputs = rope_inputs()
    q, k = inputs["q"].requires_grad_(), inputs["k"].requires_grad_()
    cos, sin = inputs["cos"].requires_grad_(), inputs["sin"].requires_grad_()
    q_rot, k_rot = rope.rope_bthd(q, k, cos, sin)
    with OpLog() as log:
        (q_rot.sum() + k_rot.sum()).backward()
    assert log.names.count("assay.rope_backward.default") == 1
    assert "assay.rope.default" not in log.names  # nothing recomputed
    assert cos.grad is None and sin.grad is None
    assert q.grad is not None and k.grad is not None


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_equals_the_model_sdpa_forward_and_backward(dtype):
    inputs = attention.make_inputs(Case("t", dict(batch=2, seq=21, heads=6, kv_heads=2, head_dim=12)), dtype, GEN())
    q, k, v = (inputs[n].requires_grad_() for n in ("q", "k", "v"))
    grad = torch.randn(q.shape, generator=GEN(2)).to(dtype)
    out = attention.attention_bthd(q, k, v)
    expected = CausalAttention()(q, k, v)
    assert torch.equal(out, expected)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)))


def test_attention_kernel_layout_and_backward_from_saved_logsumexp():
    inputs = attention.make_inputs(Case("t", dict(batch=1, seq=10, heads=2, kv_heads=1, head_dim=8)), torch.float32, GEN())
    q, k, v = (inputs[n].transpose(1, 2).contiguous().requires_grad_() for n in ("q", "k", "v"))  # [B, H, T, D]
    out = attention.attention_bhtd(q, k, v)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    with OpLog() as log:
        out.sum().backward()
    assert log.names.count("assay.attention_backward.default") == 1 and "assay.attention.default" not in log.names
    assert k.grad.shape == k.shape


# ---------------------------------------------------------------- grouped experts


def experts_inputs(tokens=24, dim=64, hidden=32, experts=8, top_k=2, dtype=torch.float32):
    sizes = dict(tokens=tokens, dim=dim, hidden=hidden, experts=experts, top_k=top_k)
    return grouped_experts.make_inputs(Case("t", sizes), dtype, GEN())


def reference_experts(inputs) -> GroupedExperts:
    module = GroupedExperts(inputs["w1"].shape[0], inputs["x"].shape[1], inputs["w1"].shape[1])
    with torch.no_grad():
        for name in ("w1", "w2", "w3"):
            getattr(module, name).copy_(inputs[name])
    return module


def test_grouped_experts_equal_the_model_loop_in_float32_forward_and_backward():
    inputs = experts_inputs()
    assert select_impl(get_kernel("grouped_experts"), torch.device("cpu"), inputs) == "grouped_mm"
    module = reference_experts(inputs)
    kernel = grouped_experts.KernelGroupedExperts.from_module(module)
    x = inputs["x"].requires_grad_()
    weights = inputs["top_k_weights"].requires_grad_()
    grad = torch.randn(x.shape, generator=GEN(3))
    wrt = (x, weights, module.w1, module.w2, module.w3)
    out = kernel(x, inputs["top_k_index"], weights)
    expected = module(x, inputs["top_k_index"], weights)
    assert torch.equal(out, expected)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out, wrt, grad), torch.autograd.grad(expected, wrt, grad)))


def test_grouped_experts_loop_fallback_for_unaligned_sizes_matches_the_reference():
    from assay.core.numerics import assert_close

    inputs = experts_inputs(tokens=13, dim=33, hidden=17, experts=5)
    assert select_impl(get_kernel("grouped_experts"), torch.device("cpu"), inputs) == "loop"
    out = grouped_experts.grouped_experts(**inputs)
    as64 = {name: (t.double() if t.is_floating_point() else t) for name, t in inputs.items()}
    assert_close("kernel", out, grouped_experts.grouped_experts_reference(**as64), torch.float32)


def test_grouped_experts_with_an_expert_that_gets_no_token():
    inputs = experts_inputs(tokens=6, experts=8, top_k=1)
    inputs["top_k_index"] = torch.tensor([[0], [0], [3], [3], [3], [7]])
    w1 = inputs["w1"].requires_grad_()
    out = grouped_experts.grouped_experts(**inputs)
    assert torch.equal(out, grouped_experts.grouped_experts_reference(**inputs))
    (grad_w1,) = torch.autograd.grad(out.sum(), (w1,))
    assert grad_w1[[1, 2, 4, 5, 6]].abs().max() == 0 and grad_w1[0].abs().max() > 0


# ---------------------------------------------------------------- the model under torch.compile


def test_moe_model_with_kernels_compiles_to_one_graph_without_breaks_forward_and_backward():
    args = replace(FLAVOURS["tiny-moe"], max_seq_len=32)
    model, plain = Qwen3.build(args), Qwen3.build(args)
    apply_kernels(model, ["rope", "grouped_experts", "attention"])
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=GEN())
    compiling.reset()
    stats = CompileStats()
    compiled = compile_fn(model, "aot_eager", stats)
    with watch(stats):
        loss = F.cross_entropy(compiled(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
    assert (stats.graphs, stats.graph_breaks) == (1, 0), stats.as_dict()
    plain_loss = F.cross_entropy(plain(tokens).flatten(0, 1), tokens.flatten())
    plain_loss.backward()
    assert loss.item() == plain_loss.item()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_the_counter_sees_the_graph_break_of_the_reference_experts_loop():
    # The same count without kernels: the per-expert loop reads routing on the host and breaks the graph.
    args = replace(FLAVOURS["tiny-moe"], n_layers=1, max_seq_len=32)
    model = Qwen3.build(args)
    tokens = torch.randint(0, args.vocab_size, (1, 8), generator=GEN())
    compiling.reset()
    stats = CompileStats()
    with watch(stats):
        compile_fn(model, "aot_eager", stats)(tokens).sum().backward()
    assert stats.graph_breaks > 0 and stats.graphs > 1

