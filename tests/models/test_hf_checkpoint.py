"""Hugging Face checkpoint portability of the native Qwen3: load (single file, sharded, sliced), export,
and reload with Transformers.

Checkpoints are real Transformers models built from tiny configs and saved locally (no Hub).
Logit comparisons use the ("model_logits", float32) tolerance: relative error <= 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from assay.core.errors import AssayError
from assay.core.numerics import assert_close, rel_error
from assay.models.hf_checkpoint import INDEX_FILE, SINGLE_FILE, read_hf_state_dict
from assay.models.qwen3 import SPEC, Qwen3Args

TINY_DENSE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    initializer_range=0.1, eos_token_id=3, bos_token_id=2,
)
TINY_MOE = dict(TINY_DENSE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


def build_tiny_hf(moe: bool, **overrides):
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if moe:
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**TINY_MOE, **overrides})).eval()
    return Qwen3ForCausalLM(Qwen3Config(**{**TINY_DENSE, **overrides})).eval()


def save_tiny_hf(folder: Path, moe: bool, max_shard_size: str | None = None, **overrides) -> Path:
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    build_tiny_hf(moe, **overrides).save_pretrained(folder, **kwargs)
    # Stand-ins for a tokenizer: export copies these files byte for byte.
    (folder / "tokenizer.json").write_text('{"model": "stand-in"}')
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<|end|>"}')
    return folder


def disk_keys(folder: Path) -> set[str]:
    return set(read_hf_state_dict(folder))


def reload_with_transformers(folder: Path):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


def random_tokens(batch: int = 2, seq_len: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 512, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def train_steps(model, steps: int = 2) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        tokens = random_tokens(seed=10 + step)
        logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.fixture(scope="module")
def moe_checkpoints(tmp_path_factory):
    """The same 3-layer, 8-expert MoE saved as one file and sharded (an index and several files)."""
    root = tmp_path_factory.mktemp("moe")
    single = save_tiny_hf(root / "single", moe=True, num_hidden_layers=3)
    sharded = save_tiny_hf(root / "sharded", moe=True, max_shard_size="50KB", num_hidden_layers=3)
    return single, sharded


# ---------------------------------------------------------------- load


def test_single_file_and_sharded_checkpoints_load_the_same_weights(moe_checkpoints):
    single, sharded = moe_checkpoints
    assert (single / SINGLE_FILE).is_file() and not (single / INDEX_FILE).exists()
    assert (sharded / INDEX_FILE).is_file() and len(list(sharded.glob("model-*.safetensors"))) > 1
    single_model, single_args = SPEC.load(single)
    sharded_model, sharded_args = SPEC.load(sharded / INDEX_FILE)  # a file inside the folder works too
    assert single_args == sharded_args
    single_state, sharded_state = single_model.state_dict(), sharded_model.state_dict()
    assert single_state.keys() == sharded_state.keys()
    assert all(torch.equal(single_state[key], sharded_state[key]) for key in single_state)


def test_transformers_saves_moe_experts_per_expert_on_disk(moe_checkpoints):
    # Transformers 5 fuses experts in memory (gate_up_proj [E, 2I, D]) but writes one tensor per expert.
    keys = disk_keys(moe_checkpoints[0])
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in keys
    assert "model.layers.0.mlp.gate.weight" in keys
    assert not any(key.endswith("gate_up_proj") for key in keys)


def test_fused_in_memory_expert_layout_loads_like_the_disk_layout(moe_checkpoints):
    from transformers import AutoModelForCausalLM

    folder = moe_checkpoints[0]
    args = Qwen3Args.from_hf_config(json.loads((folder / "config.json").read_text()))
    fused_state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused_state
    from_fused = SPEC.from_hf(fused_state, args)
    from_disk = SPEC.from_hf(read_hf_state_dict(folder), args)
    assert from_fused.keys() == from_disk.keys()
    assert all(torch.equal(from_fused[key], from_disk[key]) for key in from_disk)


def test_load_in_bfloat16_keeps_tied_embedding_shared(tmp_path):
    folder = save_tiny_hf(tmp_path / "dense", moe=False, tie_word_embeddings=True)
    model, args = SPEC.load(folder, dtype=torch.bfloat16)
    assert args.tie_embeddings
    assert model.output.weight is model.tok_embeddings.weight
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(random_tokens()).dtype == torch.bfloat16


# ---------------------------------------------------------------- reduced MoE (the guide's 4-layer, 64-expert cut)


def test_reduced_moe_spec_is_refused_without_slice_experts(moe_checkpoints):
    with pytest.raises(AssayError) as refused:
        SPEC.load(moe_checkpoints[0], overrides="layers=2,experts=4")
    message = str(refused.value)
    assert "2 of its 3 layers" in message and "4 of its 8 experts" in message and "allow_sliced_checkpoint=True" in message


def test_reduced_moe_with_slice_experts_matches_a_reduced_transformers_model(moe_checkpoints):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    single, sharded = moe_checkpoints
    model, args = SPEC.load(sharded, overrides="layers=2,experts=4", allow_sliced_checkpoint=True)
    assert (args.n_layers, args.n_experts, args.top_k) == (2, 4, 2)
    assert len(model.layers) == 2
    experts = model.layers[1].moe.experts
    assert experts.w1.shape == (4, 32, 64) and experts.w3.shape == (4, 32, 64) and experts.w2.shape == (4, 64, 32)
    assert model.layers[1].moe.router.weight.shape == (4, 64)

    # Independent of the adapter: slice Transformers' own in-memory state dict by hand.
    full = build_tiny_hf(moe=True, num_hidden_layers=3)
    reduced = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**TINY_MOE, "num_hidden_layers": 2, "num_experts": 4})).eval()
    sliced_state = {}
    for key, tensor in full.state_dict().items():
        if key.startswith("model.layers.2."):
            continue
        if key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight")):
            tensor = tensor[:4]
        sliced_state[key] = tensor
    reduced.load_state_dict(sliced_state, strict=True)
    tokens = random_tokens()
    with torch.no_grad():
        assert_close("model_logits", model(tokens), reduced(tokens).logits, torch.float32)


def test_spec_larger_than_checkpoint_is_refused(moe_checkpoints):
    with pytest.raises(AssayError, match="asks for 4 layers but the checkpoint has 3"):
        SPEC.load(moe_checkpoints[0], overrides="layers=4", allow_sliced_checkpoint=True)
    with pytest.raises(AssayError, match="asks for 16 experts"):
        SPEC.load(moe_checkpoints[0], overrides="experts=16", allow_sliced_checkpoint=True)


def test_spec_with_other_sizes_names_the_mismatched_tensors(moe_checkpoints):
    with pytest.raises(AssayError, match=r"do not fit the Qwen3 spec: .*moe.experts.w1 \(8, 32, 64\) vs spec \(8, 48, 64\)"):
        SPEC.load(moe_checkpoints[0], overrides="moe_hidden=48")


def test_missing_and_unexpected_keys_are_named(tmp_path):
    model = build_tiny_hf(moe=False, tie_word_embeddings=False)
    args = Qwen3Args.from_hf_config(model.config)
    state = dict(model.state_dict())
    missing = dict(state)
    del missing["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(AssayError, match=r"lacks 1 tensors .*model\.layers\.1\.self_attn\.k_norm\.weight"):
        SPEC.from_hf(missing, args)
    extra = dict(state, **{"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)})
    with pytest.raises(AssayError, match=r"does not use: model\.layers\.0\.self_attn\.q_proj\.bias"):
        SPEC.from_hf(extra, args)


def test_folder_without_config_or_weights_is_refused(tmp_path):
    with pytest.raises(AssayError, match="no checkpoint"):
        SPEC.load(tmp_path / "absent")
    with pytest.raises(AssayError, match="has no config.json"):
        SPEC.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(Qwen3Args(**_tiny_args()).to_hf_config()))
    with pytest.raises(AssayError, match="neither model.safetensors"):
        SPEC.load(tmp_path)
    (tmp_path / SINGLE_FILE).write_bytes(b"\x00\x01 not safetensors")
    with pytest.raises(AssayError, match="cannot read"):
        SPEC.load(tmp_path)


def _tiny_args() -> dict:
    return dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128)


# ---------------------------------------------------------------- export


@pytest.mark.parametrize("moe, tied", [(False, True), (True, False)], ids=["dense-tied", "moe"])
def test_export_after_training_reloads_in_transformers_with_equal_logits(tmp_path, moe, tied):
    source = save_tiny_hf(tmp_path / "source", moe=moe, tie_word_embeddings=tied)
    model, args = SPEC.load(source)
    train_steps(model, steps=2)
    out = tmp_path / "export"
    SPEC.export_hf(model, args, out, tokenizer_source_dir=source)

    exported_keys = disk_keys(out)
    assert exported_keys == disk_keys(source)  # same on-disk layout as Transformers' own save_pretrained
    assert ("lm_head.weight" in exported_keys) == (not tied)
    reloaded, info = reload_with_transformers(out)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    if tied:
        assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()

    tokens = random_tokens(seed=99)
    with torch.no_grad():
        native_logits = model(tokens)
        assert_close("model_logits", native_logits, reloaded(tokens).logits, torch.float32)
        source_logits = reload_with_transformers(source)[0](tokens).logits
    assert rel_error(native_logits, source_logits) > 1e-2  # the steps changed the weights: the check is not vacuous


def test_export_copies_tokenizer_files_generation_config_and_token_ids(tmp_path):
    source = save_tiny_hf(tmp_path / "source", moe=False)
    model, args = SPEC.load(source)
    out = tmp_path / "export"
    SPEC.export_hf(model, args, out, tokenizer_source_dir=source)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert (config["eos_token_id"], config["bos_token_id"], config["dtype"]) == (3, 2, "float32")
    assert not list(out.glob(".*.tmp"))  # atomic writes left no temporaries


def test_export_shards_over_the_limit_and_a_later_export_removes_stale_shards(tmp_path):
    source = save_tiny_hf(tmp_path / "source", moe=True)
    model, args = SPEC.load(source)
    out = tmp_path / "export"
    SPEC.export_hf(model, args, out, max_shard_bytes=64 * 1024)
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (out / INDEX_FILE).is_file()
    index = json.loads((out / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == disk_keys(source)
    with safe_open(str(shards[0]), "pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    reloaded, info = reload_with_transformers(out)
    assert not info["unexpected_keys"] and not info["missing_keys"]

    SPEC.export_hf(model, args, out)  # now one file: the index and the old shards must go
    assert sorted(path.name for path in out.glob("model*")) == [SINGLE_FILE]
    assert disk_keys(out) == disk_keys(source)


def test_export_of_a_sliced_moe_reloads_as_the_reduced_architecture(moe_checkpoints, tmp_path):
    model, args = SPEC.load(moe_checkpoints[0], overrides="layers=2,experts=4", allow_sliced_checkpoint=True)
    SPEC.export_hf(model, args, tmp_path / "reduced", tokenizer_source_dir=moe_checkpoints[0])
    reloaded, info = reload_with_transformers(tmp_path / "reduced")
    assert (reloaded.config.num_hidden_layers, reloaded.config.num_experts) == (2, 4)
    assert not info["unexpected_keys"] and not info["missing_keys"]
    tokens = random_tokens()
    with torch.no_grad():
        assert_close("model_logits", model(tokens), reloaded(tokens).logits, torch.float32)
