"""The static KV cache of a rotary decoder (gpt-fast style) and its decoding loop, shared by every such
native model (Llama, Qwen3, Gemma 3): KVCacheDecodingMixin.

The cache is one (k, v) pair per layer, each [n_rows, L, n_kv_heads, head_dim], one row per serving slot,
allocated once and written in place (a compiled decode sees the same shapes every token). L is the slot
length (max_len) for a full-attention layer; a sliding-window layer keeps a ring of min(window, max_len)
positions, position p at index p % L, since its tokens never look further back.

  prefill_batch(tokens [B, T] right-padded, kv_cache, slot_ids, lengths, start_positions)
      one pass over the padded batch: one attention call per layer, each row attending to its own cached
      positions < start and its chunk causally (fresh rows: through the model's seams exactly as forward());
      only real tokens are written, the last L of a row into a ring, never past a row's end.
  decode_step(tokens [W, 1], kv_cache, slot_ids, positions)
      one token per row at that row's own position (a tensor: a compiled step never specialises on it).

The model (the mixin's host) has embed(), layers (TransformerBlock: prefill / decode, rope_kind, and
attention.window), norm, logits(), rope_cos / rope_sin [kinds, S, D] and args.n_kv_heads / head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import torch

from assay.core.errors import AssayError

# Per layer (k, v), each [n_rows, L, n_kv_heads, head_dim]: one row per serving slot.
KVCache: TypeAlias = list[tuple[torch.Tensor, torch.Tensor]]

LIVE_GRAIN = 128  # positions: an eager decode reads the cache in lengths that are multiples of this
# What one more attention call per layer costs, in row-positions of attention: a row group is split off
# only when it saves more than this (one gather and one SDPA call per layer, about 0.1 ms each here).
GROUP_COST = 4 * LIVE_GRAIN


@dataclass
class DecodeStep:
    """One layer group's view of a decode step (layers of one ring length, window and rotary kind)."""

    cos: torch.Tensor  # [W, 1, D]
    sin: torch.Tensor
    cache: tuple[torch.Tensor, torch.Tensor]  # this layer's [N, L, Hkv, D]
    slot_ids: torch.Tensor  # [W]
    index: torch.Tensor  # [W]: where the new token's k/v go, position % L
    visible: torch.Tensor  # [W, 1, 1, L] bool: cache entries the new token attends to
    groups: list[RowGroup] | None = None  # eager: rows that attend over their own shorter prefix of L


@dataclass
class RowGroup:
    """Rows of an eager decode step that attend over the first `live` cache entries only: all they hold."""

    rows: torch.Tensor  # [G] indices into the step's W rows
    slot_ids: torch.Tensor  # [G]
    visible: torch.Tensor  # [G, 1, 1, live]
    live: int


def row_groups(positions: torch.Tensor, slot_ids: torch.Tensor, visible: torch.Tensor, ring: int) -> list[RowGroup] | None:
    """Rows grouped by how much of the cache they hold, when that saves attention work; None: one group.

    One padded attention call over W rows reads W x L entries, L set by the longest row: with one 2K-token
    sequence among 16 short ones every row gathers and attends over 2K positions. A row at position p holds
    min(p + 1, L) entries (ring index p % L); grouped by that length rounded up to LIVE_GRAIN, each group
    reads only its own. The partition minimises sum(rows x length) + GROUP_COST per extra group (an exact
    dynamic programme over the few distinct lengths)."""
    need = ((positions + 1).clamp(max=ring) + LIVE_GRAIN - 1) // LIVE_GRAIN * LIVE_GRAIN
    need = need.clamp(max=ring).tolist()
    lengths = sorted(set(need))
    if len(lengths) == 1:
        return None
    counts = [need.count(length) for length in lengths]
    best, cut = [0.0], [0]  # best[i]: the cost of the rows in lengths[:i]; cut[i]: where its last group starts
    for i in range(1, len(lengths) + 1):
        options = [(best[j] + sum(counts[j:i]) * lengths[i - 1] + GROUP_COST, j) for j in range(i)]
        cost, j = min(options)
        best.append(cost)
        cut.append(j)
    bounds, i = [], len(lengths)
    while i > 0:
        bounds.append((cut[i], i))
        i = cut[i]
    if len(bounds) == 1:
        return None
    groups = []
    need_tensor = torch.tensor(need, device=positions.device)
    for start, end in reversed(bounds):
        low = lengths[start - 1] if start > 0 else 0
        live = lengths[end - 1]
        rows = torch.nonzero((need_tensor > low) & (need_tensor <= live)).flatten()
        groups.append(RowGroup(rows, slot_ids.index_select(0, rows), visible.index_select(0, rows)[..., :live], live))
    return groups


@dataclass
class PrefillStep:
    """One layer group's view of a batched prefill."""

    cos: torch.Tensor  # [T, D] shared (fresh rows, the seam's layout) or [B, T, D] per row
    sin: torch.Tensor
    cache: tuple[torch.Tensor, torch.Tensor]
    slot_ids: torch.Tensor  # [B]
    sources: torch.Tensor  # [B, L]: the chunk index each cache entry takes
    written: torch.Tensor  # [B, L] bool: whether it takes one (else it keeps what it holds)
    mask: torch.Tensor | None  # [B, 1, T, L + T] over (cached, chunk) keys; None: fresh rows, causal in-chunk

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # k, v: [B, T, Hkv, D]. Whole rows rebuilt: a real token's k/v where `written`, the old entry elsewhere,
        # so pads write nothing and no index is written twice (a ring keeps each row's last L tokens).
        rows = torch.arange(k.shape[0], device=k.device)[:, None]
        keep = self.written[:, :, None, None]
        for part, new in zip(self.cache, (k, v)):
            part[self.slot_ids] = torch.where(keep, new[rows, self.sources].to(part.dtype), part[self.slot_ids])


def ring_entries(starts: torch.Tensor, lengths: torch.Tensor, ring: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a ring of `ring` entries receiving positions starts..starts+lengths-1 ([B] each): per entry j,
    the latest such position p with p % ring == j, as its chunk index p - start, and whether there is one."""
    last = starts + lengths - 1  # [B]
    entry = torch.arange(ring, device=starts.device)
    position = last[:, None] - torch.remainder(last[:, None] - entry[None, :], ring)  # [B, L], <= last
    written = (position >= starts[:, None]) & (lengths[:, None] > 0)
    return (position - starts[:, None]).clamp_min(0), written


def cached_positions(last: torch.Tensor, ring: int) -> torch.Tensor:
    """[B, L]: the position entry j of a ring holds once positions 0..last ([B]) were written (< 0: none)."""
    entry = torch.arange(ring, device=last.device)
    return last[:, None] - torch.remainder(last[:, None] - entry[None, :], ring)


class KVCacheDecodingMixin:
    def init_kv_cache(self, n_rows: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """A zeroed static cache: per layer (k, v), each [n_rows, L, n_kv_heads, head_dim] with L = max_len,
        or min(window, max_len) for a sliding-window layer."""
        if n_rows < 1 or max_len < 1:
            raise AssayError(f"a KV cache needs n_rows >= 1 and max_len >= 1, got {n_rows} and {max_len}")
        if max_len > self.rope_cos.shape[1]:
            raise AssayError(f"KV cache max_len={max_len} exceeds the model's max_seq_len={self.rope_cos.shape[1]}")
        weight = self.tok_embeddings.weight
        dtype = dtype or weight.dtype
        cache = []
        for block in self.layers:
            window = block.attention.window
            shape = (n_rows, min(window, max_len) if window else max_len, self.args.n_kv_heads, self.args.head_dim)
            cache.append((torch.zeros(shape, dtype=dtype, device=weight.device), torch.zeros(shape, dtype=dtype, device=weight.device)))
        return cache

    def prefill(self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] of fresh sequences; slot_ids: [B] int64 -> logits: [B, T, vocab]
        return self.prefill_batch(tokens, kv_cache, slot_ids, all_logits=True)

    def prefill_batch(self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor, lengths: torch.Tensor | None = None,
                      start_positions: torch.Tensor | None = None, all_logits: bool = False) -> torch.Tensor:
        # tokens: [B, T] right-padded (row b's real tokens: tokens[b, :lengths[b]]); slot_ids, lengths,
        # start_positions: [B] int64 -> logits [B, vocab] at each row's last real token, or [B, T, vocab]
        batch, seq_len = tokens.shape
        device = tokens.device
        lengths = torch.full((batch,), seq_len, device=device) if lengths is None else lengths.to(device)
        compiling = torch.compiler.is_compiling()
        if start_positions is None:  # every row fresh
            starts, continuing = torch.zeros(batch, dtype=torch.int64, device=device), False
        else:
            # Compiled, a row's start is never read on the host (one graph serves every batch that continues):
            # a fresh row takes the continuing path too, where it sees no cache entry.
            starts = start_positions.to(device)
            continuing = compiling or bool((starts > 0).any())
        if not compiling:  # the compiled caller (serve's runner) checked the rows on the host
            self._check_prefill(seq_len, lengths, starts, kv_cache)
        steps: dict[tuple, PrefillStep] = {}
        h = self.embed(tokens)
        for block, cache in zip(self.layers, kv_cache):
            key = (cache[0].shape[1], block.attention.window, block.rope_kind)
            if key not in steps:
                steps[key] = self._prefill_step(cache, slot_ids, lengths, starts, seq_len, continuing, *key)
            steps[key].cache = cache
            h = block.prefill(h, steps[key])
        if not all_logits:
            h = h[torch.arange(batch, device=device), lengths - 1][:, None]  # [B, 1, dim]: each row's last real token
        logits = self.logits(self.norm(h)).float()
        return logits if all_logits else logits[:, 0]

    def _check_prefill(self, seq_len: int, lengths: torch.Tensor, starts: torch.Tensor, kv_cache: KVCache) -> None:
        if int(lengths.min()) < 1 or int(lengths.max()) > seq_len or int(starts.min()) < 0:
            raise AssayError(f"prefill lengths must be 1..{seq_len} and start positions >= 0")
        end = int((starts + lengths).max())
        # A full-attention layer's row is the slot (so is a window ring shorter than its window); a ring of a
        # whole window never overflows, the rotary table bounds it.
        window_of = [block.attention.window for block in self.layers]
        slot_len = min((k.shape[1] for (k, _), window in zip(kv_cache, window_of) if not window or k.shape[1] < window),
                       default=self.rope_cos.shape[1])
        if end > slot_len:
            raise AssayError(f"a prompt of {end} tokens exceeds the KV cache length {slot_len}")

    def _prefill_step(self, cache, slot_ids, lengths, starts, seq_len, continuing, ring, window, rope_kind) -> PrefillStep:
        device = lengths.device
        sources, written = ring_entries(starts, lengths, ring)
        if not continuing:
            cos, sin = self.rope_cos[rope_kind, :seq_len], self.rope_sin[rope_kind, :seq_len]
            return PrefillStep(cos, sin, cache, slot_ids, sources, written, None)
        chunk = torch.arange(seq_len, device=device)
        positions = starts[:, None] + chunk[None, :]  # [B, T]; pads past the table read its last row
        table = positions.clamp_max(self.rope_cos.shape[1] - 1)
        cos, sin = self.rope_cos[rope_kind][table], self.rope_sin[rope_kind][table]
        held = cached_positions(starts - 1, ring)  # [B, L]: positions before the chunk (< 0: none)
        distance = positions[:, :, None] - held[:, None, :]  # [B, T, L]
        sees_cache = held[:, None, :] >= 0
        sees_chunk = (chunk[None, :] <= chunk[:, None])[None].expand(starts.shape[0], -1, -1)  # [B, T, T]
        if window is not None:
            sees_cache = sees_cache & (distance < window)
            sees_chunk = sees_chunk & ((chunk[:, None] - chunk[None, :]) < window)
        mask = torch.cat([sees_cache.expand(-1, seq_len, -1), sees_chunk], dim=-1)[:, None]  # [B, 1, T, L + T]
        return PrefillStep(cos, sin, cache, slot_ids, sources, written, mask)

    def decode_step(self, tokens: torch.Tensor, kv_cache: KVCache, slot_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # tokens: [W, 1]; slot_ids, positions: [W] int64 -> logits: [W, 1, vocab]
        # Row w's new k/v go to position positions[w] of cache row slot_ids[w]; it attends to what that row holds
        # up to it (the last `window` positions in a sliding layer).
        cos, sin = self.rope_cos[:, positions][:, :, None, :], self.rope_sin[:, positions][:, :, None, :]  # [kinds, W, 1, D]
        steps: dict[tuple, DecodeStep] = {}
        h = self.embed(tokens)
        for block, cache in zip(self.layers, kv_cache):
            ring, window = cache[0].shape[1], block.attention.window
            key = (ring, window, block.rope_kind)
            if key not in steps:
                held = cached_positions(positions, ring)  # [W, L] once this token is written
                visible = held >= 0
                if window is not None:
                    visible = visible & (positions[:, None] - held < window)
                index = torch.remainder(positions, ring)
                visible = visible[:, None, None, :]
                # Grouping is host-side planning on the positions' values: eager only (a compiled step has one
                # static shape per width and reads the whole pool).
                groups = None if torch.compiler.is_compiling() else row_groups(positions, slot_ids, visible, ring)
                steps[key] = DecodeStep(cos[block.rope_kind], sin[block.rope_kind], cache, slot_ids, index, visible, groups)
            steps[key].cache = cache
            h = block.decode(h, steps[key])
        return self.logits(self.norm(h))
