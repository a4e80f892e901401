"""to_hf() / from_hf(): the key map between the native Qwen3 and Transformers' Qwen3 / Qwen3-MoE
checkpoints, plus the few tensor reshapes (stacking experts). Nothing else.

MoE experts on disk. The published Qwen3-MoE checkpoints store one tensor per expert,
`model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`, and the router as
`model.layers.{i}.mlp.gate.weight`. Transformers 5 fuses them in memory (`mlp.experts.gate_up_proj`
[E, 2I, D], `mlp.experts.down_proj` [E, D, I]) through its conversion mapping, and its
save_pretrained converts back: 5.24 writes the per-expert layout. to_hf() writes the per-expert
layout (what the Hub holds and every Transformers version reloads); from_hf() reads either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from assay.core.errors import AssayError
from assay.models.qwen3.args import Qwen3Args

# Native key -> HF key, for everything that is a rename only. {i} is the layer index.
_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
    "mlp.w3.weight": "mlp.up_proj.weight",
    "moe.router.weight": "mlp.gate.weight",
}
# Stacked native expert tensor -> the per-expert HF projection it is made of.
_EXPERT_PROJ = {"moe.experts.w1": "gate_proj", "moe.experts.w2": "down_proj", "moe.experts.w3": "up_proj"}

_HF_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_HF_EXPERT_KEY = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
# Keys some older checkpoints carry that hold nothing a model needs (derived rotary frequencies).
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


def native_layer_keys(args: Qwen3Args, layer_id: int) -> list[str]:
    """The state-dict keys of one native Block (without the `layers.{i}.` prefix)."""
    keys = ["attention_norm.weight", "ffn_norm.weight"]
    keys += [f"attention.{name}.weight" for name in ("wq", "wk", "wv", "wo")]
    if args.qk_norm:
        keys += ["attention.q_norm.weight", "attention.k_norm.weight"]
    if args.is_moe_layer(layer_id):
        keys += ["moe.router.weight", *_EXPERT_PROJ]
    else:
        keys += ["mlp.w1.weight", "mlp.w2.weight", "mlp.w3.weight"]
    return keys


def _few(keys, limit: int = 5) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


# ---------------------------------------------------------------- native -> HF


def to_hf(state_dict: Mapping[str, torch.Tensor], args: Qwen3Args) -> dict[str, torch.Tensor]:
    """Native state dict -> Transformers keys, experts unstacked per expert; lm_head dropped when tied.

    Values are views of the native tensors (no copy): the writer makes each one contiguous and unshared.
    """
    hf: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in state_dict.items():
        if key in _TOP_LEVEL:
            if key == "output.weight" and args.tie_embeddings:
                continue  # tied: Transformers rebuilds lm_head from the embedding
            hf[_TOP_LEVEL[key]] = tensor
            continue
        match = re.match(r"^layers\.(\d+)\.(.+)$", key)
        if match is None:
            unknown.append(key)
            continue
        layer, rest = match.groups()
        prefix = f"model.layers.{layer}."
        if rest in _PER_LAYER:
            hf[prefix + _PER_LAYER[rest]] = tensor
        elif rest in _EXPERT_PROJ:
            for expert, expert_weight in enumerate(tensor.unbind(0)):
                hf[f"{prefix}mlp.experts.{expert}.{_EXPERT_PROJ[rest]}.weight"] = expert_weight
        else:
            unknown.append(key)
    if unknown:
        raise AssayError(f"native Qwen3 state dict has keys with no Transformers name: {_few(unknown)}")
    return hf


# ---------------------------------------------------------------- HF -> native


def _checkpoint_layers(hf_keys) -> int:
    layer_ids = [int(m.group(1)) for key in hf_keys if (m := _HF_LAYER_KEY.match(key))]
    return max(layer_ids) + 1 if layer_ids else 0


def _checkpoint_experts(hf_state_dict: Mapping[str, torch.Tensor], layer_id: int) -> int | None:
    """Experts in one HF layer, from its router rows; None for a dense layer."""
    router_key = f"model.layers.{layer_id}.mlp.gate.weight"
    if router_key not in hf_state_dict:
        return None
    return int(hf_state_dict[router_key].shape[0])


def _check_reduction(hf_state_dict: Mapping[str, torch.Tensor], args: Qwen3Args, slice_experts: bool) -> None:
    """A spec with fewer layers or experts than the checkpoint loads only when slicing was asked for."""
    ckpt_layers = _checkpoint_layers(hf_state_dict.keys())
    moe_layer = next((i for i in range(args.n_layers) if args.is_moe_layer(i)), None)
    ckpt_experts = _checkpoint_experts(hf_state_dict, moe_layer) if moe_layer is not None else None
    if ckpt_layers < args.n_layers:
        raise AssayError(f"the spec asks for {args.n_layers} layers but the checkpoint has {ckpt_layers}")
    if ckpt_experts is not None and ckpt_experts < args.n_experts:
        raise AssayError(f"the spec asks for {args.n_experts} experts but the checkpoint's MoE layers have {ckpt_experts}")
    reduced = []
    if ckpt_layers > args.n_layers:
        reduced.append(f"{args.n_layers} of its {ckpt_layers} layers")
    if ckpt_experts is not None and ckpt_experts > args.n_experts:
        reduced.append(f"{args.n_experts} of its {ckpt_experts} experts (and router rows)")
    if reduced and not slice_experts:
        raise AssayError(
            "the spec is smaller than the checkpoint: it keeps only the first " + " and ".join(reduced)
            + "; pass slice_experts=True (--slice-experts) to load a sliced copy on purpose"
        )


def _stacked_expert(hf_state_dict, prefix: str, native_name: str, n_experts: int, moe_hidden_dim: int, missing: list):
    """[E, ...] from per-expert tensors, or a slice of Transformers' fused in-memory layout."""
    proj = _EXPERT_PROJ[native_name]
    per_expert = [f"{prefix}mlp.experts.{e}.{proj}.weight" for e in range(n_experts)]
    if all(key in hf_state_dict for key in per_expert):
        return torch.stack([hf_state_dict[key] for key in per_expert])
    fused_key = f"{prefix}mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
    if fused_key in hf_state_dict:
        fused = hf_state_dict[fused_key][:n_experts]  # [E, 2I, D] gate then up, or [E, D, I]
        if proj == "gate_proj":
            return fused[:, :moe_hidden_dim]
        if proj == "up_proj":
            return fused[:, moe_hidden_dim : 2 * moe_hidden_dim]
        return fused
    missing.extend(key for key in per_expert if key not in hf_state_dict)
    return None


def from_hf(hf_state_dict: Mapping[str, torch.Tensor], args: Qwen3Args, slice_experts: bool = False) -> dict[str, torch.Tensor]:
    """Transformers state dict (on-disk per-expert or in-memory fused experts) -> native keys.

    `hf_state_dict` may be lazy (a Mapping that reads a tensor when indexed): only the tensors the
    spec needs are read, so slicing a 4-layer model out of a large checkpoint reads 4 layers.
    """
    _check_reduction(hf_state_dict, args, slice_experts)
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
        prefix = f"model.layers.{layer_id}."
        for rest in native_layer_keys(args, layer_id):
            native_key = f"layers.{layer_id}.{rest}"
            if rest in _PER_LAYER:
                take(native_key, prefix + _PER_LAYER[rest])
                if rest == "moe.router.weight" and native_key in native:
                    native[native_key] = native[native_key][: args.n_experts]
            else:
                stacked = _stacked_expert(hf_state_dict, prefix, rest, args.n_experts, args.moe_hidden_dim, missing)
                if stacked is not None:
                    native[native_key] = stacked
        if args.is_moe_layer(layer_id):
            # All expert tensors of a kept MoE layer count as used: experts beyond the spec were sliced off on purpose.
            consumed.update(key for key in hf_state_dict.keys() if key.startswith(prefix) and _is_expert_or_fused(key[len(prefix) :]))

    if missing:
        raise AssayError(f"checkpoint lacks {len(missing)} tensors the Qwen3 spec needs: {_few(missing)}")
    unexpected = [
        key
        for key in hf_state_dict.keys()
        if key not in consumed
        and not key.endswith(_IGNORED_HF_SUFFIXES)
        and not (slice_experts and _layer_of(key) is not None and _layer_of(key) >= args.n_layers)
    ]
    if unexpected:
        raise AssayError(f"checkpoint has {len(unexpected)} tensors the Qwen3 spec does not use: {_few(unexpected)}")
    return native


def _is_expert_or_fused(rest: str) -> bool:
    return bool(_HF_EXPERT_KEY.match(rest)) or rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _layer_of(hf_key: str) -> int | None:
    match = _HF_LAYER_KEY.match(hf_key)
    return int(match.group(1)) if match else None
