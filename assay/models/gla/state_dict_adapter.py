"""to_hf() / from_hf(): the key map between the native GLA and fla's GLAForCausalLM checkpoints. Nothing else.

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

import re
from collections.abc import Mapping

import torch

from assay.core.errors import AssayError
from assay.models.gla.args import GLAArgs

_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embeddings.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attention_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "mlp_norm.weight",
    "attention.wq.weight": "attn.q_proj.weight",
    "attention.wk.weight": "attn.k_proj.weight",
    "attention.wv.weight": "attn.v_proj.weight",
    "attention.wg.weight": "attn.g_proj.weight",
    "attention.wo.weight": "attn.o_proj.weight",
    "attention.gk_down.weight": "attn.gk_proj.0.weight",
    "attention.gk_up.weight": "attn.gk_proj.1.weight",
    "attention.gk_up.bias": "attn.gk_proj.1.bias",
    "attention.out_norm.weight": "attn.g_norm.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
    "mlp.w3.weight": "mlp.up_proj.weight",
    "attention.q_conv.weight": "attn.q_conv1d.weight",
    "attention.k_conv.weight": "attn.k_conv1d.weight",
    "attention.v_conv.weight": "attn.v_conv1d.weight",
    "attention.q_conv.bias": "attn.q_conv1d.bias",
    "attention.k_conv.bias": "attn.k_conv1d.bias",
    "attention.v_conv.bias": "attn.v_conv1d.bias",
}
_FUSED_NORM_NAME = "attn.g_norm_swish_gate.weight"

_HF_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _hf_layer_name(rest: str, args: GLAArgs) -> str:
    if rest == "attention.out_norm.weight" and args.fuse_norm:
        return _FUSED_NORM_NAME
    return _PER_LAYER[rest]


def native_layer_keys(args: GLAArgs) -> list[str]:
    """The state-dict keys of one native Block (without the `layers.{i}.` prefix)."""
    def present(key: str) -> bool:
        if key == "attention.wg.weight":
            return args.use_output_gate
        if "_conv." in key:
            return args.use_short_conv and (key.endswith(".weight") or args.conv_bias)
        return True

    return [key for key in _PER_LAYER if present(key)]


def _few(keys, limit: int = 5) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def to_hf(state_dict: Mapping[str, torch.Tensor], args: GLAArgs) -> dict[str, torch.Tensor]:
    """Native state dict -> fla's keys; lm_head dropped when tied. Values are the native tensors (no copy)."""
    hf: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in state_dict.items():
        if key in _TOP_LEVEL:
            if key == "output.weight" and args.tie_embeddings:
                continue
            hf[_TOP_LEVEL[key]] = tensor
            continue
        match = re.match(r"^layers\.(\d+)\.(.+)$", key)
        if match is None or match.group(2) not in _PER_LAYER:
            unknown.append(key)
            continue
        layer, rest = match.groups()
        hf[f"model.layers.{layer}.{_hf_layer_name(rest, args)}"] = tensor
    if unknown:
        raise AssayError(f"native GLA state dict has keys with no fla name: {_few(unknown)}")
    return hf


def from_hf(hf_state_dict: Mapping[str, torch.Tensor], args: GLAArgs) -> dict[str, torch.Tensor]:
    """fla's state dict (a lazy Mapping is read only where needed) -> native keys.

    The per-head norm is read under either of fla's names (g_norm or g_norm_swish_gate).
    """
    native: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    consumed: set[str] = set()

    def take(native_key: str, *hf_keys: str) -> None:
        for hf_key in hf_keys:
            if hf_key in hf_state_dict:
                native[native_key] = hf_state_dict[hf_key]
                consumed.add(hf_key)
                return
        missing.append(hf_keys[0])

    take("tok_embeddings.weight", "model.embeddings.weight")
    take("norm.weight", "model.norm.weight")
    if args.tie_embeddings:
        consumed.add("lm_head.weight")  # a tied checkpoint may still carry a copy
        if "tok_embeddings.weight" in native:
            native["output.weight"] = native["tok_embeddings.weight"]
    else:
        take("output.weight", "lm_head.weight")
    for layer_id in range(args.n_layers):
        prefix = f"model.layers.{layer_id}."
        for rest in native_layer_keys(args):
            names = [prefix + _PER_LAYER[rest]]
            if rest == "attention.out_norm.weight":
                names.append(prefix + _FUSED_NORM_NAME)
            take(f"layers.{layer_id}.{rest}", *names)
    if missing:
        raise AssayError(f"checkpoint lacks {len(missing)} tensors the GLA spec needs: {_few(missing)}")
    unexpected = [key for key in hf_state_dict if key not in consumed]
    if unexpected:
        layers = [int(m.group(1)) for key in unexpected if (m := _HF_LAYER_KEY.match(key))]
        hint = f" (the checkpoint has more layers than the spec's {args.n_layers})" if layers and min(layers) >= args.n_layers else ""
        raise AssayError(f"checkpoint has {len(unexpected)} tensors the GLA spec does not use{hint}: {_few(unexpected)}")
    return native
