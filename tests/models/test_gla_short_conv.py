"""GLA with fla's short convolutions (use_short_conv): the convolution against a float64 loop, its state
through prefill / decode / prefill, fla's checkpoint keys, Transformers' generate, and the serving engine.

Tolerances: ("recurrence", float64) 1e-12 relative where the same float64 sums run in another order
(conv1d vs the step's dot product, chunked vs step-by-step GLA); ("recurrence", float32) 1e-4 for the
float32 model paths, as the GLA without convolutions (tests/models/test_gla_model.py).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models.gla import FLAVOURS, GLA, SPEC, GLAArgs, state_bytes_per_sequence
from assay.models.common.linear_attention import ShortConvolution

ARGS = replace(FLAVOURS["tiny"], use_short_conv=True)


def _tokens(batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, ARGS.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def _model(dtype=torch.float32, **overrides):
    # std 0.2: logits far from uniform, so a wrong state shows in them.
    return GLA.build(replace(ARGS, **overrides), dtype=dtype, seed=0, std=0.2).eval()


def test_short_convolution_equals_a_causal_loop_and_its_step():
    conv = ShortConvolution(6, 4, bias=True).double()
    x = torch.randn(2, 9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # y_t = silu(b + sum_i w_i x_{t - 3 + i}), inputs before the first token are zeros
    padded = F.pad(x, (0, 0, 3, 0))
    expected = F.silu(conv.bias + sum(padded[:, i : i + 9] * conv.weight[:, 0, i] for i in range(4)))
    y, state = conv(x, output_final_state=True)
    assert_close("recurrence", y, expected, torch.float64)
    assert torch.equal(state, x[:, -3:])  # the last W - 1 inputs
    # the same one token per call (decode), each from the window the call before left
    state, steps = torch.zeros(2, 3, 6, dtype=torch.float64), []
    for t in range(9):
        out, state = conv(x[:, t : t + 1], state, output_final_state=True)
        steps.append(out)
    assert_close("recurrence", torch.cat(steps, 1), expected, torch.float64)
    # and through two calls, the second starting from the first's state
    first, state = conv(x[:, :5], output_final_state=True)
    second, _ = conv(x[:, 5:], state)
    assert_close("recurrence", torch.cat([first, second], 1), expected, torch.float64)


def test_prefill_decode_prefill_equals_one_pass_with_the_conv_state():
    model = _model(dtype=torch.float64)
    tokens = _tokens(3, 70)
    with torch.no_grad():
        full = model(tokens)
        logits, state = model.prefill(tokens[:, :21])
        pieces = [logits]
        for position in range(21, 40):
            logits, state = model.decode_step(tokens[:, position : position + 1], state)
            pieces.append(logits)
        logits, state = model.prefill(tokens[:, 40:], state)
        pieces.append(logits)
    assert_close("recurrence", torch.cat(pieces, 1), full, torch.float64)
    # per layer [B, H, K, V], then per layer the last 3 projected q, k, v
    assert [tuple(s.shape) for s in state] == [(3, 4, 8, 16)] * 2 + [(3, 3, ARGS.conv_state_dim)] * 2
    assert [s.shape for s in model.init_state(3)] == [s.shape for s in state]


def test_the_convolution_changes_the_output():
    # Not a silent no-op: the same weights without the convolutions give other logits.
    tokens = _tokens(1, 20)
    with_conv = _model()
    without = GLA.build(replace(ARGS, use_short_conv=False), seed=0, std=0.2).eval()
    without.load_state_dict({k: v for k, v in with_conv.state_dict().items() if "_conv." not in k})
    with torch.no_grad():
        assert (with_conv(tokens) - without(tokens)).abs().max() > 1e-2


def test_state_bytes_count_the_conv_state():
    plain = state_bytes_per_sequence(FLAVOURS["tiny"])
    assert state_bytes_per_sequence(ARGS) == plain + ARGS.n_layers * 3 * ARGS.conv_state_dim * 4


def test_export_writes_flas_conv_keys_and_loads_back(tmp_path):
    model = _model()
    SPEC.export_hf(model, ARGS, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    assert tuple(tensors["model.layers.0.attn.q_conv1d.weight"].shape) == (ARGS.key_dim, 1, 4)
    assert tuple(tensors["model.layers.1.attn.v_conv1d.weight"].shape) == (ARGS.value_dim, 1, 4)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["use_short_conv"], config["conv_size"], config["conv_bias"]) == (True, 4, False)
    loaded, args = SPEC.load(tmp_path)
    assert args == ARGS
    tokens = _tokens(2, 30)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(tokens), model(tokens))
    # a checkpoint without the conv weights is refused by a config that asks for them
    without = tmp_path / "without"
    SPEC.export_hf(GLA.build(FLAVOURS["tiny"], seed=0), FLAVOURS["tiny"], without)
    with pytest.raises(AssayError, match="q_conv1d"):
        SPEC.load(without, overrides="short_conv=true")


def test_conv_size_below_two_is_a_clear_error_and_tensor_parallel_splits_the_filters():
    with pytest.raises(AssayError, match="conv_size"):
        replace(ARGS, conv_size=1)
    from assay.models.common.tp_plan import TP
    from assay.models.gla.parallelize import tp_plan

    SPEC.check_tp(ARGS, 2)  # no longer refused (tests/models/test_gla_model.py runs it on 2 ranks)
    plan = tp_plan(None, ARGS)
    assert all(plan[f"attention.{name}_conv"] is TP.CHANNELWISE for name in "qkv") and plan["attention.wq"] is TP.COLWISE
    with pytest.raises(AssayError, match="n_heads=4"):
        SPEC.check_tp(ARGS, 3)


def test_transformers_generate_and_the_engine_carry_the_conv_state(tmp_path):
    from transformers import AutoModelForCausalLM

    from assay.serve import Engine, EngineConfig, run_to_completion
    from assay.serve.runner.weights import load_slot_model

    model = _model()
    SPEC.export_hf(model, ARGS, tmp_path)
    prompt = _tokens(1, 23, seed=3)
    expected = model.generate(prompt, 12)

    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        output = hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert output.tolist() == expected.tolist()  # greedy: prefill, then one step per token from the cached conv window

    slot_model = load_slot_model(tmp_path, torch.device("cpu"), 64)
    engine = Engine(slot_model, EngineConfig(max_seqs=2, buckets=(1, 2), eager=True))
    assert engine.pool.bytes_per_slot() == state_bytes_per_sequence(ARGS)
    other = _tokens(1, 9, seed=4)
    engine.add_request("a", prompt[0].tolist(), max_tokens=12)
    engine.add_request("b", other[0].tolist(), max_tokens=12)
    results = run_to_completion(engine)
    assert results["a"] == expected[0, 23:].tolist()
    assert results["b"] == model.generate(other, 12)[0, 9:].tolist()


def test_filters_start_as_flas_model_draws_them():
    # fla's GLAForCausalLM._init_weights draws every nn.Conv1d (its ShortConvolution) normal(0, initializer_range)
    # with a zero bias; the native build and Transformers' random init do the same (docs/gla.md: the recall
    # recipe converges with either draw, measured in recall_conv_init_ab.json (a one-off run, in the git history of bench/results/)).
    from assay.models.gla.hf_config import GLAConfig
    from assay.models.gla.hf_model import GLAForCausalLM

    args = replace(ARGS, dim=256, conv_bias=True)  # 768 filters of 4 taps: a sample's std within 10% of the draw's
    hf = GLAForCausalLM(GLAConfig(**args.to_hf_config()))
    for model, std in ((GLA.build(args, seed=0, std=0.05), 0.05), (hf.model, hf.config.initializer_range)):
        for name in ("q_conv", "k_conv", "v_conv"):
            conv = getattr(model.layers[0].attention, name)
            assert abs(conv.weight.std().item() - std) < 0.1 * std, (name, conv.weight.std().item(), std)
            assert torch.equal(conv.bias, torch.zeros_like(conv.bias))
