"""The native Llama against Transformers' LlamaForCausalLM: loading, logits, export, training paths,
FSDP2/TP, serving.

Tolerances: logits with ("model_logits", float32), relative error <= 1e-5 against Transformers run in
float64 (the native model runs float32: only rounding separates them); losses with ("train_loss",
float32) <= 1e-4.
"""

from __future__ import annotations

import json

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models.llama import SPEC, LlamaArgs

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
VARIANTS = {
    "tied": dict(model_type="llama", tie_word_embeddings=True),
    "untied-bias-llama3": dict(model_type="llama", tie_word_embeddings=False, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3_ROPE),
    "mistral-dense": dict(model_type="mistral", tie_word_embeddings=False, sliding_window=None),
}


def _transformers_checkpoint(folder, variant: str, sharded: bool = False):
    """A random Transformers checkpoint of the variant (biases random too), saved without `architectures`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    options = dict(VARIANTS[variant])
    config = AutoConfig.for_model(
        options.pop("model_type"), vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, **options,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.02)
    model.save_pretrained(folder, max_shard_size="40KB" if sharded else "5GB")
    config_path = folder / "config.json"
    saved = json.loads(config_path.read_text())
    saved.pop("architectures", None)  # GGUF conversions and hand-written configs often lack it
    config_path.write_text(json.dumps(saved))
    return model


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_transformers_within_float32_rounding(variant, tmp_path):
    reference = _transformers_checkpoint(tmp_path, variant, sharded=variant == "tied").double()
    model, args = SPEC.load(tmp_path)
    assert args.tie_embeddings == (variant == "tied")
    assert args.hf_model_type == VARIANTS[variant]["model_type"]
    tokens = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(1))  # past the llama3 original 32
    with torch.no_grad():
        assert_close("model_logits", model(tokens).double(), reference(input_ids=tokens).logits, torch.float32)


def test_a_sharded_checkpoint_loads(tmp_path):
    _transformers_checkpoint(tmp_path, "tied", sharded=True)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model, _ = SPEC.load(tmp_path)
    assert model.output.weight is model.tok_embeddings.weight


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_reloads_in_transformers_with_every_key(variant, tmp_path):
    from transformers import AutoModelForCausalLM

    _transformers_checkpoint(tmp_path / "source", variant)
    model, args = SPEC.load(tmp_path / "source")
    SPEC.export_hf(model, args, tmp_path / "out")
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close("model_logits", reloaded.eval()(input_ids=tokens).logits.double(), model(tokens).double(), torch.float32)


def test_configs_it_cannot_run_are_refused_with_the_reason():
    base = {"model_type": "mistral", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 8, "max_position_embeddings": 64}
    with pytest.raises(AssayError, match="sliding_window=16 < max_position_embeddings=64"):
        LlamaArgs.from_hf_config(base | {"sliding_window": 16})
    with pytest.raises(AssayError, match="rope_type 'yarn'"):
        LlamaArgs.from_hf_config(base | {"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(AssayError, match="hidden_act is 'gelu'"):
        LlamaArgs.from_hf_config(base | {"model_type": "llama", "hidden_act": "gelu"})


# ---------------------------------------------------------------- through the trainer (the zoo's tied Llama)


@pytest.mark.slow
def test_native_and_native_with_kernels_start_at_the_hf_paths_loss(zoo_dir):
    from assay.train import TrainRequest, train

    common = dict(model=str(zoo_dir / "llama"), steps=2, batch=2, seq_len=32)
    hf = train(TrainRequest(path="hf", **common))
    native = train(TrainRequest(path="native", **common))
    kernels = train(TrainRequest(path="native", kernels=("rope", "attention"), **common))
    assert native.model.family.name == "llama"
    assert len(kernels.kernels) == 2 * 2 and all(line.startswith("layers.") for line in kernels.kernels)  # 2 kernels x 2 layers
    for result in (native, kernels):
        assert_close("train_loss", torch.tensor(result.losses), torch.tensor(hf.losses), torch.float32)
    assert native.summary["flops_per_token"] == hf.summary["flops_per_token"]


@pytest.mark.distributed
@pytest.mark.parametrize("flags", [["--dp-shard", "2"], ["--tp", "2"]], ids=["fsdp2", "tp2"])
def test_fsdp2_and_tp_at_two_ranks_match_one_process(zoo_dir, flags):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from helpers.cli import run_torchrun  # torchrun in a subprocess, killed on timeout

    from assay.train import TrainRequest, train

    single = train(TrainRequest(model=str(zoo_dir / "llama"), steps=2, batch=4, seq_len=32)).losses
    completed = run_torchrun(2, "train", "--model", str(zoo_dir / "llama"), "--steps", "2", "--batch", "4", "--seq-len", "32", "--json", *flags)
    assert completed.returncode == 0, completed.stderr[-4000:]
    records = json.loads(completed.stdout)["records"]
    assert_close("train_loss", torch.tensor([r["loss"] for r in records]), torch.tensor(single), torch.float32)
