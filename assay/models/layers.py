"""Layers shared by every native model, and the kernel seams: RMSNorm, rotary, causal attention,
SwiGLU MLP, grouped experts, the GLA operator and its short convolution, and the static KV-cache
decoding loop of a decoder.

The kernel registry (assay.kernels) targets the module classes here, never a model class, so a new
architecture that builds from these layers gets the kernels with no kernel change:
  RotaryEmbedding   (q, k, cos, sin) -> (q, k), [B, T, H, D]     kernel "rope"
  CausalAttention   (q, k, v) -> out, [B, T, H, D]                kernel "attention"
  GroupedExperts    (x, top_k_index, top_k_weights) -> out         kernel "grouped_experts"
  GLAOperator       (q, k, v, g, initial_state, output_final_state) kernel "gla_chunk"

Numerics follow Transformers (rotate-half rotary, float32 normalisation then cast, then scale) so a
native model's float32 logits equal Transformers' to rounding.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.nn.functional as F
from torch import nn

from assay.core.errors import AssayError
from assay.ops import gla_chunk, gla_step


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        # Normalise in float32, cast back, then scale: Transformers' order, so bf16 rounding matches too.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


# ---------------------------------------------------------------- rotary


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent rotary scaling (rope_type "llama3"): long wavelengths are divided by
    `factor`, short ones kept, the band between interpolated. factor 1 with no band is the plain rotary."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def rotary_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None, device=None) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies; Transformers' _compute_llama3_parameters when scaled."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if scaling is None:
        return inv_freq
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


def rotary_cos_sin(
    head_dim: int, max_seq_len: int, theta: float, device=None, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_seq_len, head_dim], float32, each frequency repeated in both halves (HF layout)."""
    inv_freq = rotary_inv_freq(head_dim, theta, scaling, device)
    positions = torch.arange(max_seq_len, dtype=torch.float32, device=device)
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary at per-row positions. q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [B, T, D] (float32)."""
    cos = cos[:, :, None, :].to(q.dtype)
    sin = sin[:, :, None, :].to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RotaryEmbedding(nn.Module):
    """Applies the rotary embedding; the cos/sin cache lives on the model root (one copy for all layers)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # q: [B, T, Hq, D]; k: [B, T, Hkv, D]; cos, sin: [T, D]
        cos = cos[None, :, None, :].to(q.dtype)
        sin = sin[None, :, None, :].to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# ---------------------------------------------------------------- attention


class CausalAttention(nn.Module):
    """Causal softmax attention over [B, T, H, D]; grouped-query (fewer k/v heads) handled by SDPA."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] -> [B, T, Hq, D]
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
        )
        return attended.transpose(1, 2)


# Per layer (k, v), each [n_rows, max_len, n_kv_heads, head_dim]: one row per serving slot.
KVCache: TypeAlias = list[tuple[torch.Tensor, torch.Tensor]]


def write_prefill_kv(cache: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor, slot_ids: torch.Tensor) -> None:
    # k, v: [B, T, Hkv, D] -> positions 0..T-1 of cache rows slot_ids
    cache_k, cache_v = cache
    seq_len = k.shape[1]
    cache_k[slot_ids, :seq_len] = k.to(cache_k.dtype)
    cache_v[slot_ids, :seq_len] = v.to(cache_v.dtype)


def cached_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
    slot_ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
) -> torch.Tensor:
    """One new token per row against its static cache row.

    q: [W, 1, Hq, D]; k, v: [W, 1, Hkv, D] (rotated); cache k, v: [N, S, Hkv, D]; slot_ids, positions: [W];
    visible: [W, 1, 1, S] bool -> attended [W, 1, Hq, D]
    """
    cache_k, cache_v = cache
    # In place (index_put_ on the graph input): the cache stays one static buffer, no recompiles.
    cache_k.index_put_((slot_ids, positions), k[:, 0].to(cache_k.dtype))
    cache_v.index_put_((slot_ids, positions), v[:, 0].to(cache_v.dtype))
    keys, values = cache_k[slot_ids].to(q.dtype), cache_v[slot_ids].to(q.dtype)  # [W, S, Hkv, D]
    attended = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=visible,
        enable_gqa=q.shape[2] != keys.shape[2],
    )
    return attended.transpose(1, 2)


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


# ---------------------------------------------------------------- feed-forward


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@functools.cache
def grouped_mm_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch._grouped_mm runs on this device type and dtype (tried once on a tiny problem)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.zeros(8, 8, dtype=dtype, device=device_type)
        b = torch.zeros(2, 8, 8, dtype=dtype, device=device_type)
        torch._grouped_mm(a, b, offs=torch.tensor([4, 8], dtype=torch.int32, device=device_type))
        torch._grouped_mm(a.t(), a, offs=torch.tensor([4, 8], dtype=torch.int32, device=device_type))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


class GroupedExperts(nn.Module):
    """n_experts SwiGLU MLPs stored stacked; each slice [e] is an nn.Linear weight (out, in).

    The (token, slot) pairs are sorted by expert once (a stable sort: tokens keep their order within an
    expert), then each projection is one torch._grouped_mm over the expert groups where it runs (plain
    float32/bfloat16/float16 weights, rows of a multiple of 16 bytes; on CPU in torch 2.13 it gives the
    same bits as F.linear per expert, forward and backward: checked at the zoo MoE's shapes), else a loop
    over the experts that received tokens with one host read of the group sizes. Both give the bits the
    per-expert mask loop gave (same F.linear rows in the same order; the one index_add_ over the
    expert-major pairs adds each token's expert outputs in the same order). `use_grouped_mm = False`
    forces the loop: the reference a grouped-GEMM kernel is checked against.
    """

    use_grouped_mm = True

    def __init__(self, n_experts: int, dim: int, hidden_dim: int):
        super().__init__()
        self.n_experts = n_experts
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))  # gate projection
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))  # down projection
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))  # up projection

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # x: [N, dim]; top_k_index, top_k_weights: [N, top_k] -> [N, dim]
        top_k = top_k_index.shape[1]
        flat = top_k_index.flatten()
        order = torch.argsort(flat, stable=True)  # pair ids, expert-major
        counts = torch.bincount(flat, minlength=self.n_experts)
        token_ids = order // top_k
        tokens = x[token_ids]
        if self._grouped_mm_fits(x):
            offsets = torch.cumsum(counts, 0).to(torch.int32)
            hidden = F.silu(torch._grouped_mm(tokens, self.w1.transpose(1, 2), offs=offsets))
            hidden = hidden * torch._grouped_mm(tokens, self.w3.transpose(1, 2), offs=offsets)
            expert_out = torch._grouped_mm(hidden, self.w2.transpose(1, 2), offs=offsets)
        else:
            outputs, start = [], 0
            for expert, count in enumerate(counts.tolist()):  # the one host sync
                if count:
                    rows = tokens[start:start + count]
                    hidden = F.silu(F.linear(rows, self.w1[expert])) * F.linear(rows, self.w3[expert])
                    outputs.append(F.linear(hidden, self.w2[expert]))
                    start += count
            if not outputs:  # no tokens
                return torch.zeros_like(x)
            expert_out = torch.cat(outputs)
        expert_out = expert_out * top_k_weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token_ids, expert_out.to(x.dtype))

    def _grouped_mm_fits(self, x: torch.Tensor) -> bool:
        weights = (self.w1, self.w2, self.w3)
        return (
            self.use_grouped_mm and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            # Plain tensors only: a tensor-parallel shard (a tensor subclass) keeps the per-expert loop.
            and all(type(w) in (torch.Tensor, nn.Parameter) and w.dtype == x.dtype for w in weights)
            and (x.shape[-1] * x.element_size()) % 16 == 0 and (self.w1.shape[1] * x.element_size()) % 16 == 0
            # Under torch.compile, torch 2.13's fake-tensor rule for _grouped_mm accepts only bfloat16
            # ("Expected inputs of BF16 type"), although the CPU kernel runs float32: compiled float32
            # keeps the loop (and its graph break at the host read).
            and (x.dtype == torch.bfloat16 or not torch.compiler.is_compiling())
            and grouped_mm_runs(x.device.type, x.dtype)
        )


# ---------------------------------------------------------------- gated linear attention


class GLAOperator(nn.Module):
    """The gated-linear-attention recurrence over [B, T, H, D]: chunkwise in parallel, or one step."""

    def __init__(self, chunk_size: int):
        super().__init__()
        self.chunk_size = chunk_size

    def forward(self, q, k, v, g, initial_state=None, output_final_state=False):
        # q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [B, H, K, V] -> o [B, T, H, V], state or None
        return gla_chunk(q, k, v, g, initial_state=initial_state, output_final_state=output_final_state, chunk_size=self.chunk_size)

    def step(self, q, k, v, g, state):
        # q, k, g: [B, H, K]; v: [B, H, V]; state: [B, H, K, V] -> o [B, H, V], new state
        return gla_step(q, k, v, g, state)

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}"


class ShortConvolution(nn.Module):
    """A causal depthwise convolution over time, then SiLU: fla's ShortConvolution (activation "silu") on
    [B, T, D]. Each channel mixes its own last `kernel_size` inputs, so a token's q, k or v also carries
    its few predecessors: what lets a linear-attention layer write "this key followed that one" into its
    state (the recall probes' key -> value pairs), which a per-token projection cannot.

    weight [D, 1, W] (nn.Conv1d's layout, fla's checkpoint shape); bias [D] or none. Between calls the
    layer's state is its last W - 1 inputs, [B, W - 1, D] (zeros before the first token).
    """

    def __init__(self, width: int, kernel_size: int, bias: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(width, 1, kernel_size))
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        # nn.Conv1d's own initialisation (uniform, bound 1 / sqrt(kernel_size) for a depthwise filter): the
        # filter starts near a unit-gain average of the taps. fla draws it as its matrices, normal(0, std),
        # which at std 0.02-0.05 scales q, k and v down about 20-50x; the recall runs used this one.
        bound = 1.0 / math.sqrt(self.kernel_size)
        self.weight.uniform_(-bound, bound, generator=generator)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False):
        # x: [B, T, D]; state: [B, W - 1, D] or None (zeros) -> (y [B, T, D], the last W - 1 inputs or None)
        width = x.shape[-1]
        history = self.kernel_size - 1
        if state is None:
            padded = F.pad(x, (0, 0, history, 0))  # [B, W - 1 + T, D]
        else:
            padded = torch.cat([state.to(x.dtype), x], dim=1)
        y = F.conv1d(padded.transpose(1, 2), self.weight, self.bias, groups=width)  # [B, D, T]
        final = padded[:, padded.shape[1] - history:].contiguous() if output_final_state else None
        return F.silu(y.transpose(1, 2)), final

    def extra_repr(self) -> str:
        return f"width={self.weight.shape[0]}, kernel_size={self.kernel_size}, bias={self.bias is not None}"


# ---------------------------------------------------------------- model roots


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


# ---------------------------------------------------------------- counting


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter once (a tied embedding/output counts once)
    embedding: int  # the token embedding table (a lookup, not a matmul)
    active_matmul: int  # matmul weights one token passes: attention, MLP or router + top_k experts, output head


def count_parameters(model: nn.Module, top_k: int = 0) -> ParamCounts:
    """Parameter counts for the MFU formula (assay.core.metrics.train_flops_per_token takes active_matmul).

    Works on the meta device, so a 235B spec is counted without allocating it. top_k: experts each
    token passes (MoE models).
    """
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    embedding = model.tok_embeddings.weight.numel()
    active = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            active += module.weight.numel()  # includes the output head even when tied to the embedding
        elif isinstance(module, GroupedExperts):
            per_expert = (module.w1.numel() + module.w2.numel() + module.w3.numel()) // module.n_experts
            active += per_expert * top_k
    return ParamCounts(total=total, embedding=embedding, active_matmul=active)
