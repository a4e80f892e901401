"""The model paths behind one trainer: native and hf train alike, export reloads, --check-init tells
loaded weights from random ones, the kernel seam, the family registry.

Loss curves are compared with the ("train_loss", float32) tolerance: relative error <= 1e-4 over the
vector of per-step losses. Exported logits with ("model_logits", float32): <= 1e-5.
"""

from __future__ import annotations

import math

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models import registry
from assay.train import DataSource, OptimConfig, TrainRequest, train

STEPS = 4


def losses(result) -> torch.Tensor:
    return torch.tensor(result.losses, dtype=torch.float64)


@pytest.mark.parametrize("entry", ["qwen3", "qwen3-moe"])
def test_native_and_hf_give_the_same_losses_for_the_same_checkpoint(train_zoo, entry):
    native = train(TrainRequest(model=str(train_zoo / entry), path="native", steps=STEPS, seq_len=64))
    hf = train(TrainRequest(model=str(train_zoo / entry), path="hf", steps=STEPS, seq_len=64))
    assert len(native.losses) == STEPS
    assert_close("train_loss", losses(native), losses(hf), torch.float32)
    # the same optimizer saw the same gradients: grad norms agree too
    assert_close("train_loss", torch.tensor([r["grad_norm"] for r in native.records]), torch.tensor([r["grad_norm"] for r in hf.records]), torch.float32)
    # FLOPs are counted the same way on both paths (hf through the family's own count)
    assert native.summary["flops_per_token"] == hf.summary["flops_per_token"]


def test_loss_falls_on_a_small_local_text(train_zoo, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("A list is a mutable sequence; a tuple is an immutable one. " * 6)  # a few windows, seen again and again
    request = TrainRequest(model=str(train_zoo / "qwen3"), steps=12, batch=2, seq_len=16, data=DataSource(str(text)), optim=OptimConfig(lr=3e-3))
    result = train(request)
    assert result.losses[-1] < 0.7 * result.losses[0]


def test_every_step_record_has_the_design_fields(train_zoo):
    result = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=3, seq_len=32, peak_flops="1e11"))
    for record in result.records:
        assert {"step", "loss", "grad_norm", "tokens_per_s", "mfu", "memory_bytes", "warmup", "lr", "tokens"} <= set(record)
        assert record["memory_bytes"] > 0 and record["tokens_per_s"] > 0 and 0 < record["mfu"] < 1
    assert [r["warmup"] for r in result.records] == [True, False, False]
    assert result.summary["warmup_steps"] == 1 and result.summary["steady_steps"] == 2
    # warmup + cosine: the first step runs at the peak after one warmup step, then it decays
    lrs = [r["lr"] for r in result.records]
    assert lrs[0] == pytest.approx(1e-3) and lrs[1] > lrs[2]


def test_moe_with_spec_and_sliced_experts_counts_only_active_experts(train_zoo):
    result = train(TrainRequest(model=str(train_zoo / "qwen3-moe"), overrides="layers=1,experts=4,top_k=2", allow_sliced_checkpoint=True, steps=2, seq_len=32))
    summary = result.summary
    args = result.model.args
    assert (args.n_layers, args.n_experts, args.top_k) == (1, 4, 2)
    experts = result.model.model.layers[0].moe.experts
    per_expert = (experts.w1.numel() + experts.w2.numel() + experts.w3.numel()) // 4
    # 4 experts stored, 2 active per token
    assert summary["active_matmul_params"] < summary["params_total"] - 2 * per_expert
    assert all(math.isfinite(loss) for loss in result.losses)


def test_a_spec_larger_than_the_checkpoint_is_a_clear_error(train_zoo):
    with pytest.raises(AssayError, match="spec asks for 16 experts but the checkpoint's MoE layers have 8"):
        train(TrainRequest(model=str(train_zoo / "qwen3-moe"), overrides="experts=16", steps=1))


def test_flavour_builds_a_random_model_of_that_size(train_zoo):
    result = train(TrainRequest(model=str(train_zoo / "qwen3"), flavour="tiny", overrides="layers=1", steps=1, seq_len=32))
    assert result.model.args.n_layers == 1
    assert result.losses[0] == pytest.approx(math.log(1024), abs=0.1)  # random init at 0.02: near uniform


@pytest.mark.parametrize("path", ["native", "hf"])
def test_export_reloads_in_transformers_with_the_trained_models_logits(train_zoo, tmp_path, path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / f"export-{path}"
    result = train(TrainRequest(model=str(train_zoo / "qwen3"), path=path, steps=2, seq_len=32, export_hf=out))
    tokens = torch.randint(0, 1024, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained = result.model.logits(tokens)
        reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(tokens).logits
        original = AutoModelForCausalLM.from_pretrained(train_zoo / "qwen3", dtype=torch.float32)(tokens).logits
    assert_close("model_logits", reloaded, trained, torch.float32)
    assert not torch.allclose(original, trained)  # the export holds the trained weights, not the loaded ones
    assert AutoTokenizer.from_pretrained(out).eos_token_id == AutoTokenizer.from_pretrained(train_zoo / "qwen3").eos_token_id


@pytest.mark.parametrize("path", ["native", "hf"])
def test_check_init_says_pretrained_weights_loaded(train_zoo, path):
    result = train(TrainRequest(model=str(train_zoo / "qwen3-pretrained"), path=path, steps=0, check_init=True))
    check = result.check_init
    assert check.weights_loaded, check.verdict
    assert check.loaded_loss < 0.8 * check.random_loss
    assert check.ln_vocab == pytest.approx(math.log(1024))
    assert abs(check.random_loss - check.ln_vocab) < 0.1
    assert check.verdict.startswith("weights loaded")


def test_check_init_says_random_weights_did_not_load(train_zoo):
    # zoo/qwen3 holds random weights: its loss is at (here above) random init, as if loading had failed
    result = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=5, check_init=True))
    assert not result.check_init.weights_loaded
    assert "NOT loaded" in result.check_init.verdict
    assert result.records == []  # stops before training


def test_native_with_rope_kernel_trains_like_native(train_zoo):
    plain = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=3, seq_len=32))
    kernels = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=3, seq_len=32, kernels=("rope",)))
    assert len(kernels.kernels) == 2 and all("rope" in line for line in kernels.kernels)  # one per layer
    assert_close("train_loss", losses(kernels), losses(plain), torch.float32)


def test_kernels_filter_and_dry_run_report_without_training(train_zoo):
    result = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=3, kernels=("rope",), kernels_filter="layers.0.*", kernels_dry_run=True))
    assert [line.split(":")[0] for line in result.kernels] == ["layers.0.attention.rope"]
    assert result.records == []
    assert not hasattr(result.model.model.layers[0].attention.rope, "_assay_kernel")  # nothing replaced


def test_kernels_need_the_native_path(train_zoo):
    with pytest.raises(AssayError, match="use it with --path native"):
        train(TrainRequest(model=str(train_zoo / "qwen3"), path="hf", kernels=("rope",), steps=1))


def test_native_models_are_keyed_by_model_type(train_zoo):
    assert registry.for_model_type("qwen3") is registry.for_model_type("qwen3_moe") is registry.get("qwen3")
    assert registry.for_model_type("llama") is registry.for_model_type("mistral") and registry.for_model_type("llama").name == "llama"
    with pytest.raises(AssayError, match="no native model for model_type 'gpt2'.*--path hf"):
        train(TrainRequest(model=str(train_zoo / "gpt2"), path="native", steps=1))
