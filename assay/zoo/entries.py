"""The tiny model zoo: one entry per architecture, each a real Transformers config at tiny size.

Each entry stands in for a public checkpoint (its Hub id is recorded in the catalog), so a probe
of `zoo/qwen3` exercises the same modelling code as `Qwen/Qwen3-0.6B`, offline, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from assay.core.tokens import TOKEN_IDS
from assay.zoo.tokenizer import VOCAB_SIZE

# One set of tiny sizes for every architecture: small enough for a 2-core CPU, large enough to have
# GQA (4 query heads over 2 key/value heads) and more than one layer.
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
FFN = 128
MAX_POSITIONS = 2048
# Random weights at the usual 0.02 scale give logits so flat that greedy decoding sits on near-ties;
# a larger scale makes the argmax well separated, so eager vs compiled comparisons are meaningful.
INIT_RANGE = 0.2


@dataclass(frozen=True)
class ZooEntry:
    name: str  # folder name in the zoo
    stands_in_for: str  # the public Hub checkpoint whose architecture it reproduces
    task: str  # "text-generation" or "image-text-to-text"
    architecture: str  # the Transformers class name in config.json
    features: tuple[str, ...]  # what it covers: tied, gqa, qk_norm, moe, sliding_window, ...
    make_config: Callable[[], object] = field(repr=False)
    pretrain_steps: int = 0  # > 0: trained briefly on the embedded corpus after init
    # For an architecture Transformers does not know: (entry, folder, seed) writes config.json, the
    # safetensors and generation_config.json itself; the build adds tokenizer and stamp as for any entry.
    builder: Callable[[ZooEntry, object, int], None] | None = field(default=None, repr=False)

    @property
    def transformers_native(self) -> bool:
        """True when Transformers' AutoModel classes load the checkpoint (every entry without a builder)."""
        return self.builder is None


def _common(**overrides) -> dict:
    """Kwargs shared by Llama-style configs."""
    kwargs = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
        **TOKEN_IDS,
    )
    kwargs.update(overrides)
    return kwargs


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(**_common(tie_word_embeddings=True, head_dim=HEAD_DIM))


def _qwen2():
    from transformers import Qwen2Config

    return Qwen2Config(**_common(tie_word_embeddings=True))


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(**_common(tie_word_embeddings=True, head_dim=HEAD_DIM))


def _qwen3_pretrained():
    # Trained from the usual small init: the large INIT_RANGE that separates random logits slows training.
    config = _qwen3()
    config.initializer_range = 0.02
    return config


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_common(
            tie_word_embeddings=False,
            head_dim=HEAD_DIM,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
        )
    )


def _mistral():
    from transformers import MistralConfig

    return MistralConfig(**_common(tie_word_embeddings=False, head_dim=HEAD_DIM, sliding_window=16))


def _mixtral():
    from transformers import MixtralConfig

    return MixtralConfig(
        **_common(tie_word_embeddings=False, head_dim=HEAD_DIM, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    )


def _gemma2():
    from transformers import Gemma2Config

    return Gemma2Config(**_common(tie_word_embeddings=True, head_dim=HEAD_DIM, sliding_window=16, query_pre_attn_scalar=HEAD_DIM))


def _gemma3():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_common(tie_word_embeddings=True, head_dim=HEAD_DIM, sliding_window=16, query_pre_attn_scalar=HEAD_DIM)
    )


def _phi3():
    from transformers import Phi3Config

    return Phi3Config(**_common(tie_word_embeddings=False, original_max_position_embeddings=MAX_POSITIONS))


def _gpt2():
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=VOCAB_SIZE, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=MAX_POSITIONS,
        n_inner=FFN, initializer_range=INIT_RANGE, **TOKEN_IDS,
    )


def _gpt_neox():
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=MAX_POSITIONS, rotary_pct=0.25, use_parallel_residual=True,
        initializer_range=INIT_RANGE, **TOKEN_IDS, tie_word_embeddings=False,
    )


def _opt():
    from transformers import OPTConfig

    return OPTConfig(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        ffn_dim=FFN, max_position_embeddings=MAX_POSITIONS, word_embed_proj_dim=HIDDEN, init_std=INIT_RANGE,
        **TOKEN_IDS,
    )


def _olmo2():
    from transformers import Olmo2Config

    return Olmo2Config(**_common(tie_word_embeddings=False))


def _smollm3():
    from transformers import SmolLM3Config

    # SmolLM3 drops rotary embeddings in every 4th layer (NoPE); 2 layers keep one of each kind.
    return SmolLM3Config(**_common(tie_word_embeddings=True, no_rope_layers=[1, 0]))


def _granite():
    from transformers import GraniteConfig

    return GraniteConfig(
        **_common(tie_word_embeddings=True, embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.22, attention_multiplier=0.0625)
    )


def _llava():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    from assay.zoo.tokenizer import token_id

    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
        projection_dim=32, initializer_range=INIT_RANGE,
    )
    text = LlamaConfig(**_common(tie_word_embeddings=False, head_dim=HEAD_DIM))
    return LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=token_id("<image>"),
        vision_feature_layer=-2, vision_feature_select_strategy="default", initializer_range=INIT_RANGE,
    )


def _gemma3_vision():
    from transformers import Gemma3Config, SiglipVisionConfig

    from assay.zoo.tokenizer import token_id

    # 32x32 image, 8x8 patches: 16 patches pooled to 4 soft tokens per image.
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
    )
    text = _common(tie_word_embeddings=True, head_dim=HEAD_DIM, sliding_window=16, query_pre_attn_scalar=HEAD_DIM)
    return Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, boi_token_index=token_id("<start_of_image>"),
        eoi_token_index=token_id("<end_of_image>"), image_token_index=token_id("<image_soft_token>"),
        initializer_range=INIT_RANGE, **TOKEN_IDS,
    )


def _gla():
    from assay.models import registry

    return registry.get("gla").args_for_size(
        vocab_size=VOCAB_SIZE, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN, max_seq_len=MAX_POSITIONS
    )


def _native_builder(arch: str, init_std: float):
    """Build with assay's registered architecture `arch` (assay.models.registry), not Transformers."""

    def build(entry: ZooEntry, folder, seed: int) -> None:
        from assay.zoo.native import write_native_checkpoint

        write_native_checkpoint(arch, entry.make_config(), folder, seed, init_std, entry.pretrain_steps)

    return build


TEXT = "text-generation"
IMAGE_TEXT = "image-text-to-text"

ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in [
        ZooEntry("llama", "meta-llama/Llama-3.2-1B", TEXT, "LlamaForCausalLM", ("tied", "gqa"), _llama),
        ZooEntry("qwen2", "Qwen/Qwen2.5-0.5B", TEXT, "Qwen2ForCausalLM", ("tied", "gqa", "qkv_bias"), _qwen2),
        ZooEntry("qwen3", "Qwen/Qwen3-0.6B", TEXT, "Qwen3ForCausalLM", ("tied", "gqa", "qk_norm"), _qwen3),
        ZooEntry("qwen3-pretrained", "Qwen/Qwen3-0.6B", TEXT, "Qwen3ForCausalLM", ("tied", "gqa", "qk_norm", "trained"), _qwen3_pretrained, pretrain_steps=300),
        ZooEntry("qwen3-moe", "Qwen/Qwen3-30B-A3B", TEXT, "Qwen3MoeForCausalLM", ("untied", "gqa", "qk_norm", "moe"), _qwen3_moe),
        ZooEntry("mistral", "mistralai/Mistral-7B-v0.1", TEXT, "MistralForCausalLM", ("untied", "gqa", "sliding_window"), _mistral),
        ZooEntry("mixtral", "mistralai/Mixtral-8x7B-v0.1", TEXT, "MixtralForCausalLM", ("untied", "gqa", "moe"), _mixtral),
        ZooEntry("gemma2", "google/gemma-2-2b", TEXT, "Gemma2ForCausalLM", ("tied", "gqa", "sliding_window", "softcap"), _gemma2),
        ZooEntry("gemma3", "google/gemma-3-1b-pt", TEXT, "Gemma3ForCausalLM", ("tied", "gqa", "qk_norm", "sliding_window"), _gemma3),
        ZooEntry("phi3", "microsoft/Phi-3-mini-4k-instruct", TEXT, "Phi3ForCausalLM", ("untied", "gqa", "fused_qkv"), _phi3),
        ZooEntry("gpt2", "openai-community/gpt2", TEXT, "GPT2LMHeadModel", ("tied", "learned_positions"), _gpt2),
        ZooEntry("gpt-neox", "EleutherAI/pythia-160m", TEXT, "GPTNeoXForCausalLM", ("untied", "partial_rotary", "parallel_residual"), _gpt_neox),
        ZooEntry("opt", "facebook/opt-125m", TEXT, "OPTForCausalLM", ("tied", "learned_positions"), _opt),
        ZooEntry("olmo2", "allenai/OLMo-2-0425-1B", TEXT, "Olmo2ForCausalLM", ("untied", "gqa", "qk_norm"), _olmo2),
        ZooEntry("smollm3", "HuggingFaceTB/SmolLM3-3B", TEXT, "SmolLM3ForCausalLM", ("tied", "gqa", "nope_layers"), _smollm3),
        ZooEntry("granite", "ibm-granite/granite-3.3-2b-base", TEXT, "GraniteForCausalLM", ("tied", "gqa", "scaled_residual"), _granite),
        # Gated linear attention in fla's checkpoint layout (model_type "gla"), written by the registered
        # native GLA's export; Transformers has no GLA of its own, and `import assay` registers ours with
        # its Auto classes (assay.models.auto), so the probe loads them like any checkpoint.
        ZooEntry("gla", "fla-hub/gla-1.3B-100B", TEXT, "GLAForCausalLM", ("untied", "linear_attention", "fixed_state"), _gla, builder=_native_builder("gla", INIT_RANGE)),
        ZooEntry("gla-pretrained", "fla-hub/gla-1.3B-100B", TEXT, "GLAForCausalLM", ("untied", "linear_attention", "fixed_state", "trained"), _gla, pretrain_steps=300, builder=_native_builder("gla", 0.02)),
        ZooEntry("llava", "llava-hf/llava-1.5-7b-hf", IMAGE_TEXT, "LlavaForConditionalGeneration", ("untied", "gqa", "vision"), _llava),
        ZooEntry("gemma3-vision", "google/gemma-3-4b-it", IMAGE_TEXT, "Gemma3ForConditionalGeneration", ("tied", "gqa", "qk_norm", "sliding_window", "vision"), _gemma3_vision),
    ]
}
