"""The native Gemma 3 (text, Gemma3ForCausalLM): flavours and its registry entry. The worked example of
docs/architecture.md ("Adding an architecture").

    FLAVOURS["1B"]                                     a size, as data
    model, args = SPEC.load("ckpt/")                   a Transformers gemma3_text folder
    SPEC.export_hf(model, args, "out/", "ckpt/")
"""

from __future__ import annotations

from dataclasses import replace

from assay.models.gemma3.args import FULL, SLIDING, Gemma3Args, pattern_layer_types
from assay.models.gemma3.model import Gemma3
from assay.models.gemma3.parallelize import tp_plan, tp_sizes
from assay.models.gemma3.key_map import Gemma3KeyMap
from assay.models.registry import ArchSpec, register
from assay.models.slots import KV_CACHE

# "tiny" has the zoo's sizes (its tokenizer's 1024 tokens) with one layer of each kind and an 8-token window,
# so tests cross the window within a few tokens. The others are the published config.json files' text part.
_1B = Gemma3Args(
    vocab_size=262144, dim=1152, n_layers=26, n_heads=4, n_kv_heads=1, head_dim=256, hidden_dim=6912,
    sliding_window=512, max_seq_len=32768,
)
FLAVOURS: dict[str, Gemma3Args] = {
    "tiny": Gemma3Args(vocab_size=1024, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128,
                       sliding_window=8, layer_types=(SLIDING, FULL), query_pre_attn_scalar=16, max_seq_len=2048),
    "1B": _1B,
    "4B": replace(_1B, vocab_size=262208, dim=2560, n_layers=34, n_heads=8, n_kv_heads=4, hidden_dim=10240, sliding_window=1024,
                  max_seq_len=131072, rope_factor=8.0, layer_types=pattern_layer_types(34)),
}

SPEC = register(ArchSpec(
    name="gemma3",
    label="attention (Gemma 3)",
    model_types=Gemma3Args.HF_MODEL_TYPES,
    args_cls=Gemma3Args,
    model_cls=Gemma3,
    key_map_cls=Gemma3KeyMap,
    tp_plan=tp_plan,
    tp_sizes=tp_sizes,
    cache=KV_CACHE,
    kernel_targets={"rope": "layers.*.attention.rope"},
    flavours=FLAVOURS,
    args_for_size=Gemma3Args.for_size,
))

__all__ = ["FLAVOURS", "SPEC", "Gemma3", "Gemma3Args"]
