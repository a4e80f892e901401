"""Real torch.compile backends that miscompile on purpose, for probe tests.

Each compiles the FX graph dynamo hands it (AOT eager) and then breaks what it returns in one
well-defined way, as a faulty vendor compiler would.
"""

from __future__ import annotations

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd

VOCAB = 1024


def _is_logits(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 3 and value.shape[-1] == VOCAB


def _wrap_outputs(edit):
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        def run(*args):
            outputs = gm(*args)
            return type(outputs)(edit(o) if _is_logits(o) else o for o in outputs)

        return run

    return compiler


def _negate(logits):  # argmax becomes argmin: the device's token is far outside the reference's top-5
    return -logits


def _swap_top_two(logits):  # the runner-up wins: a plausible token, as numerical drift would give
    top2 = logits.topk(2, dim=-1).indices
    swapped = logits.clone()
    first, second = top2[..., :1], top2[..., 1:2]
    swapped.scatter_(-1, first, logits.gather(-1, second))
    swapped.scatter_(-1, second, logits.gather(-1, first))
    return swapped


register_backend(name="test_garbage_logits", compiler_fn=aot_autograd(fw_compiler=_wrap_outputs(_negate)))
register_backend(name="test_drifting_logits", compiler_fn=aot_autograd(fw_compiler=_wrap_outputs(_swap_top_two)))


@register_backend
def test_compiler_crash(gm, example_inputs):
    raise RuntimeError("vendor compiler: unsupported operator in graph")


@register_backend
def test_runtime_crash(gm, example_inputs):
    def run(*args):
        raise RuntimeError("device runtime: kernel launch failed")

    return run


@register_backend
def test_hang(gm, example_inputs):
    import time

    while True:  # a compiler that never returns
        time.sleep(1)


@register_backend
def test_segfault(gm, example_inputs):
    import ctypes

    ctypes.string_at(0)  # a compiler that dereferences NULL


@register_backend
def test_memory_hog(gm, example_inputs):
    hoard = []
    while True:  # a compiler that allocates until the process limit stops it
        hoard.append(bytearray(64 * 2**20))


# Operator-level faults, for `assay triage` (docs/triage.md): the minifier must shrink a model's graph to
# the one operator these break. Both see the ATen graph AOT autograd hands the forward compiler.
aten = torch.ops.aten


def _refuse(op):
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        if any(node.target is op for node in gm.graph.nodes):
            raise NotImplementedError(f"vendor compiler: no kernel for {op}")
        return gm

    return compiler


def _scale_output(op, factor: float):
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        for node in list(gm.graph.nodes):
            if node.target is op:
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(aten.mul.Tensor, (node, factor))
                node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
        gm.recompile()
        return gm

    return compiler


# Fails on aten.rsqrt (every RMSNorm has one), compiles everything else.
register_backend(name="test_no_rsqrt", compiler_fn=aot_autograd(fw_compiler=_refuse(aten.rsqrt.default)))
# aten.silu's output off by a factor (the MLP activation of Llama-style models): tokens flip.
register_backend(name="test_wrong_silu", compiler_fn=aot_autograd(fw_compiler=_scale_output(aten.silu.default, 3.0)))
# The same fault, small: tokens still equal the reference's, only the logit drift shows it.
register_backend(name="test_nudged_silu", compiler_fn=aot_autograd(fw_compiler=_scale_output(aten.silu.default, 1.01)))


def _scale_logits(factor: float):
    """Scale the output of one matmul, the LM head's (the aten.mm whose result has a column per vocabulary
    entry): a kernel computing one op at the wrong scale. Greedy tokens survive (the argmax of 2x logits is
    the argmax), but every log-probability sharpens, which reorders a multiple-choice task's answers."""
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        for node in list(gm.graph.nodes):
            value = node.meta.get("val")
            if node.target is aten.mm.default and value is not None and value.shape[-1] == VOCAB:
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(aten.mul.Tensor, (node, factor))
                node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
        gm.recompile()
        return gm

    return compiler


# The LM head's matmul at twice its value (docs/dataset.md, "The eval"): tokens pass, the eval's answers do not.
register_backend(name="test_hot_logits", compiler_fn=aot_autograd(fw_compiler=_scale_logits(2.0)))
