"""to_hf() / from_hf(): the key map between the native Llama and Transformers' LlamaForCausalLM (and
MistralForCausalLM) checkpoints. Renames only: every tensor keeps its shape. Nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from assay.core.errors import AssayError
from assay.models.llama.args import LlamaArgs

_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Native key (after `layers.{i}.`) -> HF key (after `model.layers.{i}.`).
_PER_LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.bias": "self_attn.o_proj.bias",
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
    "mlp.w3.weight": "mlp.up_proj.weight",
    "mlp.w1.bias": "mlp.gate_proj.bias",
    "mlp.w2.bias": "mlp.down_proj.bias",
    "mlp.w3.bias": "mlp.up_proj.bias",
}
_HF_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Keys some older checkpoints carry that hold nothing a model needs (derived rotary frequencies).
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


def native_layer_keys(args: LlamaArgs) -> list[str]:
    """The state-dict keys of one native Block (without the `layers.{i}.` prefix)."""
    keys = []
    for key in _PER_LAYER:
        if key.endswith(".bias") and not (args.attention_bias if key.startswith("attention.") else args.mlp_bias):
            continue
        keys.append(key)
    return keys


def _few(keys, limit: int = 5) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def to_hf(state_dict: Mapping[str, torch.Tensor], args: LlamaArgs) -> dict[str, torch.Tensor]:
    """Native state dict -> Transformers keys (views, no copies); lm_head dropped when tied."""
    hf: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in state_dict.items():
        if key in _TOP_LEVEL:
            if not (key == "output.weight" and args.tie_embeddings):  # tied: Transformers rebuilds lm_head
                hf[_TOP_LEVEL[key]] = tensor
            continue
        match = re.match(r"^layers\.(\d+)\.(.+)$", key)
        if match is None or match.group(2) not in _PER_LAYER:
            unknown.append(key)
            continue
        hf[f"model.layers.{match.group(1)}.{_PER_LAYER[match.group(2)]}"] = tensor
    if unknown:
        raise AssayError(f"native Llama state dict has keys with no Transformers name: {_few(unknown)}")
    return hf


def from_hf(hf_state_dict: Mapping[str, torch.Tensor], args: LlamaArgs, slice_layers: bool = False) -> dict[str, torch.Tensor]:
    """Transformers state dict (may be lazy: only the tensors the spec needs are read) -> native keys.

    A spec with fewer layers than the checkpoint loads only with slice_layers=True (the first layers).
    """
    layer_ids = [int(m.group(1)) for key in hf_state_dict.keys() if (m := _HF_LAYER_KEY.match(key))]
    checkpoint_layers = max(layer_ids) + 1 if layer_ids else 0
    if checkpoint_layers < args.n_layers:
        raise AssayError(f"the spec asks for {args.n_layers} layers but the checkpoint has {checkpoint_layers}")
    if checkpoint_layers > args.n_layers and not slice_layers:
        raise AssayError(f"the spec keeps {args.n_layers} of the checkpoint's {checkpoint_layers} layers; "
                         "pass slice_experts=True (--slice-experts) to load a sliced copy on purpose")
    native: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    consumed: set[str] = set()

    def take(native_key: str, hf_key: str) -> None:
        if hf_key in hf_state_dict:
            native[native_key] = hf_state_dict[hf_key]
            consumed.add(hf_key)
        else:
            missing.append(hf_key)

    take("tok_embeddings.weight", "model.embed_tokens.weight")
    take("norm.weight", "model.norm.weight")
    if args.tie_embeddings:
        # A tied checkpoint may still carry lm_head.weight (a copy of the embedding); the model shares one tensor.
        consumed.add("lm_head.weight")
        if "tok_embeddings.weight" in native:
            native["output.weight"] = native["tok_embeddings.weight"]
    else:
        take("output.weight", "lm_head.weight")
    for layer_id in range(args.n_layers):
        for rest in native_layer_keys(args):
            take(f"layers.{layer_id}.{rest}", f"model.layers.{layer_id}.{_PER_LAYER[rest]}")
    if missing:
        raise AssayError(f"checkpoint lacks {len(missing)} tensors the Llama spec needs: {_few(missing)}")
    unexpected = [
        key for key in hf_state_dict.keys()
        if key not in consumed and not key.endswith(_IGNORED_HF_SUFFIXES)
        and not ((m := _HF_LAYER_KEY.match(key)) and int(m.group(1)) >= args.n_layers)
    ]
    if unexpected:
        raise AssayError(f"checkpoint has {len(unexpected)} tensors the Llama spec does not use: {_few(unexpected)}")
    return native
