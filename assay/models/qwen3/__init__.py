"""The native Qwen3 (dense and MoE): flavours and its registry entry.

    FLAVOURS["4B"]                                   a size, as data
    replace(FLAVOURS["32B"], dim=2560, n_layers=36, n_heads=32, hidden_dim=9728)   the guide's 4B
    model, args = SPEC.load("ckpt/", "layers=4,experts=64", allow_sliced_checkpoint=True)
    SPEC.export_hf(model, args, "out/", tokenizer_source_dir="ckpt/")
"""

from __future__ import annotations

from dataclasses import replace

from assay.models.qwen3.args import HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE, Qwen3Args
from assay.models.qwen3.model import Qwen3
from assay.models.qwen3.parallelize import tp_plan, tp_sizes
from assay.models.qwen3.key_map import Qwen3KeyMap
from assay.models.registry import ArchSpec, register
from assay.models.slots import KV_CACHE

# Sizes of the published Qwen3 checkpoints (their config.json), plus two tiny ones for tests.
# The tiny ones have the zoo's sizes (vocabulary of its tokenizer, 1024) so they train on the zoo corpus.
_QWEN3_VOCAB = 151936
_TINY = Qwen3Args(vocab_size=1024, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, max_seq_len=2048)
_DENSE_0_6B = Qwen3Args(
    vocab_size=_QWEN3_VOCAB, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, hidden_dim=3072, tie_embeddings=True
)
FLAVOURS: dict[str, Qwen3Args] = {
    "tiny": _TINY,
    "tiny-moe": replace(_TINY, n_experts=8, top_k=2, moe_hidden_dim=32),
    "0.6B": _DENSE_0_6B,
    "1.7B": replace(_DENSE_0_6B, dim=2048, hidden_dim=6144),
    "4B": replace(_DENSE_0_6B, dim=2560, n_layers=36, n_heads=32, hidden_dim=9728),
    "8B": replace(_DENSE_0_6B, dim=4096, n_layers=36, n_heads=32, hidden_dim=12288, tie_embeddings=False),
    "14B": replace(_DENSE_0_6B, dim=5120, n_layers=40, n_heads=40, hidden_dim=17408, tie_embeddings=False),
    "32B": replace(_DENSE_0_6B, dim=5120, n_layers=64, n_heads=64, hidden_dim=25600, tie_embeddings=False),
    "30B-A3B": Qwen3Args(
        vocab_size=_QWEN3_VOCAB, dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, hidden_dim=6144,
        n_experts=128, top_k=8, moe_hidden_dim=768, norm_topk_prob=True,
    ),
    "235B-A22B": Qwen3Args(
        vocab_size=_QWEN3_VOCAB, dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128, hidden_dim=12288,
        n_experts=128, top_k=8, moe_hidden_dim=1536, norm_topk_prob=True,
    ),
}


SPEC = register(ArchSpec(
    name="qwen3",
    label="attention (Qwen3)",
    model_types=(HF_DENSE_MODEL_TYPE, HF_MOE_MODEL_TYPE),
    args_cls=Qwen3Args,
    model_cls=Qwen3,
    key_map_cls=Qwen3KeyMap,
    tp_plan=tp_plan,
    tp_sizes=tp_sizes,
    cache=KV_CACHE,
    kernel_targets={"rope": "layers.*.attention.rope", "attention": "layers.*.attention.sdpa", "grouped_experts": "layers.*.moe.experts"},
    flavours=FLAVOURS,
    args_for_size=Qwen3Args.for_size,
))

__all__ = ["FLAVOURS", "SPEC", "Qwen3", "Qwen3Args"]
