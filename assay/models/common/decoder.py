"""The model roots every native decoder shares (torchtitan's Decoder).

  NativeDecoder   tok_embeddings -> layers -> norm -> output from args and a block builder; the tie, the
                  initialisation, build (random or meta) and load (a native state dict on a device); the
                  hooks embed() (Gemma scales the embedding) and logits() (the head, and a soft-cap).
  RotaryDecoder   + the rotary tables on the root, one per rotary kind (Gemma 3: global and local bases),
                  the training forward over TransformerBlocks, and KV-cache decoding (KVCacheDecodingMixin).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from assay.core.construct import default_device
from assay.core.errors import AssayError
from assay.models.common.feed_forward import GroupedExperts
from assay.models.common.kv_cache import KVCacheDecodingMixin
from assay.models.common.linear_attention import ShortConvolution
from assay.models.common.norm import RMSNorm
from assay.models.common.rope import rotary_cos_sin


class SoftcappedOutput(nn.Module):
    """The output head with a logit soft-cap, cap * tanh(x W^T / cap) (Transformers' final_logit_softcapping).
    Not an nn.Linear on purpose: a trainer must not fold it into a plain matmul loss."""

    def __init__(self, dim: int, vocab_size: int, softcap: float):
        super().__init__()
        self.softcap = softcap
        self.weight = nn.Parameter(torch.empty(vocab_size, dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # h: [..., dim] -> [..., vocab]
        return torch.tanh(nn.functional.linear(h, self.weight) / self.softcap) * self.softcap

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[0]}, softcap={self.softcap}"


class NativeDecoder(nn.Module):
    """What every native causal LM root shares: tok_embeddings, layers, norm, output, the tie, the initialisation."""

    def __init__(self, args: Any, block: Callable[[Any, int], nn.Module], *, unit_offset: bool = False,
                 logit_softcap: float | None = None):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(block(args, layer_id) for layer_id in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, unit_offset)
        if logit_softcap is None:
            self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        else:
            self.output = SoftcappedOutput(args.dim, args.vocab_size, logit_softcap)
        self.tie_weights()
        self.init_buffers()

    @classmethod
    def build(cls, args, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0, std: float = 0.02):
        """A randomly initialised model (on "meta": shapes only, for counting or parallelize-then-materialise)."""
        with default_device(device):
            model = cls(args)
        if torch.device(device).type != "meta":
            generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
            model.init_weights(std=std, generator=generator)
        return model.to(dtype=dtype)

    @classmethod
    def from_state_dict(cls, args, native: Mapping[str, torch.Tensor], device: torch.device | str, dtype: torch.dtype, family: str):
        """The model with `native`'s tensors (native key names) on device in dtype; AssayError naming
        tensors whose shape does not fit the spec."""
        from assay.models.hf_checkpoint import load_into_meta_model

        model = load_into_meta_model(cls, args, native, device, dtype, family)
        model.tie_weights()  # assign=True gave output and embedding separate Parameters
        model.reset_buffers()  # derived buffers (a rotary table) on the weights' device
        return model

    def tie_weights(self) -> None:
        """Share the embedding with the output head (again after load_state_dict(assign=True) or to_empty)."""
        if self.args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Transformers' (and fla's) random initialisation: normal(0, std) matrices, zero biases, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding, SoftcappedOutput)):
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, GroupedExperts):
                for weight in (module.w1, module.w2, module.w3):
                    weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
            elif isinstance(module, ShortConvolution):
                # As fla's GLAForCausalLM._init_weights (its ShortConvolution is an nn.Conv1d): normal(0, std)
                # filters, zero bias (docs/gla.md, "Short convolutions": measured against nn.Conv1d's uniform).
                module.weight.normal_(0.0, std, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
        self.reset_buffers()

    def init_buffers(self) -> None:
        """Register the derived, non-persistent buffers (never in a checkpoint); none by default."""

    def reset_buffers(self) -> None:
        """Recompute the derived buffers on the weights' device (a model built on meta has none); none by default."""

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens: [B, T] -> [B, T, dim]
        return self.tok_embeddings(tokens)

    def logits(self, hidden: torch.Tensor, logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        # hidden: [B, T, dim], normalised -> [B, T or the kept positions, vocab]. logits_to_keep as Transformers':
        # an int n > 0 keeps the last n positions (0: all), a tensor the positions it lists.
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden[:, logits_to_keep]
        return self.output(hidden)


class RotaryDecoder(KVCacheDecodingMixin, NativeDecoder):
    """A decoder of TransformerBlocks with the rotary tables on the root: one per rotary kind (args.rope_tables(),
    each block's rope_kind picks one), [kinds, max_seq_len, head_dim] float32, cast at use."""

    def _rope_tables(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        args = self.args
        tables = [rotary_cos_sin(args.head_dim, args.max_seq_len, theta, device=device, scaling=scaling) for theta, scaling in args.rope_tables()]
        return torch.stack([cos for cos, _ in tables]), torch.stack([sin for _, sin in tables])

    def init_buffers(self) -> None:
        if self.tok_embeddings.weight.is_meta:  # shapes only (reset_buffers computes them where the weights land)
            shape = (len(self.args.rope_tables()), self.args.max_seq_len, self.args.head_dim)
            cos, sin = torch.empty(shape), torch.empty(shape)
        else:
            cos, sin = self._rope_tables(None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_buffers(self) -> None:
        self.rope_cos, self.rope_sin = self._rope_tables(self.tok_embeddings.weight.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] -> logits: [B, T, vocab]
        return self.logits(self.hidden_states(tokens))

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] -> the final normalised hidden states [B, T, dim], what the output head reads
        # (the trainer's chunked loss multiplies them by the head's weight a chunk at a time).
        seq_len = tokens.shape[1]
        if seq_len > self.rope_cos.shape[1]:
            raise AssayError(f"a sequence of {seq_len} tokens exceeds the model's max_seq_len={self.rope_cos.shape[1]}")
        cos, sin = self.rope_cos[:, :seq_len], self.rope_sin[:, :seq_len]
        h = self.embed(tokens)
        for block in self.layers:
            h = block(h, cos[block.rope_kind], sin[block.rope_kind])
        return self.norm(h)
