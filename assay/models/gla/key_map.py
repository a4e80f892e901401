"""The key map between the native GLA and fla's GLAForCausalLM checkpoints (the loops are KeyMap's).

fla's names (fla/models/gla/modeling_gla.py, fla/layers/gla.py, fla/modules/mlp.py):
  model.embeddings.weight, model.norm.weight, lm_head.weight (absent when tied)
  model.layers.{i}.attn_norm.weight, model.layers.{i}.mlp_norm.weight
  model.layers.{i}.attn.{q_proj, k_proj, v_proj, g_proj, o_proj}.weight
  model.layers.{i}.attn.gk_proj.0.weight, model.layers.{i}.attn.gk_proj.1.{weight, bias}   (low-rank forget gate)
  model.layers.{i}.attn.g_norm.weight   (fuse_norm=false; fla's fused kernel calls it g_norm_swish_gate)
  model.layers.{i}.attn.{q_conv1d, k_conv1d, v_conv1d}.weight [D, 1, W] (.bias with conv_bias)   (use_short_conv)
  model.layers.{i}.mlp.{gate_proj, up_proj, down_proj}.weight
Every tensor keeps its shape: nn.Linear weights are [out, in] on both sides.
"""

from __future__ import annotations

from assay.models.common.key_map import KeyMap
from assay.models.gla.args import GLAArgs

_FUSED_NORM_NAME = "attn.g_norm_swish_gate.weight"


class GLAKeyMap(KeyMap):
    FAMILY = "GLA"
    SOURCE = "fla"
    TOP_LEVEL = {**KeyMap.TOP_LEVEL, "tok_embeddings.weight": "model.embeddings.weight"}
    PER_LAYER = {
        "attention_norm.weight": "attn_norm.weight",
        "ffn_norm.weight": "mlp_norm.weight",
        **{f"attention.w{n}.weight": f"attn.{n}_proj.weight" for n in "qkvgo"},
        "attention.gk_down.weight": "attn.gk_proj.0.weight",
        "attention.gk_up.weight": "attn.gk_proj.1.weight",
        "attention.gk_up.bias": "attn.gk_proj.1.bias",
        "attention.out_norm.weight": "attn.g_norm.weight",
        "mlp.w1.weight": "mlp.gate_proj.weight",
        "mlp.w2.weight": "mlp.down_proj.weight",
        "mlp.w3.weight": "mlp.up_proj.weight",
        **{f"attention.{n}_conv.{kind}": f"attn.{n}_conv1d.{kind}" for kind in ("weight", "bias") for n in "qkv"},
    }
    IGNORED_HF_SUFFIXES = ()

    def layer_keys(self, layer_id: int) -> list[str]:
        args: GLAArgs = self.args

        def present(key: str) -> bool:
            if key == "attention.wg.weight":
                return args.use_output_gate
            if "_conv." in key:
                return args.use_short_conv and (key.endswith(".weight") or args.conv_bias)
            return True

        return [key for key in self.PER_LAYER if present(key)]

    def hf_names(self, rest: str) -> tuple[str, ...]:
        # The per-head norm is read under either of fla's names (g_norm, or g_norm_swish_gate from its fused
        # kernel) and written under the one fuse_norm says.
        if rest == "attention.out_norm.weight":
            return (_FUSED_NORM_NAME, self.PER_LAYER[rest]) if self.args.fuse_norm else (self.PER_LAYER[rest], _FUSED_NORM_NAME)
        return super().hf_names(rest)
