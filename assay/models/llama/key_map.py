"""The key map between the native Llama and Transformers' LlamaForCausalLM (and MistralForCausalLM)
checkpoints. Renames only: every tensor keeps its shape. The loops are KeyMap's.
"""

from __future__ import annotations

from assay.models.common.key_map import HF_ATTENTION_KEYS, HF_MLP_KEYS, KeyMap
from assay.models.llama.args import LlamaArgs


class LlamaKeyMap(KeyMap):
    FAMILY = "Llama"
    PER_LAYER = {
        "attention_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        **HF_ATTENTION_KEYS,
        **HF_MLP_KEYS,
    }

    def layer_keys(self, layer_id: int) -> list[str]:
        args: LlamaArgs = self.args
        has_bias = {"attention": args.attention_bias, "mlp": args.mlp_bias}
        return [key for key in self.PER_LAYER if not key.endswith(".bias") or has_bias[key.split(".")[0]]]
