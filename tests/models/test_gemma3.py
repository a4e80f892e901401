"""The native Gemma 3 (text) against Transformers' Gemma3ForCausalLM: logits, config reading, export, the
first training step; and served through the engine with its sliding window kept in a ring per slot.

Tolerances: logits with ("model_logits", float32), relative error <= 1e-5 against Transformers run in
float64 (the native model runs float32: only rounding separates them); the first training loss with
("train_loss", float32) <= 1e-4; compiled-bucket vs eager decode logits with ("compiled_vs_eager",
float32) <= 1e-4 (aot_eager reorders nothing, so they agree far inside it).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import assert_close, tolerance
from assay.models import registry
from assay.models.gemma3 import FLAVOURS, Gemma3Args
from assay.models.gemma3.args import FULL, SLIDING

SPEC = registry.get("gemma3")
# Each of Gemma 3's switches on: both layer kinds with a window far shorter than the sequence, a query scale
# other than head_dim ** -0.5, a linearly scaled global rotary, a final logit soft-cap, trained-looking norms.
VARIANTS = {
    "zoo-like": dict(sliding_window=16, layer_types=[SLIDING, SLIDING]),
    "mixed": dict(sliding_window=7, layer_types=[SLIDING, FULL, SLIDING], query_pre_attn_scalar=24, final_logit_softcapping=5.0,
                  rope_parameters={FULL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                                   SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
}


def _transformers_checkpoint(folder, variant: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    options = VARIANTS[variant]
    config = AutoConfig.for_model(
        "gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=len(options["layer_types"]),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, **options,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:  # Transformers starts them at 0 (a unit scale): make (1 + weight) matter
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_transformers_within_float32_rounding(variant, tmp_path):
    reference = _transformers_checkpoint(tmp_path, variant).double()
    model, args = SPEC.load(tmp_path)
    assert list(args.layer_types) == VARIANTS[variant]["layer_types"] and args.tie_embeddings
    tokens = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(1))  # 50 tokens: past every window
    with torch.no_grad():
        assert_close("model_logits", model(tokens).double(), reference(input_ids=tokens).logits, torch.float32)


def test_the_zoo_gemma3_logits_equal_transformers(zoo_dir):
    from transformers import AutoModelForCausalLM

    model, args = SPEC.load(zoo_dir / "gemma3")
    assert args.sliding_window == 16 and set(args.layer_types) == {SLIDING}
    reference = AutoModelForCausalLM.from_pretrained(zoo_dir / "gemma3", dtype=torch.float64).eval()
    tokens = torch.randint(3, 1024, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close("model_logits", model(tokens).double(), reference(input_ids=tokens).logits, torch.float32)


def test_export_reloads_in_transformers_with_every_key(tmp_path):
    from transformers import AutoModelForCausalLM

    _transformers_checkpoint(tmp_path / "source", "mixed")
    model, args = SPEC.load(tmp_path / "source")
    SPEC.export_hf(model, args, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["layer_types"] == [SLIDING, FULL, SLIDING]
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close("model_logits", reloaded.eval()(input_ids=tokens).logits.double(), model(tokens).double(), torch.float32)
    assert SPEC.load(tmp_path / "out")[1] == args


def test_an_older_config_json_reads_the_same():
    # Before Transformers 5: rope_theta / rope_local_base_freq / rope_scaling at the top level, the layer kinds
    # from sliding_window_pattern.
    old = {"model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 7,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 4, "sliding_window_pattern": 6,
           "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
           "query_pre_attn_scalar": 16}
    args = Gemma3Args.from_hf_config(old)
    assert args.layer_types == (SLIDING,) * 5 + (FULL, SLIDING)
    assert (args.rope_theta, args.rope_local_theta, args.rope_factor) == (1e6, 1e4, 8.0)
    assert Gemma3Args.from_hf_config(args.to_hf_config()) == args


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_bidirectional_attention": True}, "attends causally"),
        ({"attn_logit_softcapping": 50.0}, "does not apply"),
        ({"hidden_activation": "relu"}, "hidden_activation is 'relu'"),
        ({"rope_parameters": {FULL: {"rope_type": "yarn", "factor": 4.0}, SLIDING: {"rope_type": "default"}}}, "rope_type 'yarn'"),
        ({"model_type": "gemma3"}, "reads 'gemma3_text'"),
    ],
)
def test_configs_it_cannot_run_are_refused_with_the_reason(change, message):
    with pytest.raises(AssayError, match=message):
        Gemma3Args.from_hf_config(FLAVOURS["tiny"].to_hf_config() | change)


def test_fewer_layers_keep_their_kinds_and_the_one_billion_flavour_counts_right():
    assert FLAVOURS["tiny"].with_overrides("layers=1").layer_types == (SLIDING,)
    assert FLAVOURS["tiny"].with_overrides("layers=3").layer_types == (SLIDING, FULL, SLIDING)
    from assay.models.common.counting import count_parameters

    # google/gemma-3-1b-pt's published parameter count, counted on the meta device.
    assert count_parameters(SPEC.build(FLAVOURS["1B"], "meta")).total == 999_885_952


@pytest.mark.slow
def test_the_first_training_step_loss_equals_the_transformers_path(zoo_dir):
    from assay.train import TrainRequest, train

    common = dict(model=str(zoo_dir / "gemma3"), steps=1, batch=2, seq_len=32)
    hf = train(TrainRequest(path="hf", **common))
    native = train(TrainRequest(path="native", **common))
    assert native.model.family.name == "gemma3" and math.isfinite(native.losses[0])
    assert_close("train_loss", torch.tensor(native.losses), torch.tensor(hf.losses), torch.float32)
    assert native.summary["flops_per_token"] == hf.summary["flops_per_token"]


@pytest.mark.distributed
def test_tensor_parallel_at_two_ranks_matches_one_process(zoo_dir):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from helpers.cli import run_torchrun  # torchrun in a subprocess, killed on timeout

    from assay.train import TrainRequest, train

    single = train(TrainRequest(model=str(zoo_dir / "gemma3"), steps=2, batch=4, seq_len=32)).losses
    completed = run_torchrun(2, "train", "--model", str(zoo_dir / "gemma3"), "--steps", "2", "--batch", "4", "--seq-len", "32",
                             "--json", "--tp", "2")
    assert completed.returncode == 0, completed.stderr[-4000:]
    records = json.loads(completed.stdout)["records"]
    assert_close("train_loss", torch.tensor([r["loss"] for r in records]), torch.tensor(single), torch.float32)


# ---------------------------------------------------------------- serving: the window in the KV slot


def test_a_sliding_layer_keeps_only_its_window_per_slot():
    args = FLAVOURS["tiny"]  # layer 0 sliding (window 8), layer 1 global
    model = SPEC.build(args, "cpu")
    cache = model.init_kv_cache(3, 64)
    assert [k.shape[1] for k, _ in cache] == [8, 64]
    per_layer = 2 * args.n_kv_heads * args.head_dim * 4  # k and v, float32, per position
    assert SPEC.state_bytes_per_sequence(args, 64) == per_layer * (8 + 64)
    assert SPEC.state_bytes_per_sequence(args, 4) == per_layer * (4 + 4)
    # The engine's "its own cache" reference at 2,048 and 8,192 tokens counts the window too.
    reference = SPEC.wrap_slot_model(model, args).kv_reference()
    assert reference.bytes_per_sequence(2048, torch.float32) == per_layer * (2048 + 8) and "1 of 2 layers a window of 8" in reference.note
    # The FLOP count's attention term: the sliding layer attends over its window, not the whole context.
    shape = SPEC.flop_shape(args)
    assert shape.window_layers == ((1, 8),) and shape.train_flops_per_token(64) < SPEC.flop_shape(
        args.with_overrides({"layer_types": (FULL, FULL)})).train_flops_per_token(64)


def test_prefill_and_decode_past_the_window_equal_forward():
    args = FLAVOURS["tiny"]
    model = SPEC.build(args, "cpu")
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    model.eval()
    tokens = torch.randint(3, 1024, (2, 30), generator=torch.Generator().manual_seed(4))
    cache = model.init_kv_cache(4, 32)
    slots = torch.tensor([2, 0])
    with torch.no_grad():
        reference = model.double()(tokens).float()
        model.float()
        steps = [model.prefill(tokens[:, :11], cache, slots)]  # 11 > the window of 8: the ring wraps in prefill
        for position in range(11, 30):
            steps.append(model.decode_step(tokens[:, position:position + 1], cache, slots, torch.tensor([position, position])))
    assert_close("model_logits", torch.cat(steps, dim=1), reference, torch.float32)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from assay.zoo.native import TOKEN_IDS
    from assay.zoo.tokenizer import write_tokenizer

    folder = tmp_path_factory.mktemp("tiny-gemma3")
    write_tokenizer(folder)
    model = SPEC.build(FLAVOURS["tiny"], "cpu")
    model.init_weights(std=0.1, generator=torch.Generator().manual_seed(0))
    SPEC.export_hf(model, FLAVOURS["tiny"], folder, None, extra_config=TOKEN_IDS)
    return folder


PROMPTS = [list(range(40, 60)), [5, 6, 7], list(range(300, 312)), [900, 3, 17, 18, 19, 20, 21, 22, 23]]


def _greedy_full_forward(model, prompt: list[int], n: int) -> list[int]:
    """The reference without a cache: the whole sequence through forward() for each new token."""
    sequence = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            sequence = torch.cat([sequence, model(sequence)[:, -1:].argmax(-1)], dim=1)
    return sequence[0, len(prompt):].tolist()


@pytest.mark.slow
def test_the_engine_serves_it_compiled_buckets_agree_with_eager_and_with_its_own_greedy(tiny_checkpoint):
    from assay.serve import Engine, EngineConfig, run_to_completion

    results = {}
    for name, options in {"eager": dict(eager=True), "compiled": dict(backend="aot_eager", check_eager=True)}.items():
        engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_seqs=4, buckets=(1, 2, 4), max_len=48, **options))
        for index, prompt in enumerate(PROMPTS):  # the first prompt (20 tokens) is longer than the window (8)
            engine.add_request(f"r{index}", prompt, max_tokens=12)
        results[name] = (run_to_completion(engine), engine)
    tokens, engine = results["compiled"]
    assert tokens == results["eager"][0]
    check = engine.stats().as_dict()["eager_check"]
    assert check["steps"] > 0 and check["max_rel"] <= tolerance("compiled_vs_eager", torch.float32)
    for index, prompt in enumerate(PROMPTS):
        assert tokens[f"r{index}"] == _greedy_full_forward(engine.slot_model.model, prompt, 12), f"request r{index}"
    # The pool holds what the slots keep: 48 positions for the global layer, a ring of 8 for the sliding one.
    args = engine.slot_model.args
    assert engine.stats().memory.state_bytes_per_sequence == 2 * args.n_kv_heads * args.head_dim * 4 * (48 + 8)
