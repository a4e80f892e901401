"""The key map between the native Gemma 3 and Transformers' Gemma3ForCausalLM checkpoints (the loops are
KeyMap's). Renames only. The four norms of a block: input_layernorm (before attention),
post_attention_layernorm (on attention's output), pre_feedforward_layernorm, post_feedforward_layernorm.
"""

from __future__ import annotations

from assay.models.common.key_map import HF_ATTENTION_KEYS, HF_MLP_KEYS, HF_QK_NORM_KEYS, KeyMap
from assay.models.gemma3.args import Gemma3Args


class Gemma3KeyMap(KeyMap):
    FAMILY = "Gemma 3"
    PER_LAYER = {
        "attention_norm.weight": "input_layernorm.weight",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_ffn_norm.weight": "post_feedforward_layernorm.weight",
        **HF_ATTENTION_KEYS,
        **HF_QK_NORM_KEYS,
        **HF_MLP_KEYS,
    }

    def layer_keys(self, layer_id: int) -> list[str]:
        args: Gemma3Args = self.args
        return [key for key in self.PER_LAYER if not key.endswith(".bias") or (args.attention_bias and key.startswith("attention."))]
