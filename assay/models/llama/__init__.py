"""The native Llama (Llama 2/3, SmolLM2, Mistral-dense): flavours and its registry entry. A worked
example of docs/architecture.md, with gemma3/.

    FLAVOURS["SmolLM2-135M"]                              a size, as data
    model, args = SPEC.load("ckpt/")                      any Transformers Llama folder: safetensors single
                                                          or sharded, tied or untied, no `architectures` needed
    SPEC.export_hf(model, args, "out/", tokenizer_source_dir="ckpt/")
"""

from __future__ import annotations

from assay.models.llama.args import HF_MODEL_TYPES, LlamaArgs
from assay.models.llama.model import Llama
from assay.models.llama.parallelize import tp_plan, tp_sizes
from assay.models.llama.key_map import LlamaKeyMap
from assay.models.registry import ArchSpec, register
from assay.models.slots import KV_CACHE

# Published sizes (their config.json) and a tiny one with the zoo's sizes (its tokenizer's 1024 tokens).
_LLAMA3_VOCAB = 128256
FLAVOURS: dict[str, LlamaArgs] = {
    "tiny": LlamaArgs(vocab_size=1024, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, tie_embeddings=True),
    "SmolLM2-135M": LlamaArgs(
        vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, hidden_dim=1536,
        rope_theta=100000.0, max_seq_len=8192, tie_embeddings=True,
    ),
    "3.2-1B": LlamaArgs(
        vocab_size=_LLAMA3_VOCAB, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, hidden_dim=8192,
        rope_theta=500000.0, max_seq_len=131072, tie_embeddings=True,
        rope_type="llama3", rope_factor=32.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192,
    ),
    "3.1-8B": LlamaArgs(
        vocab_size=_LLAMA3_VOCAB, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
        rope_theta=500000.0, max_seq_len=131072,
        rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192,
    ),
}

SPEC = register(ArchSpec(
    name="llama",
    label="attention (Llama)",
    model_types=HF_MODEL_TYPES,
    args_cls=LlamaArgs,
    model_cls=Llama,
    key_map_cls=LlamaKeyMap,
    tp_plan=tp_plan,
    tp_sizes=tp_sizes,
    cache=KV_CACHE,
    kernel_targets={"rope": "layers.*.attention.rope", "attention": "layers.*.attention.sdpa"},
    flavours=FLAVOURS,
    args_for_size=LlamaArgs.for_size,
))

__all__ = ["FLAVOURS", "SPEC", "Llama", "LlamaArgs"]
