"""The `gla_chunk` kernel: the native GLA's recurrence as one custom operator, swapped in by the registry."""

from __future__ import annotations

from dataclasses import replace

import torch

from assay.kernels.check import check_kernels
from assay.kernels.gla_op import KernelGLAOperator
from assay.kernels.registry import KERNELS, apply_kernels, get_kernel
from assay.models.gla import FLAVOURS, GLA
from assay.models.gla.model import GLAOperator


def tiny_gla():
    return GLA.build(replace(FLAVOURS["tiny"], chunk_size=32), seed=0, std=0.2)


def logits_and_grads(model, tokens):
    logits = model(tokens)
    logits.pow(2).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


def test_gla_chunk_is_one_registry_entry_replacing_each_layers_operator():
    assert KERNELS["gla_chunk"] == "assay.kernels.gla_op:KERNEL"
    model = tiny_gla()
    replacements = apply_kernels(model, ["gla_chunk"])
    assert [r.module for r in replacements] == ["layers.0.attention.gla", "layers.1.attention.gla"]
    assert all((r.old_class, r.new_class) == ("GLAOperator", "KernelGLAOperator") for r in replacements)
    assert all(type(block.attention.gla) is KernelGLAOperator and block.attention.gla.chunk_size == 32 for block in model.layers)


def test_replaced_model_has_the_same_logits_and_gradients():
    tokens = torch.randint(0, 1024, (2, 70), generator=torch.Generator().manual_seed(0))
    reference_logits, reference_grads = logits_and_grads(tiny_gla(), tokens)
    model = tiny_gla()
    apply_kernels(model, ["gla_chunk"], pattern="layers.1.*")
    assert type(model.layers[0].attention.gla) is GLAOperator  # the pattern kept layer 0 as it was
    logits, grads = logits_and_grads(model, tokens)
    # The operator runs the same gla_chunk forward, and its backward differentiates that same forward.
    assert torch.equal(logits, reference_logits)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-6, atol=1e-9)


def test_prefill_and_decode_work_through_the_operator():
    model = tiny_gla().eval()
    tokens = torch.randint(0, 1024, (2, 30), generator=torch.Generator().manual_seed(1))
    expected = model.generate(tokens, 8)
    apply_kernels(model, ["gla_chunk"])
    assert torch.equal(model.generate(tokens, 8), expected)


def test_compiled_model_sees_one_operator_per_layer_and_matches_eager():
    model = tiny_gla()
    apply_kernels(model, ["gla_chunk"])
    tokens = torch.randint(0, 1024, (2, 70), generator=torch.Generator().manual_seed(2))
    eager_logits, eager_grads = logits_and_grads(model, tokens)
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.backends.debugging.aot_eager(graph_module, example_inputs)

    compiled = torch.compile(model, backend=counting_backend, fullgraph=True)
    compiled_logits, compiled_grads = logits_and_grads(compiled, tokens)
    assert len(graphs) == 1
    operators = [node for node in graphs[0].graph.nodes if node.target is torch.ops.assay.gla_chunk.default]
    assert len(operators) == 2  # the chunk loop is inside the operator, not unrolled into the graph
    torch.testing.assert_close(compiled_logits, eager_logits, rtol=1e-5, atol=1e-6)
    for name, grad in compiled_grads.items():
        torch.testing.assert_close(grad, eager_grads[name.removeprefix("_orig_mod.")], rtol=1e-5, atol=1e-7)


def test_check_passes_against_the_step_by_step_recurrence():
    report = check_kernels(["gla_chunk"])
    assert report.ok, report.failures
    assert {row.tensor for row in report.rows} == {"out o", "out state"} | {f"grad {n}" for n in ("q", "k", "v", "g", "initial_state")}
    assert {row.dtype for row in report.rows} == {"float32", "bfloat16"} and len({row.case for row in report.rows}) == 3
    assert get_kernel("gla_chunk").target is GLAOperator
