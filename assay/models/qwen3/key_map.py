"""The key map between the native Qwen3 and Transformers' Qwen3 / Qwen3-MoE checkpoints, plus the one
tensor reshape (stacking experts). The loops are KeyMap's; this file overrides its expert hooks.

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
from assay.models.common.key_map import HF_ATTENTION_KEYS, HF_MLP_KEYS, HF_QK_NORM_KEYS, KeyMap, Reading
from assay.models.qwen3.args import Qwen3Args

# Stacked native expert tensor -> the per-expert HF projection it is made of.
_EXPERT_PROJ = {"moe.experts.w1": "gate_proj", "moe.experts.w2": "down_proj", "moe.experts.w3": "up_proj"}
_HF_EXPERT_KEY = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_HF_FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


class Qwen3KeyMap(KeyMap):
    FAMILY = "Qwen3"
    PER_LAYER = {
        "attention_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        **HF_ATTENTION_KEYS,
        **HF_QK_NORM_KEYS,
        **HF_MLP_KEYS,
        "moe.router.weight": "mlp.gate.weight",
    }

    def layer_keys(self, layer_id: int) -> list[str]:
        args: Qwen3Args = self.args
        keys = ["attention_norm.weight", "ffn_norm.weight", *(f"attention.w{n}.weight" for n in "qkvo")]
        if args.qk_norm:
            keys += ["attention.q_norm.weight", "attention.k_norm.weight"]
        if args.is_moe_layer(layer_id):
            return keys + ["moe.router.weight", *_EXPERT_PROJ]
        return keys + ["mlp.w1.weight", "mlp.w2.weight", "mlp.w3.weight"]

    # ---------------------------------------------------------------- the experts hooks

    def layer_to_hf(self, rest: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        if rest in _EXPERT_PROJ:  # unstacked per expert (views, no copy: the writer makes each one its own)
            return {f"mlp.experts.{expert}.{_EXPERT_PROJ[rest]}.weight": weight for expert, weight in enumerate(tensor.unbind(0))}
        return super().layer_to_hf(rest, tensor)

    def read_layer(self, reading: Reading, layer_id: int, rest: str) -> None:
        args: Qwen3Args = self.args
        prefix, native_key = f"model.layers.{layer_id}.", f"layers.{layer_id}.{rest}"
        if rest in _EXPERT_PROJ:
            stacked = _stacked_expert(reading, prefix, _EXPERT_PROJ[rest], args.n_experts, args.moe_hidden_dim)
            if stacked is not None:
                reading.native[native_key] = stacked
            # All expert tensors of a kept MoE layer count as used: experts beyond the args were sliced off on purpose.
            reading.consumed.update(key for key in reading.source.keys() if key.startswith(prefix) and _is_expert_or_fused(key[len(prefix):]))
            return
        super().read_layer(reading, layer_id, rest)
        if rest == "moe.router.weight" and native_key in reading.native:
            reading.native[native_key] = reading.native[native_key][: args.n_experts]

    def reductions(self, hf_state_dict: Mapping[str, torch.Tensor]) -> list[str]:
        args: Qwen3Args = self.args
        reduced = super().reductions(hf_state_dict)
        moe_layer = next((i for i in range(args.n_layers) if args.is_moe_layer(i)), None)
        router_key = f"model.layers.{moe_layer}.mlp.gate.weight"
        if moe_layer is None or router_key not in hf_state_dict:
            return reduced
        in_checkpoint = int(hf_state_dict[router_key].shape[0])  # experts, from the router's rows
        if in_checkpoint < args.n_experts:
            raise AssayError(f"the spec asks for {args.n_experts} experts but the checkpoint's MoE layers have {in_checkpoint}")
        if in_checkpoint > args.n_experts:
            reduced.append(f"{args.n_experts} of its {in_checkpoint} experts (and router rows)")
        return reduced


def _stacked_expert(reading: Reading, prefix: str, proj: str, n_experts: int, moe_hidden_dim: int) -> torch.Tensor | None:
    """[E, ...] from per-expert tensors, or a slice of Transformers' fused in-memory layout."""
    per_expert = [f"{prefix}mlp.experts.{e}.{proj}.weight" for e in range(n_experts)]
    if all(key in reading.source for key in per_expert):
        return torch.stack([reading.source[key] for key in per_expert])
    fused_key = f"{prefix}mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
    if fused_key in reading.source:
        fused = reading.source[fused_key][:n_experts]  # [E, 2I, D] gate then up, or [E, D, I]
        if proj == "gate_proj":
            return fused[:, :moe_hidden_dim]
        if proj == "up_proj":
            return fused[:, moe_hidden_dim : 2 * moe_hidden_dim]
        return fused
    reading.missing.extend(key for key in per_expert if key not in reading.source)
    return None


def _is_expert_or_fused(rest: str) -> bool:
    return bool(_HF_EXPERT_KEY.match(rest)) or rest in _HF_FUSED


__all__ = ["Qwen3KeyMap"]
