"""The key map between the native Llama and Transformers' LlamaForCausalLM (and MistralForCausalLM)
checkpoints. Renames only: every tensor keeps its shape. The loops are KeyMapAdapter's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from assay.models.common.state_dict_adapter import KeyMapAdapter
from assay.models.llama.args import LlamaArgs

# Native key (after `layers.{i}.`) -> Transformers key (after `model.layers.{i}.`), biases included.
ATTENTION_KEYS = {f"attention.w{n}.{kind}": f"self_attn.{n}_proj.{kind}" for n in "qkvo" for kind in ("weight", "bias")}
MLP_KEYS = {f"mlp.{w}.{kind}": f"mlp.{proj}.{kind}" for w, proj in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
            for kind in ("weight", "bias")}


class LlamaStateDictAdapter(KeyMapAdapter):
    FAMILY = "Llama"
    PER_LAYER = {
        "attention_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        **ATTENTION_KEYS,
        **MLP_KEYS,
    }

    def layer_keys(self, layer_id: int) -> list[str]:
        args: LlamaArgs = self.args
        has_bias = {"attention": args.attention_bias, "mlp": args.mlp_bias}
        return [key for key in self.PER_LAYER if not key.endswith(".bias") or has_bias[key.split(".")[0]]]


def to_hf(state_dict: Mapping[str, torch.Tensor], args: LlamaArgs) -> dict[str, torch.Tensor]:
    return LlamaStateDictAdapter(args).to_hf(state_dict)


def from_hf(hf_state_dict: Mapping[str, torch.Tensor], args: LlamaArgs, slice_layers: bool = False) -> dict[str, torch.Tensor]:
    return LlamaStateDictAdapter(args).from_hf(hf_state_dict, slice_layers)
