"""Model roots every native decoder shares: NativeDecoder (build, tie, initialisation), the static
KV-cache decoding loop (KVCacheDecoder, gpt-fast style) and RotaryDecoder (a root with one rotary table)."""

from __future__ import annotations

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.models.common.attention import KVCache
from assay.models.common.feed_forward import GroupedExperts
from assay.models.common.linear_attention import ShortConvolution
from assay.models.common.norm import RMSNorm
from assay.models.common.rope import rotary_cos_sin


class KVCacheDecoder:
    """The static-KV-cache decoding loop of a decoder with a rotary table (gpt-fast style), shared by
    every such native model. The model has tok_embeddings, layers (blocks with attention_norm,
    attention.prefill / attention.decode and feed_forward), norm, output, rope_cos / rope_sin and
    args.n_kv_heads / args.head_dim.

    prefill() goes through the rope/sdpa seams exactly as forward() does (so its logits are forward()'s);
    decode_step() appends one token per row at that row's own position with plain ops.
    """

    def init_kv_cache(self, n_rows: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """A zeroed static cache: per layer (k, v), each [n_rows, max_len, n_kv_heads, head_dim].

        Static (allocated once, written in place): a compiled decode_step sees the same shapes every
        token; a growing cache would recompile at every length.
        """
        if n_rows < 1 or max_len < 1:
            raise AssayError(f"a KV cache needs n_rows >= 1 and max_len >= 1, got {n_rows} and {max_len}")
        if max_len > self.rope_cos.shape[0]:
            raise AssayError(f"KV cache max_len={max_len} exceeds the model's max_seq_len={self.rope_cos.shape[0]}")
        weight = self.tok_embeddings.weight
        dtype = dtype or weight.dtype
        shape = (n_rows, max_len, self.args.n_kv_heads, self.args.head_dim)
        return [
            (torch.zeros(shape, dtype=dtype, device=weight.device), torch.zeros(shape, dtype=dtype, device=weight.device))
            for _ in self.layers
        ]

    def prefill(self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T]; slot_ids: [B] int64 -> logits: [B, T, vocab]; writes positions 0..T-1 of rows slot_ids
        seq_len = tokens.shape[1]
        max_len = kv_cache[0][0].shape[1]
        if seq_len > max_len:
            raise AssayError(f"a prompt of {seq_len} tokens exceeds the KV cache length {max_len}")
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for block, cache in zip(self.layers, kv_cache):
            h = h + block.attention.prefill(block.attention_norm(h), cos, sin, cache, slot_ids)
            h = block.feed_forward(h)
        return self.output(self.norm(h))

    def decode_step(self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # tokens: [W, 1]; slot_ids, positions: [W] int64 -> logits: [W, 1, vocab]
        # Row w's new k/v go to position positions[w] of cache row slot_ids[w]; it attends to 0..positions[w].
        # positions is a tensor, never a Python int, so a compiled step does not specialise on the length.
        max_len = kv_cache[0][0].shape[1]
        cos, sin = self.rope_cos[positions][:, None, :], self.rope_sin[positions][:, None, :]  # [W, 1, D]
        span = torch.arange(max_len, device=positions.device)
        visible = (span[None, :] <= positions[:, None])[:, None, None, :]  # [W, 1, 1, S]
        h = self.tok_embeddings(tokens)
        for block, cache in zip(self.layers, kv_cache):
            h = h + block.attention.decode(block.attention_norm(h), cos, sin, cache, slot_ids, positions, visible)
            h = block.feed_forward(h)
        return self.output(self.norm(h))


class NativeDecoder(nn.Module):
    """What every native causal LM root shares: tok_embeddings ... output, the tie, the initialisation."""

    args: object
    tok_embeddings: nn.Embedding
    output: nn.Linear

    @classmethod
    def build(cls, args, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0, std: float = 0.02):
        """A randomly initialised model (on "meta": shapes only, for counting or parallelize-then-materialise)."""
        with torch.device(device):
            model = cls(args)
        if torch.device(device).type != "meta":
            generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
            model.init_weights(std=std, generator=generator)
        return model.to(dtype=dtype)

    def tie_weights(self) -> None:
        """Share the embedding with the output head (again after load_state_dict(assign=True) or to_empty)."""
        if self.args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Transformers' (and fla's) random initialisation: normal(0, std) matrices, zero biases, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, GroupedExperts):
                for weight in (module.w1, module.w2, module.w3):
                    weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, ShortConvolution):
                module.reset_parameters(generator)
        self.reset_rope_cache()

    def reset_rope_cache(self) -> None:
        """Derived buffers to recompute on the weights' device; none by default."""


class RotaryDecoder(KVCacheDecoder, NativeDecoder):
    """A decoder of blocks `block(h, cos, sin)` with one rotary table on the root (args: head_dim,
    max_seq_len, rope_theta, and rope_scaling when it scales), and static-KV-cache decoding."""

    def init_rope_cache(self) -> None:
        # Non-persistent: derived from the spec, never in a checkpoint. float32 here; cast at use.
        cos, sin = self._rope_table(None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _rope_table(self, device):
        args = self.args
        return rotary_cos_sin(args.head_dim, args.max_seq_len, args.rope_theta, device=device, scaling=getattr(args, "rope_scaling", None))

    def reset_rope_cache(self) -> None:
        """Recompute cos/sin on the embedding's device (a model built on the meta device has none)."""
        self.rope_cos, self.rope_sin = self._rope_table(self.tok_embeddings.weight.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] -> logits: [B, T, vocab]
        return self.output(self.hidden_states(tokens))

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] -> the final normalised hidden states [B, T, dim], what the output head reads
        # (the trainer's chunked loss multiplies them by the head's weight a chunk at a time).
        seq_len = tokens.shape[1]
        if seq_len > self.rope_cos.shape[0]:
            raise AssayError(f"a sequence of {seq_len} tokens exceeds the model's max_seq_len={self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.norm(h)
