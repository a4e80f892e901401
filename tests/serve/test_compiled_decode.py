"""The compiled decode step skips the guards of a module subtree whose dicts are unchanged (dynamo's recursive
dict tags, serve/runner/compiled_decode.py): a parameter or submodule set after warm-up must still be seen,
never run through a graph traced for the old model."""

from __future__ import annotations

import torch
from torch import nn

from assay.core.numerics import assert_close
from assay.serve.runner.compiled_decode import CompiledDecode
from assay.serve.runner.weights import load_slot_model

WIDTH, MAX_LEN = 2, 32


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
    old = slot_model.model.layers[1].attention.wo
    slot_model.model.layers[1].attention.wo = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        slot_model.model.layers[1].attention.wo.weight.copy_(old.weight)
        slot_model.model.layers[1].attention.wo.bias.fill_(0.5)
    compiled, eager = both()
    assert decode.compile_stats.graphs == graphs + 1, "the new submodule did not recompile the step"
    assert_close("compiled_vs_eager", compiled, eager, torch.float32)
