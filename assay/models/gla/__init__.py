"""The native GLA causal LM: flavours, loading from / exporting to fla-layout checkpoints, state size.

    FLAVOURS["3B"]                                        the reference design's size, as data
    model, args = SPEC.load("zoo/gla")                    a config.json + model.safetensors in fla's layout
    logits, state = model.prefill(tokens); logits, state = model.decode_step(next_tokens, state)
    SPEC.export_hf(model, args, "out/", tokenizer_source_dir="zoo/gla")   fla's layout: GLAForCausalLM's key names
    state_bytes_per_sequence(FLAVOURS["3B"])               28,311,552: the same at 10 tokens or 100,000
"""

from __future__ import annotations

from dataclasses import replace

import torch

from assay.models.gla.args import HF_MODEL_TYPE, GLAArgs
from assay.models.gla.model import GLA
from assay.models.gla.parallelize import tp_plan, tp_sizes
from assay.models.gla.key_map import GLAKeyMap
from assay.models.registry import ArchSpec, register
from assay.models.slots import FIXED_STATE, state_bytes

# "tiny" has the zoo's sizes (hidden 64, 2 layers, 4 heads, SwiGLU 128, the zoo tokenizer's 1024 tokens).
# "1.3B" is fla-hub/gla-1.3B-100B's config.json. "3B" is the fixed-state reference (3.028B parameters,
# 24 layers; shared/context/fixed-state.md); the article gives neither width, heads nor vocabulary, so:
# hidden 3072 with fla's defaults (expand_k 0.5, expand_v 1, hidden_ratio 4) and a 50,304-token
# vocabulary (GPT-2's 50,257 padded to a multiple of 64) land on 3.029B; 16 heads put the float32
# state at 28.3 MB per sequence, next to the article's "about 29.5 MB".
_TINY = GLAArgs(vocab_size=1024, dim=64, n_layers=2, n_heads=4, hidden_dim=128)
FLAVOURS: dict[str, GLAArgs] = {
    "tiny": _TINY,
    "tiny-tied": replace(_TINY, tie_embeddings=True),
    "340M": GLAArgs(vocab_size=32000, dim=1024, n_layers=24, n_heads=4, tie_embeddings=True),
    "1.3B": GLAArgs(vocab_size=32000, dim=2048, n_layers=24, n_heads=4),
    "2.7B": GLAArgs(vocab_size=32000, dim=2560, n_layers=32, n_heads=5),
    "3B": GLAArgs(vocab_size=50304, dim=3072, n_layers=24, n_heads=16, chunk_size=128),
}


def state_bytes_per_sequence(args: GLAArgs, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one sequence's decoding state: layers x heads x K_head x V_head x element size, plus
    layers x (conv_size - 1) x (2 key_dim + value_dim) with short convolutions.

    Nothing in it grows with the sequence (compare assay.models.memory.kv_cache_bytes_per_sequence).
    float32 by default: the recurrence accumulates, and hands back, its state in float32.
    """
    return state_bytes(args, 0, dtype)


def args_for_size(vocab_size: int, dim: int, n_layers: int, n_heads: int, hidden_dim: int, max_seq_len: int) -> GLAArgs:
    # chunk_size 64, the GLA default: any length runs (gla_chunk pads the last chunk).
    return GLAArgs(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, hidden_dim=hidden_dim, max_seq_len=max_seq_len)


SPEC = register(ArchSpec(
    name="gla",
    label="GLA",
    model_types=(HF_MODEL_TYPE,),
    args_cls=GLAArgs,
    model_cls=GLA,
    key_map_cls=GLAKeyMap,
    tp_plan=tp_plan,
    tp_sizes=tp_sizes,
    cache=FIXED_STATE,
    kernel_targets={"gla_chunk": "layers.*.attention.gla"},
    flavours=FLAVOURS,
    args_for_size=args_for_size,
))

__all__ = ["FLAVOURS", "SPEC", "GLA", "GLAArgs", "state_bytes_per_sequence"]
