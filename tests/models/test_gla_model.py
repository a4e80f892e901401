"""The native GLA causal LM: prefill + decode equal one chunked pass, a state that never grows, fla's
checkpoint layout, the reference sizes, and tensor-parallel / FSDP2 runs equal to one process."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from assay.core.distributed import run_on_ranks
from assay.core.errors import AssayError
from assay.core.numerics import assert_close
from assay.models.common.counting import count_parameters
from assay.models.gla import FLAVOURS, GLA, SPEC, GLAArgs, state_bytes_per_sequence
from assay.models.gla.model import GLAOperator
from assay.models.memory import kv_cache_bytes_per_sequence


def random_tokens(batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, FLAVOURS["tiny"].vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def tiny_model(flavour: str = "tiny", **overrides):
    # std 0.2: logits far from uniform, so a wrong state would show in them (0.02 gives near-flat logits).
    return GLA.build(replace(FLAVOURS[flavour], **overrides), seed=0, std=0.2).eval()


# ---------------------------------------------------------------- one model, three ways through it


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_prefill_then_decode_equals_one_chunked_pass(chunk_size):
    model = tiny_model(chunk_size=chunk_size)
    tokens = random_tokens(batch=2, seq_len=90)
    with torch.no_grad():
        full = model(tokens)  # training path: gla_chunk over all 90 tokens
        prompt_logits, state = model.prefill(tokens[:, :37])
        step_logits = [prompt_logits]
        for position in range(37, 90):  # one token at a time through gla_step
            logits, state = model.decode_step(tokens[:, position : position + 1], state)
            step_logits.append(logits)
    assert_close("recurrence", torch.cat(step_logits, dim=1), full, torch.float32)


def test_prefill_continues_from_a_state():
    model = tiny_model()
    tokens = random_tokens(batch=2, seq_len=80)
    with torch.no_grad():
        full_logits, full_state = model.prefill(tokens)
        first_logits, state = model.prefill(tokens[:, :50])
        rest_logits, state = model.prefill(tokens[:, 50:], state)
    assert_close("recurrence", torch.cat([first_logits, rest_logits], dim=1), full_logits, torch.float32)
    for layer_state, layer_full in zip(state, full_state):
        assert_close("recurrence", layer_state, layer_full, torch.float32)


def test_state_is_float32_per_layer_and_heads_by_key_by_value():
    args = FLAVOURS["tiny"]
    model = tiny_model()
    _, state = model.prefill(random_tokens(batch=3, seq_len=20))
    assert len(state) == args.n_layers
    assert all(s.shape == (3, args.n_heads, args.head_k_dim, args.head_v_dim) and s.dtype == torch.float32 for s in state)
    assert [s.shape for s in model.init_state(3)] == [s.shape for s in state]


def test_state_bytes_do_not_grow_with_generated_tokens():
    model = tiny_model()
    prompt = random_tokens(batch=2, seq_len=12)
    short, short_state = model.generate_with_state(prompt, 10)
    long, long_state = model.generate_with_state(prompt, 100)
    assert short.shape == (2, 22) and long.shape == (2, 112)
    assert torch.equal(long[:, :22], short)  # greedy: the longer run starts with the shorter one

    def total_bytes(state):
        return sum(tensor.numel() * tensor.element_size() for tensor in state)

    assert total_bytes(short_state) == total_bytes(long_state) == 2 * state_bytes_per_sequence(FLAVOURS["tiny"])


def test_generate_is_greedy_over_the_full_forward():
    model = tiny_model()
    prompt = random_tokens(batch=1, seq_len=9)
    generated = model.generate(prompt, 6)
    with torch.no_grad():
        for position in range(9, 15):
            assert generated[0, position] == model(generated[:, :position])[0, -1].argmax()


# ---------------------------------------------------------------- sizes


def test_3b_flavour_has_about_three_billion_parameters_on_meta():
    args = FLAVOURS["3B"]
    counts = count_parameters(GLA.build(args, device="meta"))
    assert args.n_layers == 24
    assert abs(counts.total - 3.028e9) / 3.028e9 < 0.001  # the reference: 3.028 billion
    assert counts.total == 3_028_938_240


def test_1_3b_flavour_is_the_size_of_fla_hubs_checkpoint():
    # fla-hub/gla-1.3B-100B: model.safetensors is 2.73 GB of bfloat16 (1.365B parameters).
    counts = count_parameters(GLA.build(FLAVOURS["1.3B"], device="meta"))
    assert round(counts.total * 2 / 1e9, 2) == 2.73


def test_state_bytes_per_sequence_is_layers_heads_k_v_bytes():
    args = FLAVOURS["3B"]
    assert (args.head_k_dim, args.head_v_dim) == (96, 192)
    assert state_bytes_per_sequence(args) == 24 * 16 * 96 * 192 * 4 == 28_311_552
    assert state_bytes_per_sequence(args, torch.bfloat16) == 28_311_552 // 2
    # A transformer of the same depth and width (24 layers, 24 heads of 128) keeps 2.4 GB at 8,192 tokens.
    kv_cache = kv_cache_bytes_per_sequence(24, 24, 128, 8192, torch.bfloat16)
    assert kv_cache == 2 * 24 * 24 * 128 * 8192 * 2
    assert 80 < kv_cache / state_bytes_per_sequence(args) < 90
    assert kv_cache_bytes_per_sequence(24, 24, 128, 16384, torch.bfloat16) == 2 * kv_cache


# ---------------------------------------------------------------- fla's checkpoint layout

FLA_LAYER_KEYS = [
    "attn_norm.weight", "mlp_norm.weight",
    "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.g_proj.weight", "attn.o_proj.weight",
    "attn.gk_proj.0.weight", "attn.gk_proj.1.weight", "attn.gk_proj.1.bias", "attn.g_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]


def test_export_writes_fla_key_names_and_gla_config(tmp_path):
    args = FLAVOURS["tiny"]
    SPEC.export_hf(tiny_model(), args, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    expected = {"model.embeddings.weight", "model.norm.weight", "lm_head.weight"}
    expected |= {f"model.layers.{i}.{key}" for i in range(args.n_layers) for key in FLA_LAYER_KEYS}
    assert set(tensors) == expected
    assert tensors["model.layers.0.attn.gk_proj.0.weight"].shape == (16, 64)  # dim -> low rank 16
    assert tensors["model.layers.0.attn.gk_proj.1.weight"].shape == (32, 16)  # -> key_dim = 0.5 x 64
    assert tensors["model.layers.0.attn.g_norm.weight"].shape == (16,)  # per head: value_dim / heads
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gla" and config["architectures"] == ["GLAForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_heads"]) == (64, 2, 4)
    assert (config["expand_k"], config["expand_v"], config["gate_low_rank_dim"], config["gate_logit_normalizer"]) == (0.5, 1, 16, 16)
    assert config["use_output_gate"] is True and config["fuse_norm"] is False


@pytest.mark.parametrize("flavour", ["tiny", "tiny-tied"])
def test_export_then_load_gives_identical_logits(tmp_path, flavour):
    model = tiny_model(flavour)
    SPEC.export_hf(model, FLAVOURS[flavour], tmp_path)
    loaded, args = SPEC.load(tmp_path)
    assert args == FLAVOURS[flavour]
    tokens = random_tokens(batch=2, seq_len=40)
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    if args.tie_embeddings:
        assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
        assert loaded.output.weight is loaded.tok_embeddings.weight


def test_fused_norm_checkpoints_load_under_flas_other_name(tmp_path):
    # fla's default fuse_norm=true names the per-head norm g_norm_swish_gate (the published checkpoints).
    model = tiny_model()
    SPEC.export_hf(model, FLAVOURS["tiny"], tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    renamed = {key.replace("attn.g_norm.", "attn.g_norm_swish_gate."): tensor for key, tensor in tensors.items()}
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text()) | {"fuse_norm": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded, args = SPEC.load(tmp_path)
    tokens = random_tokens(batch=1, seq_len=20)
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    SPEC.export_hf(loaded, args, tmp_path / "again")
    assert "model.layers.0.attn.g_norm_swish_gate.weight" in load_file(tmp_path / "again" / "model.safetensors")


def test_published_fla_config_reads_as_the_1_3b_flavour():
    # fla-hub/gla-1.3B-100B's config.json (the fields that decide the architecture).
    published = {
        "model_type": "gla", "architectures": ["GLAForCausalLM"], "attn_mode": "fused_chunk", "clamp_min": None,
        "expand_k": 0.5, "expand_v": 1, "fuse_norm": True, "hidden_act": "swish", "hidden_ratio": 4, "hidden_size": 2048,
        "intermediate_size": None, "max_position_embeddings": 2048, "num_heads": 4, "num_hidden_layers": 24,
        "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "use_gk": True, "use_gv": False, "use_short_conv": False,
        "vocab_size": 32000,
    }
    args = GLAArgs.from_hf_config(published)
    assert args == replace(FLAVOURS["1.3B"], fuse_norm=True)
    assert args.hidden_dim == 5632  # fla's rule: 2/3 x 4 x 2048 rounded up to 256
    assert GLAArgs.from_hf_config(args.to_hf_config()) == args


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_gv": True}, "value gate"),
        ({"model_type": "qwen3"}, "reads 'gla'"),
        ({"num_kv_heads": 2}, "grouped heads"),
        ({"feature_map": "relu"}, "feature map"),
    ],
)
def test_unsupported_configs_are_clear_errors(change, message):
    with pytest.raises(AssayError, match=message):
        GLAArgs.from_hf_config(FLAVOURS["tiny"].to_hf_config() | change)


def test_spec_overrides_and_bad_sizes():
    args = SPEC.apply_overrides(FLAVOURS["tiny"], "layers=3,heads=2,chunk=32")
    assert (args.n_layers, args.n_heads, args.chunk_size) == (3, 2, 32)
    with pytest.raises(AssayError, match="not a GLA field"):
        SPEC.apply_overrides(FLAVOURS["tiny"], "experts=8")
    with pytest.raises(AssayError, match="multiple of n_heads"):
        replace(FLAVOURS["tiny"], n_heads=3)


def test_kernel_seam_has_a_stable_module_name():
    model = tiny_model()
    seams = [name for name, module in model.named_modules() if isinstance(module, GLAOperator)]
    assert seams == ["layers.0.attention.gla", "layers.1.attention.gla"]


# ---------------------------------------------------------------- tensor parallel and FSDP2 (2 processes, gloo)


def _sharded_logits_and_grads(layout: str, short_conv: bool = False) -> list[str]:
    """On each rank: the tiny GLA under TP=2 or FSDP2=2 (with short convolutions: their filters split with
    the q, k, v columns under TP); its logits and every gradient vs one process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor


    tokens = random_tokens(batch=4, seq_len=40)
    args = replace(FLAVOURS["tiny"], use_short_conv=short_conv, conv_bias=short_conv)
    reference = GLA.build(args, seed=0, std=0.2)
    reference_logits = reference(tokens)
    reference_logits.pow(2).mean().backward()
    reference_grads = {name: p.grad for name, p in reference.named_parameters()}

    model = GLA.build(args, seed=0, std=0.2)  # same seed: identical weights on every rank
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(layout,))
    SPEC.parallelize(model, mesh, tp=layout == "tp", dp_shard=layout == "dp_shard")
    # Data-parallel ranks take their half of the batch; FSDP averages their gradients.
    rows = slice(0, 4) if layout == "tp" else slice(2 * dist.get_rank(), 2 * dist.get_rank() + 2)
    logits = model(tokens[rows])
    logits.pow(2).mean().backward()
    failures = []
    try:
        assert_close("model_logits", logits, reference_logits[rows].detach(), torch.float32)
    except AssertionError as failure:
        failures.append(f"logits: {failure}")
    for name, param in model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        try:
            assert_close("model_grad", grad, reference_grads[name], torch.float32)
        except AssertionError as failure:
            failures.append(f"grad {name}: {failure}")
    return failures


@pytest.mark.distributed
@pytest.mark.parametrize("layout, short_conv", [("tp", False), ("dp_shard", False), ("tp", True)])
def test_tensor_parallel_and_fsdp2_match_single_process(layout, short_conv):
    failures = run_on_ranks(_sharded_logits_and_grads, world_size=2, args=(layout, short_conv), timeout_s=300)
    assert failures == [[], []]


# ---------------------------------------------------------------- the zoo entries


def test_zoo_pretrained_gla_is_far_below_random_loss(zoo_dir):
    from assay.zoo.pretrain import corpus_token_ids, next_token_loss

    window = corpus_token_ids()[:513].unsqueeze(0)
    losses = {}
    for name in ("gla", "gla-pretrained"):
        model, _ = SPEC.load(zoo_dir / name)
        with torch.no_grad():
            losses[name] = next_token_loss(model.eval(), window).item()
    # ln(1024) = 6.93 is the uniform guess; a random model sits at or above it, a trained one far below.
    assert losses["gla"] > 0.9 * math.log(1024)
    assert losses["gla-pretrained"] < 0.65 * math.log(1024)


def test_zoo_gla_folder_is_a_checkpoint_with_the_zoo_tokenizer(zoo_dir):
    from transformers import AutoTokenizer

    folder = zoo_dir / "gla"
    for required in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "assay_zoo.json"):
        assert (folder / required).is_file(), required
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gla" and (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.decode(tokenizer("def f(x): return x")["input_ids"]) == "def f(x): return x"
    model, args = SPEC.load(folder)
    assert args == FLAVOURS["tiny"]
    assert model.generate(torch.tensor([tokenizer("The Python")["input_ids"]]), 5).shape[1] == len(tokenizer("The Python")["input_ids"]) + 5
