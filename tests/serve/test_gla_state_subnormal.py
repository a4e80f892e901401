"""The serving engine's GLA slot states stay free of subnormal numbers through 512 decode steps of strong gates.

A state that keeps decaying drifts towards the subnormal range (below 1.2e-38), where many CPUs run each
step's `q S` and `S decay` 5-50x slower. The decode step flushes such entries and zeroes negligible decays
(docs/gla.md), so every slot's state holds normal numbers or exact zeros however long a sequence runs.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from assay.kernels.gla.subnormal import count_subnormal
from assay.models.gla import SPEC
from assay.serve import Engine, EngineConfig

STEPS = 512


@pytest.fixture(scope="module")
def strong_gla(zoo_dir, tmp_path_factory):
    """The zoo's GLA with its forget gate's up-projection scaled 64x: gate logits of about +-100, so most channels
    decay by e^-2 to e^-10 per token (logsigmoid(x) / 16) and the rest not at all."""
    folder = tmp_path_factory.mktemp("strong-gla")
    shutil.copytree(zoo_dir / "gla", folder, dirs_exist_ok=True)
    weights = load_file(folder / "model.safetensors")
    scaled = [name for name in weights if ".attn.gk_proj.1." in name]
    assert scaled, "the zoo's GLA has no gk_proj.1 (the gate's up-projection)"
    for name in scaled:
        weights[name] = weights[name] * 64.0
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_slot_states_hold_no_subnormal_after_512_strong_gate_decode_steps(strong_gla, state_dtype):
    config = EngineConfig(max_seqs=2, buckets=(1, 2), eager=True, state_dtype=state_dtype, max_new_tokens=STEPS + 8)
    engine = Engine.from_checkpoint(strong_gla, config)
    prompts = [[5, 17, 300, 42, 9, 77, 610, 3], [100, 200, 300]]
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, max_tokens=STEPS + 1)
    steps, checked = 0, []
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps % 64 == 0 or steps == STEPS:
            checked.append(sum(count_subnormal(buffer) for buffer in engine.pool.buffers if buffer.is_floating_point()))
    assert steps >= STEPS and len(checked) >= STEPS // 64
    assert checked == [0] * len(checked)


def test_the_scaled_checkpoint_has_strong_gates(strong_gla):
    # What the engine test relies on: in the first layer, on the prompt's tokens, a good part of the gates decay
    # by more than e^-2 per token (the zoo's own gates: about e^-0.05).
    model, _ = SPEC.load(strong_gla)
    attention = model.layers[0].attention
    with torch.no_grad():
        x = model.layers[0].attention_norm(model.tok_embeddings(torch.tensor([[5, 17, 300, 42, 9, 77, 610, 3]])))
        g = F.logsigmoid(attention.gk_up(attention.gk_down(x))) / attention.gate_logit_normalizer
    assert (g < -2.0).float().mean() > 0.2
