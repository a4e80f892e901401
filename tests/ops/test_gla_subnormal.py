"""No subnormal number anywhere in the GLA kernels: every aten op's floating output, forward and backward,
float32 and bfloat16, every gate strength, and the decode step (the kernel's and the model's).

Subnormals cost a slow microcode path on many CPUs (5-6x for the whole kernel on an Intel Xeon at
4 logsigmoid(x) gates, docs/gla.md), so this is checked on values, not timed: `SubnormalCheck` inspects
every op's outputs and names the op that made one, whatever CPU runs the test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from assay.kernels.gla.subnormal import SubnormalCheck, count_subnormal
from assay.models.gla import FLAVOURS, GLA
from assay.ops import gla_chunk, gla_recurrent, gla_step

HEADS, KEY_DIM, VALUE_DIM = 2, 32, 32
STRENGTHS = ("/16", "/4", "1x", "4x", "wipe", "mixed")


def gates(strength: str, shape, generator: torch.Generator) -> torch.Tensor:
    """The bench's gates (bench/gla/gates.py): logsigmoid(x) times 1/16 ... 4; wipe: -1000 u per step (almost every
    decay exactly 0 in float32); mixed: wiping first half, the model's /16 gate after."""
    x = torch.randn(*shape, generator=generator)
    if strength in ("wipe", "mixed"):
        wipe = -1000.0 * torch.rand(*shape, generator=generator)
        if strength == "wipe":
            return wipe
        return torch.where(torch.arange(shape[1]).view(1, -1, 1, 1) < shape[1] // 2, wipe, F.logsigmoid(x) / 16)
    return F.logsigmoid(x) * {"/16": 1 / 16, "/4": 1 / 4, "1x": 1.0, "4x": 4.0}[strength]


def inputs(strength: str, dtype: torch.dtype, time: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shape = (2, time, HEADS, KEY_DIM)
    q, k = torch.randn(*shape, generator=generator), torch.randn(*shape, generator=generator)
    v = torch.randn(2, time, HEADS, VALUE_DIM, generator=generator)
    g = gates(strength, shape, generator)
    state = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM, generator=generator)
    return [x.to(dtype) for x in (q, k, v, g)], state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strength", STRENGTHS)
@pytest.mark.parametrize("chunk_size", [32, 64, 128])
def test_gla_chunk_forward_and_backward_make_no_subnormal(strength, dtype, chunk_size):
    leaves, state = inputs(strength, dtype)
    leaves = [x.requires_grad_() for x in leaves]
    generator = torch.Generator().manual_seed(1)
    grad_o = torch.randn(2, 300, HEADS, VALUE_DIM, generator=generator).to(dtype)
    grad_final = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM, generator=generator)
    with SubnormalCheck() as check:
        o, final = gla_chunk(*leaves, initial_state=state, output_final_state=True, chunk_size=chunk_size)
        torch.autograd.backward([o, final], [grad_o, grad_final])
    assert not check.found, check.report()
    assert all(torch.isfinite(leaf.grad).all() for leaf in leaves)
    with SubnormalCheck() as check, torch.no_grad():  # the inference path (no autograd Function)
        gla_chunk(*(leaf.detach() for leaf in leaves), initial_state=state, output_final_state=True, chunk_size=chunk_size)
    assert not check.found, check.report()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strength", ["1x", "4x", "wipe"])
def test_decode_steps_on_a_strong_gate_state_make_no_subnormal(strength, dtype):
    # 256 steps of strong gates: the state's entries decay towards the subnormal range wherever new keys add
    # little; every step's ops, and the state itself, stay normal or exactly 0.
    (q, k, v, g), state = inputs(strength, dtype, time=257)
    with torch.no_grad():
        _, state = gla_recurrent(q[:, :256], k[:, :256], v[:, :256], g[:, :256], initial_state=state, output_final_state=True)
        assert count_subnormal(state) == 0
        with SubnormalCheck() as check:
            _, state = gla_step(q[:, 256], k[:, 256], v[:, 256], g[:, 256], state)
    assert not check.found, check.report()
    assert count_subnormal(state) == 0


def test_a_state_whose_entries_would_decay_into_the_subnormal_range_is_flushed():
    # Keys that stop adding to a channel leave its rows decaying step after step: at e^-1 per step a normal
    # float32 would pass 1.2e-38 after 88 steps. The step flushes them to exactly 0 first.
    state = torch.ones(1, 1, 4, 4)
    zeros, g = torch.zeros(1, 1, 4), torch.full((1, 1, 4), -1.0)
    with SubnormalCheck() as check:
        for _ in range(120):
            _, state = gla_step(zeros, zeros, zeros, g, state)
    assert not check.found, check.report()
    assert (state == 0).all()


@pytest.mark.parametrize("gate_scale", [1.0, 16.0])
def test_the_models_decode_step_on_strong_gates_makes_no_subnormal(gate_scale):
    # The tiny GLA with its gate projection scaled (logits of +-100: logsigmoid near 0 on one side, a wiped state
    # on the other): a prompt, decode steps, then one step under the check.
    model = GLA.build(replace(FLAVOURS["tiny"]), seed=0, std=0.2).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.gk_up.weight.mul_(gate_scale * 8.0)
            layer.attention.gk_up.bias.fill_(0.0)
        tokens = torch.randint(0, FLAVOURS["tiny"].vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
        logits, state = model.prefill(tokens)
        for _ in range(32):
            logits, state = model.decode_step(logits[:, -1:].argmax(-1), state)
        with SubnormalCheck() as check:
            model.decode_step(logits[:, -1:].argmax(-1), state)
    assert not check.found, check.report()
    assert all(count_subnormal(layer_state) == 0 for layer_state in state)
