"""The native Qwen3 (dense and MoE): same logits as Transformers, spec handling, sizes, tensor parallelism.

Checkpoints are real Transformers models built from tiny configs and saved locally (no Hub).
Logit comparisons use the ("model_logits", float32) tolerance: relative error <= 1e-5.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models.common.counting import count_parameters
from assay.models.qwen3 import FLAVOURS, SPEC, Qwen3, Qwen3Args

TINY_DENSE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    # A wider init than Transformers' 0.02 makes the routing decisive and the logits far from uniform.
    initializer_range=0.1,
)
TINY_MOE = dict(TINY_DENSE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def save_tiny_hf(folder: Path, moe: bool, **overrides) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if moe:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**TINY_MOE, **overrides}))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**{**TINY_DENSE, **overrides}))
    model.save_pretrained(folder)
    return folder


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def random_tokens(vocab_size: int = 512, batch: int = 2, seq_len: int = 24) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "name, moe, overrides",
    [
        ("dense-tied", False, dict(tie_word_embeddings=True)),
        ("dense-untied", False, dict(tie_word_embeddings=False)),
        ("moe", True, dict(norm_topk_prob=False)),
        # Renormalised top-k weights, and a dense layer inside an MoE model (Transformers' mlp_only_layers).
        ("moe-normtopk-mixed", True, dict(norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=True)),
    ],
)
def test_native_logits_equal_transformers_float32(tmp_path, name, moe, overrides):
    folder = save_tiny_hf(tmp_path / name, moe, **overrides)
    tokens = random_tokens()
    model, args = SPEC.load(folder)
    assert args.is_moe == moe
    with torch.no_grad():
        native = model(tokens)
    assert native.shape == (2, 24, 512)
    assert_close("model_logits", native, hf_logits(folder, tokens), torch.float32)


def test_native_bfloat16_logits_within_tolerance_of_float64_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    # Transformers' own 0.02 init: the wider test init inflates activations past bf16's stated tolerance
    # for Transformers' bf16 model as much as for the native one.
    folder = save_tiny_hf(tmp_path / "moe", moe=True, norm_topk_prob=True, initializer_range=0.02)
    tokens = random_tokens()
    # Transformers 5.24's default grouped_mm experts refuse float64; its eager loop is the float64 reference.
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, experts_implementation="eager").eval()
    hf_bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    model, _ = SPEC.load(folder, dtype=torch.bfloat16)
    with torch.no_grad():
        reference_logits = reference(tokens).logits
        native = assert_close("model_logits", model(tokens), reference_logits, torch.bfloat16)
        transformers = assert_close("model_logits", hf_bf16(tokens).logits, reference_logits, torch.bfloat16)
    # Same rounding order as Transformers: no worse than its own bf16 model.
    assert native.rel <= 1.5 * transformers.rel


def test_moe_layer_kinds_follow_transformers_rule():
    args = replace(FLAVOURS["tiny-moe"], n_layers=4, decoder_sparse_step=2, mlp_only_layers=(3,))
    model = Qwen3.build(args, device="meta")
    # (i + 1) % 2 == 0 -> layers 1 and 3 sparse, but 3 is listed as dense.
    assert [block.is_moe for block in model.layers] == [False, True, False, False]
    assert hasattr(model.layers[1], "moe") and hasattr(model.layers[0], "mlp")


def test_kernel_seams_have_stable_module_names():
    model = Qwen3.build(FLAVOURS["tiny-moe"], device="meta")
    names = dict(model.named_modules())
    for name in ("layers.0.attention", "layers.0.attention.rope", "layers.0.attention.sdpa", "layers.0.moe", "layers.0.moe.experts"):
        assert name in names, name
    assert "layers.0.mlp" in dict(Qwen3.build(FLAVOURS["tiny"], device="meta").named_modules())


def test_hf_config_round_trip_and_transformers_accepts_it():
    from transformers import AutoConfig, Qwen3Config, Qwen3MoeConfig

    for spec, config_class in ((FLAVOURS["tiny"], Qwen3Config), (replace(FLAVOURS["tiny-moe"], mlp_only_layers=(1,)), Qwen3MoeConfig)):
        hf_dict = spec.to_hf_config()
        assert Qwen3Args.from_hf_config(hf_dict) == spec
        hf_config = AutoConfig.for_model(**hf_dict)
        assert isinstance(hf_config, config_class)
        assert Qwen3Args.from_hf_config(hf_config) == spec


def test_hf_config_older_layout_with_top_level_rope_theta():
    # The published config.json files predate Transformers 5: rope_theta at the top, num_experts by that name.
    config = dict(FLAVOURS["tiny-moe"].to_hf_config())
    config.pop("rope_parameters")
    config["rope_theta"] = 5e6
    assert Qwen3Args.from_hf_config(config).rope_theta == 5e6


def test_hf_config_rejects_other_architectures():
    with pytest.raises(AssayError, match="llama"):
        Qwen3Args.from_hf_config({"model_type": "llama"})
    with pytest.raises(AssayError, match="rope_type"):
        Qwen3Args.from_hf_config({**FLAVOURS["tiny"].to_hf_config(), "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})


def test_spec_override_string_with_aliases():
    assert Qwen3Args.parse_overrides("layers=4,experts=8,top_k=2") == {"n_layers": 4, "n_experts": 8, "top_k": 2}
    spec = SPEC.apply_overrides(FLAVOURS["30B-A3B"], "layers=4, experts=64, top_k=4, tie=false, theta=1e6, mlp_only_layers=[0,2]")
    assert (spec.n_layers, spec.n_experts, spec.top_k, spec.tie_embeddings, spec.rope_theta) == (4, 64, 4, False, 1e6)
    assert spec.mlp_only_layers == (0, 2)
    assert SPEC.apply_overrides(FLAVOURS["tiny"], {"dim": 32, "heads": 2, "kv_heads": 1}).dim == 32
    assert SPEC.apply_overrides(FLAVOURS["tiny"], None) == FLAVOURS["tiny"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("layerz=4", "not a Qwen3 field"),
        ("layers=four", "not a valid int"),
        ("tie=maybe", "not a valid bool"),
        ("layers", "NAME=VALUE"),
        ("experts=4,top_k=8", "top_k=8 must be between 1 and n_experts=4"),
        ("heads=5", "not a multiple of n_kv_heads"),
    ],
)
def test_spec_override_errors_are_clear(text, message):
    with pytest.raises(AssayError, match=message):
        SPEC.apply_overrides(FLAVOURS["tiny-moe"], text)


def test_guide_4b_from_32b_builder_is_the_4b_flavour():
    guide_4b = replace(FLAVOURS["32B"], dim=2560, n_layers=36, n_heads=32, hidden_dim=9728, tie_embeddings=True)
    assert guide_4b == FLAVOURS["4B"]


@pytest.mark.parametrize(
    "name, total, active_with_embedding",
    [
        # Published sizes: total parameters, and (for MoE) activated parameters per token.
        ("0.6B", 0.60e9, None),
        ("4B", 4.02e9, None),
        ("32B", 32.8e9, None),
        ("30B-A3B", 30.5e9, 3.3e9),
        ("235B-A22B", 235e9, 22e9),
    ],
)
def test_flavour_parameter_counts_match_published_sizes(name, total, active_with_embedding):
    counts = count_parameters(Qwen3.build(FLAVOURS[name], device="meta"))
    assert counts.total == pytest.approx(total, rel=0.01)
    if active_with_embedding is None:
        # Dense: every matmul weight is active; a tied head is counted as a matmul but once in the total.
        tied_head = counts.embedding if FLAVOURS[name].tie_embeddings else 0
        assert counts.active_matmul == pytest.approx(counts.total - counts.embedding + tied_head, rel=1e-3)
    else:
        # Qwen's "activated" count includes the embedding table; the MFU count does not.
        assert counts.active_matmul + counts.embedding == pytest.approx(active_with_embedding, rel=0.02)


def test_zero_six_b_has_tied_embeddings_and_no_separate_head():
    model = Qwen3.build(FLAVOURS["0.6B"], device="meta")
    assert model.output.weight is model.tok_embeddings.weight


# ---------------------------------------------------------------- tensor parallel and FSDP (2 processes)


def _distributed_worker() -> None:
    """Run under torch.distributed.run. 2 processes: TP=2, then FSDP=2; 4 processes: FSDP=2 x TP=2.

    Each layout's logits and every parameter's gradient must equal the single-process model's.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from assay.models.qwen3 import SPEC

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    layouts = {2: [("tp",), ("dp_shard",)], 4: [("dp_shard", "tp")]}[world]
    tokens = random_tokens(batch=4, seq_len=16)
    failures = []
    for spec_name in ("tiny", "tiny-moe"):
        reference = Qwen3.build(FLAVOURS[spec_name], seed=0)
        reference_logits = reference(tokens)
        reference_logits.pow(2).mean().backward()
        reference_grads = {name: p.grad for name, p in reference.named_parameters()}
        for dim_names in layouts:
            model = Qwen3.build(FLAVOURS[spec_name], seed=0)  # same seed: identical weights on every rank
            mesh = init_device_mesh("cpu", tuple(world // len(dim_names) for _ in dim_names), mesh_dim_names=dim_names)
            SPEC.parallelize(model, mesh, tp="tp" in dim_names, dp_shard="dp_shard" in dim_names)
            # Data parallel ranks take their slice of the batch; FSDP averages their gradients.
            dp_rank, dp_size = (mesh["dp_shard"].get_local_rank(), mesh["dp_shard"].size()) if "dp_shard" in dim_names else (0, 1)
            rows = slice(dp_rank * len(tokens) // dp_size, (dp_rank + 1) * len(tokens) // dp_size)
            logits = model(tokens[rows])
            logits.pow(2).mean().backward()
            try:
                assert_close("model_logits", logits, reference_logits[rows].detach(), torch.float32)
                # q_norm/k_norm gradients sum over heads held by different TP ranks; FSDP reduces across ranks.
                for name, param in model.named_parameters():
                    grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
                    assert_close("model_grad", grad, reference_grads[name], torch.float32)
            except AssertionError as failure:
                failures.append(f"rank {rank} {spec_name} {dim_names}: {failure}")
    dist.destroy_process_group()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"rank {rank}: ok")


@pytest.mark.distributed
@pytest.mark.parametrize("processes", [2, 4], ids=["tp2-then-fsdp2", "fsdp2xtp2"])
def test_tensor_parallel_and_fsdp_match_single_process(processes):
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo_root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), __file__],
        capture_output=True, text=True, timeout=300, env=env, cwd=repo_root,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(": ok") == processes


if __name__ == "__main__":
    _distributed_worker()
