"""The compiled decode step checks fewer of dynamo's guards once warmed up (recursive dict tags; then only the
guards that tell widths apart, serve/runner/compiled_decode.py): a parameter or submodule set after warm-up must
still be seen, never run through a graph traced for the old model."""

from __future__ import annotations

import torch
from torch import nn

from assay.core.numerics import assert_close
from assay.serve.runner.compiled_decode import CompiledDecode
from assay.serve.runner.weights import load_slot_model

WIDTH, MAX_LEN = 2, 32


def _biased_output_projection(slot_model) -> None:
    """Layer 1's output projection replaced by one with a bias of 0.5 (same weight): a submodule that computes
    something else, which a graph traced for the old one would leave out."""
    old = slot_model.model.layers[1].attention.wo
    slot_model.model.layers[1].attention.wo = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        slot_model.model.layers[1].attention.wo.weight.copy_(old.weight)
        slot_model.model.layers[1].attention.wo.bias.fill_(0.5)


def test_a_weight_set_after_warm_up_recompiles_and_decodes_as_eager(zoo_dir):
    device = torch.device("cpu")
    slot_model = load_slot_model(zoo_dir / "qwen3", device, MAX_LEN)
    buffers = slot_model.pool_buffers(WIDTH + 1, torch.float32, MAX_LEN)
    decode = CompiledDecode(slot_model, "aot_eager", WIDTH, device)
    assert decode.warm_up([WIDTH], WIDTH, buffers) == 1
    tokens, slot_ids, positions = torch.tensor([[3], [5]]), torch.tensor([0, 1]), torch.tensor([0, 0])

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            compiled = decode(tokens, slot_ids, positions, [b.clone() for b in buffers])
            return compiled, slot_model.decode(tokens, slot_ids, positions, [b.clone() for b in buffers])

    before, _ = both()
    graphs = decode.compile_stats.graphs
    # A new Parameter of the same shape in a layer (its _parameters dict changes): the graph takes parameters as
    # inputs, so the same graph runs, reading the new one.
    projection = slot_model.model.layers[0].attention.wv
    projection.weight = nn.Parameter(projection.weight.detach() * -2.0)
    compiled, eager = both()
    # ("compiled_vs_eager", float32) = 1e-4: aot_eager runs the same ops; only the decomposition's order differs.
    assert_close("compiled_vs_eager", compiled, eager, torch.float32)
    assert (compiled - before).abs().max() > 1e-3  # the new weight changed the logits
    # A submodule that computes something else (a projection with a bias): the old graph would leave the bias
    # out; the step is traced again.
    _biased_output_projection(slot_model)
    compiled, eager = both()
    assert decode.compile_stats.graphs == graphs + 1, "the new submodule did not recompile the step"
    assert_close("compiled_vs_eager", compiled, eager, torch.float32)


def test_warmed_width_skips_guards_yet_sees_a_new_submodule_and_a_new_width(zoo_dir):
    # The engine's case: the same cache tensors every step. After a width's first guarded call the next ones run
    # with only the guards that tell widths apart; a submodule that computes something else must still be traced
    # again (the old graph, run without its guards, would leave the bias out), and an unseen width must compile
    # its own graph, not run another width's.
    device = torch.device("cpu")
    slot_model = load_slot_model(zoo_dir / "qwen3", device, MAX_LEN)
    buffers = slot_model.pool_buffers(4, torch.float32, MAX_LEN)
    decode = CompiledDecode(slot_model, "aot_eager", 4, device)
    assert decode.warm_up([WIDTH], 3, buffers) == 1

    def step(width: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, slot_ids = torch.arange(3, 3 + width)[:, None], torch.arange(width)
        positions = torch.zeros(width, dtype=torch.int64)
        with torch.no_grad():
            eager = slot_model.decode(tokens, slot_ids, positions, [b.clone() for b in buffers])
            return decode(tokens, slot_ids, positions, buffers), eager

    step(WIDTH)  # the warm-up ran this width's graph once with its guards: from now on it skips them
    assert any(key[0] == WIDTH for key in decode.compiled)
    compiled, eager = step(WIDTH)
    # ("compiled_vs_eager", float32) = 1e-4: aot_eager runs the same ops; only the decomposition's order differs.
    assert_close("compiled_vs_eager", compiled, eager, torch.float32)
    graphs = decode.compile_stats.graphs
    _biased_output_projection(slot_model)
    changed, eager = step(WIDTH)
    assert decode.compile_stats.graphs == graphs + 1, "the new submodule did not recompile the step"
    assert_close("compiled_vs_eager", changed, eager, torch.float32)
    assert (changed - compiled).abs().max() > 1e-3  # the bias changed the logits
    graphs = decode.compile_stats.graphs
    compiled, eager = step(WIDTH + 1)
    assert compiled.shape[0] == WIDTH + 1 and decode.compile_stats.graphs == graphs + 1
    assert_close("compiled_vs_eager", compiled, eager, torch.float32)
    compiled, eager = step(WIDTH)  # back to the warmed width, guards skipped again: still its own graph
    assert compiled.shape[0] == WIDTH and decode.compile_stats.graphs == graphs + 1
    assert_close("compiled_vs_eager", compiled, eager, torch.float32)


def test_a_call_the_remaining_guards_reject_compiles_instead_of_failing(zoo_dir):
    # Called with grad enabled (the engine never is), the step writes its cache rows from tensors that require
    # grad, so the cache tensors require grad afterwards: the next call's width-telling guards find no graph for
    # them, and that call must recompile through every guard rather than fail or run a graph traced for others.
    device = torch.device("cpu")
    slot_model = load_slot_model(zoo_dir / "qwen3", device, MAX_LEN)
    buffers = slot_model.pool_buffers(WIDTH + 1, torch.float32, MAX_LEN)
    decode = CompiledDecode(slot_model, "aot_eager", WIDTH, device)
    tokens, slot_ids, positions = torch.tensor([[3], [5]]), torch.tensor([0, 1]), torch.tensor([0, 0])
    for _ in range(3):
        compiled = decode(tokens, slot_ids, positions, buffers)
    with torch.no_grad():
        eager = slot_model.decode(tokens, slot_ids, positions, [b.detach().clone() for b in buffers])
    assert_close("compiled_vs_eager", compiled.detach(), eager, torch.float32)
