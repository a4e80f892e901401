"""gla_chunk against the step-by-step reference gla_recurrent: outputs, states, gradients, decode.

Every comparison is a relative error ||a - b|| / ||b|| looked up in the one tolerance table
(assay.core.numerics.TOLERANCES, check "recurrence"). The reference always runs in float64 on the
very values the tested call received (bfloat16 inputs are upcast exactly), so a test measures the
chunked kernel's own error and not the rounding of its inputs, which no kernel could undo.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import assay.kernels.gla.chunk as chunk_module
from assay.core.compiling import compile_fn
from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.kernels.gla import LIMITS, SEGMENT_TOKENS, SubChunkPlan, factorised, plan
from assay.kernels.gla.chunk import _GLAChunkFunction
from assay.kernels.gla.scan import cumulative_gates
from assay.kernels.gla.sub_chunk import MAX_CHUNK as MAX_SUB_CHUNK
from assay.kernels.gla.sub_chunk import SubChunkParts
from assay.ops import gla_chunk, gla_recurrent, gla_step

HEADS, KEY_DIM, VALUE_DIM = 2, 16, 8


def make_inputs(time: int, gate_scale: float, dtype=torch.float32, batch: int = 2, seed: int = 0, weak_decay: bool = False):
    """q, k, v, g, initial_state; g = logsigmoid(x * gate_scale): scale 0.1 gives gates near 0.5 per step,
    10 gives many gates near exp(-30) (a state wiped in one step), weak_decay gives gates near 1."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k = randn(batch, time, HEADS, KEY_DIM), randn(batch, time, HEADS, KEY_DIM)
    v = randn(batch, time, HEADS, VALUE_DIM)
    logits = randn(batch, time, HEADS, KEY_DIM)
    g = F.logsigmoid(logits + 6.0) if weak_decay else F.logsigmoid(logits * gate_scale)
    initial_state = randn(batch, HEADS, KEY_DIM, VALUE_DIM)
    return [x.to(dtype) for x in (q, k, v, g, initial_state)]


def as_float64(tensors):
    return [x.detach().to(torch.float64).requires_grad_(x.requires_grad) for x in tensors]


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128])
@pytest.mark.parametrize("time", [1, 37, 130])
@pytest.mark.parametrize("gate_scale", [0.1, 1.0, 10.0])
def test_chunk_matches_recurrent_float32(chunk_size, time, gate_scale):
    q, k, v, g, h0 = make_inputs(time, gate_scale)
    o, state = gla_chunk(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
    o_ref, state_ref = gla_recurrent(*as_float64([q, k, v, g]), initial_state=h0.double(), output_final_state=True)
    assert o.dtype == torch.float32 and o.shape == (2, time, HEADS, VALUE_DIM)
    assert state.shape == (2, HEADS, KEY_DIM, VALUE_DIM)
    assert_close("recurrence", o, o_ref, torch.float32)
    assert_close("recurrence", state, state_ref, torch.float32)


@pytest.mark.parametrize("chunk_size", [16, 128])
def test_weak_decay_long_memory_matches(chunk_size):
    # Gates near 1 keep the whole history in the state: the case where summation order matters most.
    q, k, v, g, _ = make_inputs(130, 1.0, weak_decay=True)
    o, state = gla_chunk(q, k, v, g, output_final_state=True, chunk_size=chunk_size)
    o_ref, state_ref = gla_recurrent(*as_float64([q, k, v, g]), output_final_state=True)
    assert_close("recurrence", o, o_ref, torch.float32)
    assert_close("recurrence", state, state_ref, torch.float32)


@pytest.mark.parametrize("gate_scale", [0.1, 10.0])
def test_chunk_matches_recurrent_bfloat16(gate_scale):
    q, k, v, g, h0 = make_inputs(130, gate_scale, dtype=torch.bfloat16)
    o, state = gla_chunk(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=64)
    o_ref, state_ref = gla_recurrent(*as_float64([q, k, v, g]), initial_state=h0.double(), output_final_state=True)
    assert o.dtype == torch.bfloat16
    assert state.dtype == torch.float32  # the state is accumulated, and handed back, in float32
    assert_close("recurrence", o, o_ref, torch.bfloat16)
    assert_close("recurrence", state, state_ref, torch.bfloat16)


def test_no_initial_state_and_no_final_state_by_default():
    q, k, v, g, _ = make_inputs(37, 1.0)
    o, state = gla_chunk(q, k, v, g, chunk_size=16)
    o_ref, state_ref = gla_recurrent(*as_float64([q, k, v, g]))
    assert state is None and state_ref is None
    assert_close("recurrence", o, o_ref, torch.float32)


def test_empty_sequence_passes_the_state_through():
    q, k, v, g, h0 = make_inputs(0, 1.0)
    for op in (gla_chunk, gla_recurrent):
        o, state = op(q, k, v, g, initial_state=h0, output_final_state=True)
        assert o.shape == (2, 0, HEADS, VALUE_DIM)
        assert torch.equal(state, h0)


def test_reference_is_the_stated_recurrence():
    # o_t = sum_{s <= t} ((q_t * scale) . (k_s * prod_{s < r <= t} exp(g_r))) v_s, written out in float64.
    q, k, v, g, _ = as_float64(make_inputs(6, 1.0, batch=1))
    o_ref, _ = gla_recurrent(q, k, v, g)
    scale = KEY_DIM**-0.5
    expected = torch.zeros_like(o_ref)
    for t in range(6):
        for s in range(t + 1):
            decay = g[:, s + 1 : t + 1].sum(1).exp()  # [B, H, K]
            weight = (q[:, t] * scale * k[:, s] * decay).sum(-1, keepdim=True)  # [B, H, 1]
            expected[:, t] += weight * v[:, s]
    assert_close("recurrence", o_ref, expected, torch.float64)


def _gradients(fn, inputs, grad_o, grad_state, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    o, state = fn(*leaves[:4], initial_state=leaves[4], output_final_state=True, **kwargs)
    loss = (o.to(torch.float64) * grad_o).sum() + (state.to(torch.float64) * grad_state).sum()
    loss.backward()
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize(
    "dtype,chunk_size,time,gate_scale",
    [
        (torch.float32, 16, 37, 0.1),
        (torch.float32, 32, 130, 10.0),
        (torch.float32, 64, 37, 1.0),
        (torch.float32, 128, 130, 1.0),
        (torch.bfloat16, 64, 130, 1.0),
        (torch.bfloat16, 16, 37, 10.0),
    ],
)
def test_gradients_match_recurrent(dtype, chunk_size, time, gate_scale):
    inputs = make_inputs(time, gate_scale, dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    # Upstream gradients rounded to the tested dtype, so both sides receive the same numbers.
    grad_o = torch.randn(2, time, HEADS, VALUE_DIM, generator=generator, dtype=torch.float64).to(dtype).double()
    grad_state = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM, generator=generator, dtype=torch.float64)
    grads = _gradients(gla_chunk, inputs, grad_o, grad_state, chunk_size=chunk_size)
    grads_ref = _gradients(gla_recurrent, as_float64(inputs), grad_o, grad_state)
    for name, grad, grad_ref in zip(["q", "k", "v", "g", "initial_state"], grads, grads_ref):
        assert grad.dtype == dtype, name
        assert_close("recurrence", grad, grad_ref, dtype)


def test_long_sequence_crosses_segments():
    # Past SEGMENT_TOKENS the sequence is processed in segments with the state carried between them;
    # 48 does not divide 2048, so segments end on whole chunks short of it.
    time, chunk_size = SEGMENT_TOKENS + 37, 48
    inputs = make_inputs(time, 1.0, batch=1)
    grad_o = torch.randn(1, time, HEADS, VALUE_DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grad_state = torch.randn(1, HEADS, KEY_DIM, VALUE_DIM, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    o, state = gla_chunk(*inputs[:4], initial_state=inputs[4], output_final_state=True, chunk_size=chunk_size)
    o_ref, state_ref = gla_recurrent(*as_float64(inputs[:4]), initial_state=inputs[4].double(), output_final_state=True)
    assert_close("recurrence", o, o_ref, torch.float32)
    assert_close("recurrence", state, state_ref, torch.float32)
    grads = _gradients(gla_chunk, inputs, grad_o, grad_state, chunk_size=chunk_size)
    grads_ref = _gradients(gla_recurrent, as_float64(inputs), grad_o, grad_state)
    for grad, grad_ref in zip(grads, grads_ref):
        assert_close("recurrence", grad, grad_ref, torch.float32)


def test_extreme_gates_stay_finite():
    # Gates down to exp(-1000) per step: a form that multiplies by exp(-cumsum) would overflow to inf.
    q, k, v, _, h0 = make_inputs(130, 1.0)
    g = -torch.rand(q.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).mul(1000).float()
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    o, state = gla_chunk(*leaves, initial_state=h0, output_final_state=True, chunk_size=128)
    (o.sum() + state.sum()).backward()
    assert all(torch.isfinite(x).all() for x in [o, state] + [leaf.grad for leaf in leaves])
    o_ref, _ = gla_recurrent(*as_float64([q, k, v, g]), initial_state=h0.double())
    assert_close("recurrence", o, o_ref, torch.float32)


def test_prefill_then_decode_equals_one_pass():
    prompt, new_tokens = 37, 5
    q, k, v, g, h0 = make_inputs(prompt + new_tokens, 1.0)
    o_full, state_full = gla_chunk(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=32)

    _, state = gla_chunk(q[:, :prompt], k[:, :prompt], v[:, :prompt], g[:, :prompt], initial_state=h0, output_final_state=True, chunk_size=32)
    step_state, recurrent_state, chunk_state = state, state, state
    for t in range(prompt, prompt + new_tokens):
        o_step, step_state = gla_step(q[:, t], k[:, t], v[:, t], g[:, t], step_state)
        o_rec, recurrent_state = gla_recurrent(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1], initial_state=recurrent_state, output_final_state=True)
        o_chunk, chunk_state = gla_chunk(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1], initial_state=chunk_state, output_final_state=True, chunk_size=16)
        assert_close("recurrence", o_step, o_full[:, t], torch.float32)
        assert_close("recurrence", o_rec[:, 0], o_full[:, t], torch.float32)
        assert_close("recurrence", o_chunk[:, 0], o_full[:, t], torch.float32)
    for decoded_state in (step_state, recurrent_state, chunk_state):
        assert_close("recurrence", decoded_state, state_full, torch.float32)


@pytest.mark.parametrize("chunk_size", [0, 8, 20, 144, 256, 64.0, True, "64"])
def test_bad_chunk_size_is_assay_error(chunk_size):
    q, k, v, g, _ = make_inputs(4, 1.0)
    with pytest.raises(AssayError, match="chunk_size must be a multiple of 16 from 16 to 128"):
        gla_chunk(q, k, v, g, chunk_size=chunk_size)


def test_mismatched_shapes_are_assay_errors():
    q, k, v, g, h0 = make_inputs(4, 1.0)
    with pytest.raises(AssayError, match="one shape"):
        gla_chunk(q, k[..., :4], v, g)
    with pytest.raises(AssayError, match="initial_state"):
        gla_recurrent(q, k, v, g, initial_state=h0[..., :4])


def mixed_gates(time: int, batch: int = 2):
    """Inputs whose chunks differ: per-step log gates down to -20 in the first half of the sequence (a
    state wiped within a chunk), logsigmoid(x) / 16 (the model's slow forget) after."""
    q, k, v, _, h0 = make_inputs(time, 1.0, batch=batch)
    generator = torch.Generator().manual_seed(3)
    strong = -20.0 * torch.rand(batch, time, HEADS, KEY_DIM, generator=generator, dtype=torch.float64)
    slow = F.logsigmoid(torch.randn(batch, time, HEADS, KEY_DIM, generator=generator, dtype=torch.float64)) / 16
    g = torch.where(torch.arange(time).view(1, time, 1, 1) < time // 2, strong, slow).float()
    return q, k, v, g, h0


def gate(strength: str, shape, seed: int = 4) -> torch.Tensor:
    """The bench's gate strengths (bench/gla/kernel.py): logsigmoid(x) times 1/16 ... 4, and gates that
    wipe the state in one step (per-step log gates uniform in [-1000, 0])."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator, dtype=torch.float64)
    if strength == "wipe":
        return (-1000.0 * torch.rand(*shape, generator=generator, dtype=torch.float64)).float()
    return (F.logsigmoid(x) * {"/16": 1 / 16, "/4": 1 / 4, "1x": 1.0, "4x": 4.0}[strength]).float()


def form_of(g, chunk_size):
    """The form gla_chunk's forward picks for gates g [B, T, H, K] (T a multiple of C): None (factorised) or a SubChunkPlan."""
    zeros = torch.zeros_like(g)
    return _GLAChunkFunction.forward(zeros, zeros, zeros, g, torch.zeros(*g.shape[:1], g.shape[2], g.shape[3], g.shape[3]), 1.0, chunk_size)[3]


def test_the_form_is_chosen_from_the_gates():
    shape = (1, 256, HEADS, KEY_DIM)
    # The model's gate keeps every chunk of 128 tokens on the factorised form, and so does / 4 at 64.
    assert form_of(gate("/16", shape), 128) is None and form_of(gate("/4", shape), 64) is None
    # Stronger gates: the sub-chunk form (chunks of 32), with smaller blocks the stronger they are; gates that
    # wipe the state: blocks of 2, whose diagonal takes any gate.
    one, four, wipe = (form_of(gate(strength, shape), 64) for strength in ("1x", "4x", "wipe"))
    assert one == SubChunkPlan(MAX_SUB_CHUNK, 16) and (wipe.chunk, wipe.block) == (MAX_SUB_CHUNK, 2)
    # Wiping gates decay by far more than e^-60 over any few tokens: a reach R < C (the state flush's limit)
    # that is the shortest whose every aligned R-block does; 1x and 4x gates keep every term (no reach).
    assert wipe.reach is not None and 2 <= wipe.reach < MAX_SUB_CHUNK and one.reach is None and four.reach is None
    wiped = gate("wipe", shape)
    assert wiped.view(1, -1, wipe.reach, HEADS, KEY_DIM).sum(2).max() <= -LIMITS[torch.float32].state_flush
    assert wiped.view(1, -1, wipe.reach // 2, HEADS, KEY_DIM).sum(2).max() > -LIMITS[torch.float32].state_flush
    assert four.chunk == MAX_SUB_CHUNK and 4 <= four.block < one.block
    # Each plan's blocks really decay by at most e^block_range, and the next larger block would not.
    blocks = gate("4x", shape).view(1, -1, four.block, HEADS, KEY_DIM).sum(2)
    twice = gate("4x", shape).view(1, -1, 2 * four.block, HEADS, KEY_DIM).sum(2)
    assert blocks.min() >= -LIMITS[torch.float32].block_range > twice.min()
    assert plan(cumulative_gates(gate("4x", shape), 64), 64) == four


@pytest.mark.parametrize("strength", ["/16", "/4", "1x", "4x", "wipe", "mixed"])
@pytest.mark.parametrize("chunk_size", [16, 48, 64, 128])
def test_every_gate_strength_matches_recurrent_with_gradients(strength, chunk_size):
    # Every gate strength the bench measures, each chunk size (48: the sub-chunk form at 16-token chunks),
    # lengths that are not a multiple of the chunk: outputs, final states and every gradient.
    time = 2 * chunk_size + 37
    inputs = mixed_gates(time) if strength == "mixed" else make_inputs(time, 1.0)
    if strength != "mixed":
        inputs[3] = gate(strength, inputs[3].shape)
    generator = torch.Generator().manual_seed(1)
    grad_o = torch.randn(2, time, HEADS, VALUE_DIM, generator=generator, dtype=torch.float64)
    grad_state = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM, generator=generator, dtype=torch.float64)
    o, state = gla_chunk(*inputs[:4], initial_state=inputs[4], output_final_state=True, chunk_size=chunk_size)
    o_ref, state_ref = gla_recurrent(*as_float64(inputs[:4]), initial_state=inputs[4].double(), output_final_state=True)
    assert_close("recurrence", o, o_ref, torch.float32)
    assert_close("recurrence", state, state_ref, torch.float32)
    o_rec, state_rec = gla_recurrent(*inputs[:4], initial_state=inputs[4], output_final_state=True)  # the loop in float32
    assert_close("recurrence", o, o_rec, torch.float32)
    assert_close("recurrence", state, state_rec, torch.float32)
    grads = _gradients(gla_chunk, inputs, grad_o, grad_state, chunk_size=chunk_size)
    grads_ref = _gradients(gla_recurrent, as_float64(inputs), grad_o, grad_state)
    for name, grad, grad_ref in zip(["q", "k", "v", "g", "initial_state"], grads, grads_ref):
        assert torch.isfinite(grad).all(), name
        assert_close("recurrence", grad, grad_ref, torch.float32)


@pytest.mark.parametrize("strength", ["/16", "1x", "4x", "wipe"])
def test_every_gate_strength_in_bfloat16_matches_recurrent_with_gradients(strength):
    # bfloat16 inputs (the kernel accumulates in float32): outputs, final state and every gradient against the
    # float64 reference at ("recurrence", bfloat16), and the output against gla_recurrent run in float32.
    time = 2 * 64 + 37
    inputs = make_inputs(time, 1.0, dtype=torch.bfloat16)
    inputs[3] = gate(strength, inputs[3].shape).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    grad_o = torch.randn(2, time, HEADS, VALUE_DIM, generator=generator, dtype=torch.float64).to(torch.bfloat16).double()
    grad_state = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM, generator=generator, dtype=torch.float64)
    o, state = gla_chunk(*inputs[:4], initial_state=inputs[4], output_final_state=True, chunk_size=64)
    o_ref, state_ref = gla_recurrent(*as_float64(inputs[:4]), initial_state=inputs[4].double(), output_final_state=True)
    o_rec, _ = gla_recurrent(*(x.float() for x in inputs[:4]), initial_state=inputs[4].float())
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert_close("recurrence", o, o_ref, torch.bfloat16)
    assert_close("recurrence", o, o_rec, torch.bfloat16)
    assert_close("recurrence", state, state_ref, torch.bfloat16)
    grads = _gradients(gla_chunk, inputs, grad_o, grad_state, chunk_size=64)
    for name, grad, grad_ref in zip(["q", "k", "v", "g", "initial_state"], grads, _gradients(gla_recurrent, as_float64(inputs), grad_o, grad_state)):
        assert grad.dtype == torch.bfloat16 and torch.isfinite(grad).all(), name
        assert_close("recurrence", grad, grad_ref, torch.bfloat16)


def _assert_chunk_matches_recurrent(inputs) -> None:
    """gla_chunk (chunks of 64, float32) against float64 gla_recurrent: output, final state and every gradient."""
    generator = torch.Generator().manual_seed(1)
    grad_o = torch.randn(2, inputs[0].shape[1], HEADS, VALUE_DIM, generator=generator, dtype=torch.float64)
    grad_state = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM, generator=generator, dtype=torch.float64)
    o, state = gla_chunk(*inputs[:4], initial_state=inputs[4], output_final_state=True, chunk_size=64)
    o_ref, state_ref = gla_recurrent(*as_float64(inputs[:4]), initial_state=inputs[4].double(), output_final_state=True)
    assert_close("recurrence", o, o_ref, torch.float32)
    assert_close("recurrence", state, state_ref, torch.float32)
    for grad, grad_ref in zip(_gradients(gla_chunk, inputs, grad_o, grad_state, chunk_size=64), _gradients(gla_recurrent, as_float64(inputs), grad_o, grad_state)):
        assert_close("recurrence", grad, grad_ref, torch.float32)


def test_the_sub_chunk_form_matches_recurrent_on_the_models_gates(monkeypatch):
    # Forced on every chunk (no chunk counts as in range), the sub-chunk form on the gates the factorised
    # form would take: the two forms agree wherever both apply.
    monkeypatch.setattr(factorised, "FACTORISED_LOG_RANGE", 0.0)
    inputs = make_inputs(2 * 64 + 37, 1.0)
    inputs[3] = gate("/16", inputs[3].shape)
    assert isinstance(form_of(F.pad(inputs[3], (0, 0, 0, 0, 0, 27)), 64), SubChunkPlan)
    _assert_chunk_matches_recurrent(inputs)


@pytest.mark.parametrize("block", [2, 4, 16])
def test_each_block_size_matches_recurrent_on_the_models_gates(monkeypatch, block):
    # Forced on the model's gate, every block size (2: the row-wise diagonal; 4: levels stacked 16 rows to a
    # product; 16: one matmul per diagonal block) gives the recurrence, forward and backward.
    monkeypatch.setattr(factorised, "FACTORISED_LOG_RANGE", 0.0)
    monkeypatch.setattr(chunk_module, "plan", lambda b, chunk: SubChunkPlan(min(chunk, MAX_SUB_CHUNK), block))
    inputs = make_inputs(2 * 64 + 37, 1.0)
    inputs[3] = gate("/16", inputs[3].shape)
    assert form_of(F.pad(inputs[3], (0, 0, 0, 0, 0, 27)), 64) == SubChunkPlan(MAX_SUB_CHUNK, block)
    _assert_chunk_matches_recurrent(inputs)


def test_wiping_gates_take_the_flushed_state_path(monkeypatch):
    # Every chunk's decay is 0: forward and backward build the state terms from neighbouring chunks (flushed.py),
    # across the batch's and heads' sequence boundaries, with an initial state and a final state's gradient.
    calls = []
    for name in ("flushed_forward", "flushed_state_grads"):
        real = getattr(chunk_module, name)
        monkeypatch.setattr(chunk_module, name, lambda *args, real=real, name=name: calls.append(name) or real(*args))
    inputs = make_inputs(2 * 64 + 37, 1.0)
    inputs[3] = gate("wipe", inputs[3].shape)
    _assert_chunk_matches_recurrent(inputs)
    assert {"flushed_forward", "flushed_state_grads"} <= set(calls)


@pytest.mark.parametrize("strength", ["1x", "4x", "wipe"])
def test_the_sub_chunk_form_passes_no_denormal_to_exp_or_the_scan(strength):
    # exp of an argument below -87 (a denormal result) runs 13x slower on this project's CPU (docs/gla.md):
    # every factor the form builds, and the chunk's decay the state scan multiplies by, is normal or zero.
    q, k, _, _, _ = make_inputs(256, 1.0, batch=1)
    g = gate(strength, q.shape)
    parts = SubChunkParts(q, k, g, plan(cumulative_gates(g, 64), 64), KEY_DIM**-0.5)
    tensors = [parts.factor, parts.before, parts.exit_scale, parts.chunk_decay]
    tensors += [scale for level in parts.levels for scale in level[3:] if scale is not None]
    smallest_normal = torch.finfo(torch.float32).tiny
    for tensor in tensors:
        assert not ((tensor > 0) & (tensor < smallest_normal)).any()
        assert (tensor >= 0).all() and (tensor <= 1).all()


def test_backward_keeps_no_per_chunk_intermediates():
    # Autograd holds the Function's inputs and the [B, H, N, K, V] chunk states, nothing of size T * C.
    q, k, v, g, _ = make_inputs(256, 1.0, batch=1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        gla_chunk(*leaves, chunk_size=64)
    largest = max(x.numel() for x in saved)
    assert largest == q.numel()  # q, k, v, g themselves; the states are 4 x 16 x 8 per chunk
    assert sum(x.numel() for x in saved) <= 4 * q.numel() + 2 * HEADS * KEY_DIM * VALUE_DIM * (256 // 64 + 1)


def test_a_sequence_shorter_than_a_chunk_runs_in_a_chunk_of_its_own_length():
    # 16 tokens with chunk_size 64 run as one 16-token chunk: autograd saves the unpadded inputs, not 4x
    # their size in padding (MQAR's short stage trains at 16 tokens). A power of two from 16 that holds
    # the sequence; a sequence of a chunk or more keeps the chunk size asked for.
    from assay.kernels.gla.chunk import fitted_chunk_size

    assert [fitted_chunk_size(t, 64) for t in (1, 16, 17, 33, 64, 65, 500)] == [16, 16, 32, 64, 64, 64, 64]
    assert fitted_chunk_size(20, 48) == 32 and fitted_chunk_size(40, 48) == 48
    q, k, v, g, h0 = make_inputs(16, 1.0, batch=1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        o, state = gla_chunk(*leaves, initial_state=h0, output_final_state=True, chunk_size=64)
    assert max(x.numel() for x in saved) == q.numel()
    o_ref, state_ref = gla_recurrent(*as_float64([q, k, v, g]), initial_state=h0.double(), output_final_state=True)
    assert_close("recurrence", o, o_ref, torch.float32)
    assert_close("recurrence", state, state_ref, torch.float32)


def _compiled_matches_eager(backend, inputs, chunk_size):
    q, k, v, g, h0 = inputs
    # fullgraph: a graph break is an error. Static shapes: each test compiles its own length once.
    compiled = compile_fn(gla_chunk, backend, fullgraph=True, dynamic=False)
    leaves_eager = [x.clone().requires_grad_() for x in (q, k, v, g)]
    leaves_compiled = [x.clone().requires_grad_() for x in (q, k, v, g)]
    o_eager, state_eager = gla_chunk(*leaves_eager, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
    o_compiled, state_compiled = compiled(*leaves_compiled, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
    assert_close("compiled_vs_eager", o_compiled, o_eager, torch.float32)
    assert_close("compiled_vs_eager", state_compiled, state_eager, torch.float32)
    (o_eager.sum() + state_eager.sum()).backward()
    (o_compiled.sum() + state_compiled.sum()).backward()
    for leaf_compiled, leaf_eager in zip(leaves_compiled, leaves_eager):
        assert_close("compiled_vs_eager", leaf_compiled.grad, leaf_eager.grad, torch.float32)


@pytest.mark.inductor
def test_compiled_mixed_forms_match_eager_inductor():
    # The form choice is a torch.cond inside the graph: no graph break, both forms traced (by the same AOT
    # autograd trace aot_eager runs) and generated, forward and backward.
    _compiled_matches_eager("inductor", mixed_gates(100), 32)


@pytest.mark.slow  # 20 s
def test_compiled_chunk_matches_eager():
    _compiled_matches_eager("aot_eager", make_inputs(37, 1.0), 16)
