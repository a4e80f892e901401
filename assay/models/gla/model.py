"""The native GLA causal LM, top to bottom: GatedLinearAttention, Block, GLA (GLAOperator, ShortConvolution,
RMSNorm, the SwiGLU MLP and the root's embedding, head, tie and initialisation are shared: assay.models.common).

Three ways through the same weights:
  forward(tokens) -> logits                         training: every layer through gla_chunk, no state kept
  prefill(tokens, state=None) -> (logits, state)     a prompt: gla_chunk, its final state kept per layer
  decode_step(tokens, state) -> (logits, state)      one token per sequence: gla_step, the state updated
The state is a list with one float32 [B, H, K, V] tensor per layer (H, K, V per head) and, with short
convolutions, one [B, W - 1, 2 key_dim + value_dim] tensor per layer after those (the last W - 1 projected
q, k, v): it has the same size after any number of tokens, which is what the serving engine pools per sequence.

Layer math, as fla's GatedLinearAttention (mode "chunk", no feature map):
  q = x Wq, k = x Wk: [B, T, H, K];  v = x Wv: [B, T, H, V]
  with use_short_conv: q, k, v = SiLU(causal depthwise conv of conv_size taps) of each, before the split into heads
  g = logsigmoid(gk_up(gk_down(x))) / gate_logit_normalizer: [B, T, H, K], the log forget gate (<= 0)
  o = GLA(q, k, v, g) with scale K**-0.5;  o = RMSNorm_per_head(o) * swish(x Wg);  out = o Wo

Kernel seams (a replacement registry swaps modules by name, never code in this file):
  layers.{i}.attention.gla   GLAOperator   (q, k, v, g, initial_state, output_final_state) -> (o, state), [B, T, H, D]

No torch.distributed here: tensor parallelism and FSDP are applied from outside (parallelize.py).
Every projection infers its local head count from its width, so column-sharded weights work as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from assay.models.common.counting import ParamCounts, count_parameters
from assay.models.common.decoder import NativeDecoder
from assay.models.common.feed_forward import MLP
from assay.models.common.linear_attention import GLAOperator, ShortConvolution
from assay.models.common.norm import RMSNorm
from assay.models.gla.args import GLAArgs

__all__ = ["GLA", "Block", "GLAOperator", "GatedLinearAttention", "ParamCounts", "State", "count_parameters"]

# One float32 [B, H, K, V] tensor per layer, then (short convolutions) one [B, W - 1, 2 K_all + V_all] per layer.
State = list[torch.Tensor]
# The forget gate's logits are clamped here (GatedLinearAttention._project): logsigmoid(40) = -4e-18 stays normal
# after any normaliser up to 1e20.
GATE_LOGIT_MAX = 40.0


class GatedLinearAttention(nn.Module):
    def __init__(self, args: GLAArgs):
        super().__init__()
        self.head_k_dim, self.head_v_dim = args.head_k_dim, args.head_v_dim
        self.gate_logit_normalizer = args.gate_logit_normalizer
        self.clamp_min = args.clamp_min
        self.wq = nn.Linear(args.dim, args.key_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.key_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.value_dim, bias=False)
        # Low-rank forget gate: dim -> rank -> key_dim; the bias sets each channel's resting decay.
        self.gk_down = nn.Linear(args.dim, args.gate_low_rank_dim, bias=False)
        self.gk_up = nn.Linear(args.gate_low_rank_dim, args.key_dim, bias=True)
        self.wg = nn.Linear(args.dim, args.value_dim, bias=False) if args.use_output_gate else None
        self.wo = nn.Linear(args.value_dim, args.dim, bias=False)
        self.out_norm = RMSNorm(args.head_v_dim, args.norm_eps)  # one weight shared by every head
        self.gla = GLAOperator(args.chunk_size)
        if args.use_short_conv:
            self.q_conv = ShortConvolution(args.key_dim, args.conv_size, args.conv_bias)
            self.k_conv = ShortConvolution(args.key_dim, args.conv_size, args.conv_bias)
            self.v_conv = ShortConvolution(args.value_dim, args.conv_size, args.conv_bias)
        else:
            self.q_conv = self.k_conv = self.v_conv = None

    def _convolve(self, q, k, v, conv_state, output_conv_state: bool, ends=None):
        # q, k: [B, T, K_all]; v: [B, T, V_all]; conv_state: [B, W - 1, 2 K_all + V_all] or None; ends: [B] or None
        # -> the convolved q, k, v and the state after them (None unless asked for)
        if self.q_conv is None:
            return q, k, v, None
        states = (None,) * 3 if conv_state is None else conv_state.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
        (q, q_state), (k, k_state), (v, v_state) = (
            conv(x, state, output_conv_state, ends) for conv, x, state in zip((self.q_conv, self.k_conv, self.v_conv), (q, k, v), states)
        )
        return q, k, v, (torch.cat([q_state, k_state, v_state], dim=-1) if output_conv_state else None)

    def _project(self, x: torch.Tensor, conv_state: torch.Tensor | None = None, output_conv_state: bool = False,
                 mask: torch.Tensor | None = None):
        # x: [B, T, dim]; mask: [B, T] bool (True: a real token) or None
        # -> q, k, g [B, T, H, K]; v [B, T, H, V] (H: this rank's heads under TP); the conv state
        batch, seq_len, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        ends = None
        if mask is not None:
            # A pad leaves the state and the convolution window as they were: it enters neither the window
            # (its q, k, v are 0, what a fresh window holds, and a row's window ends at its last real token)
            # nor the recurrence (k = 0 adds nothing, g = 0 decays nothing).
            keep = mask.unsqueeze(-1).to(q.dtype)
            q, k, v = q * keep, k * keep, v * keep
            positions = torch.arange(1, seq_len + 1, device=x.device)
            ends = (mask * positions).amax(dim=1)  # [B]: one past each row's last real token (0: none)
        q, k, v, conv_state = self._convolve(q, k, v, conv_state, output_conv_state, ends)
        if mask is not None and self.q_conv is not None:
            q, k, v = q * keep, k * keep, v * keep
        q = q.view(batch, seq_len, -1, self.head_k_dim)
        k = k.view(batch, seq_len, -1, self.head_k_dim)
        v = v.view(batch, seq_len, -1, self.head_v_dim)
        # logsigmoid(x) = -softplus(-x), written so: aten's log_sigmoid also writes a buffer exp(-|x|), a subnormal
        # number past |x| = 87 (slow on many CPUs). Logits are clamped at GATE_LOGIT_MAX, where softplus(-x) = e^-x
        # would be one too; there g differs from 0 by under e^-40 (exp(g) = 1 either way).
        logits = self.gk_up(self.gk_down(x)).clamp(max=GATE_LOGIT_MAX)
        g = -F.softplus(-logits).view(batch, seq_len, -1, self.head_k_dim) / self.gate_logit_normalizer
        if self.clamp_min is not None:
            g = g.clamp_min(self.clamp_min)
        if mask is not None:
            g = g * mask.view(batch, seq_len, 1, 1).to(g.dtype)
        return q, k, v, g, conv_state

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # o: [B, T, H, V]; x: [B, T, dim] -> [B, T, dim]
        batch, seq_len, _ = x.shape
        o = self.out_norm(o)
        if self.wg is not None:
            o = o * F.silu(self.wg(x)).view(batch, seq_len, -1, self.head_v_dim)
        return self.wo(o.reshape(batch, seq_len, -1))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False,
                conv_state: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        # x: [B, T, dim]; state: [B, H, K, V] or None; conv_state: [B, W - 1, 2 K_all + V_all] or None;
        # mask: [B, T] bool or None (every token real) -> ([B, T, dim], final state or None, final conv state or None)
        q, k, v, g, conv_state = self._project(x, conv_state, output_final_state, mask)
        o, final_state = self.gla(q, k, v, g, initial_state=state, output_final_state=output_final_state)
        return self._output(o, x), final_state, conv_state

    def step(self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor | None = None):
        # x: [B, 1, dim]; state: [B, H, K, V]; conv_state as in forward -> ([B, 1, dim], new state, new conv state)
        # One token through the same projections; the convolution reads its window from conv_state.
        q, k, v, g, conv_state = self._project(x, conv_state, output_conv_state=conv_state is not None)
        o, new_state = self.gla.step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state)
        return self._output(o.unsqueeze(1), x), new_state, conv_state


class Block(nn.Module):
    def __init__(self, args: GLAArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = GatedLinearAttention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args.dim, args.hidden_dim)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False,
                conv_state: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        # x: [B, T, dim]; mask: [B, T] bool or None -> ([B, T, dim], final state [B, H, K, V] or None, final conv state or None)
        attended, final_state, conv_state = self.attention(self.attention_norm(x), state, output_final_state, conv_state, mask)
        h = x + attended
        return h + self.mlp(self.ffn_norm(h)), final_state, conv_state

    def step(self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor | None = None):
        # x: [B, 1, dim]; state: [B, H, K, V] -> ([B, 1, dim], new state, new conv state or None)
        attended, new_state, conv_state = self.attention.step(self.attention_norm(x), state, conv_state)
        h = x + attended
        return h + self.mlp(self.ffn_norm(h)), new_state, conv_state


class GLA(NativeDecoder):
    def __init__(self, args: GLAArgs):
        super().__init__(args, Block)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, T] -> logits: [B, T, vocab]
        h = self.embed(tokens)
        for block in self.layers:
            h, _, _ = block(h)
        return self.logits(self.norm(h))

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Each state tensor's shape without the batch dim: per layer [H, K, V], then per layer [W - 1, 2 K_all + V_all]
        with short convolutions (W the taps, K_all and V_all the widths over all heads)."""
        args = self.args
        shapes = [(args.n_heads, args.head_k_dim, args.head_v_dim)] * args.n_layers
        if args.use_short_conv:
            shapes += [(args.conv_size - 1, args.conv_state_dim)] * args.n_layers
        return shapes

    def init_state(self, batch: int) -> State:
        """Zeros: the state of sequences that have seen no token (what prefill starts from)."""
        device = self.tok_embeddings.weight.device
        return [torch.zeros(batch, *shape, device=device) for shape in self.state_shapes()]

    def _split_state(self, state: State | None) -> tuple[list, list]:
        # -> (per layer [B, H, K, V] or None, per layer conv state or None)
        n_layers = len(self.layers)
        if state is None:
            return [None] * n_layers, [None] * n_layers
        return list(state[:n_layers]), list(state[n_layers:]) or [None] * n_layers

    def prefill(self, tokens: torch.Tensor, state: State | None = None, mask: torch.Tensor | None = None,
                logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, State]:
        # tokens: [B, T]; state: as init_state's, or None (a fresh sequence); mask: [B, T] bool (True: a real
        # token; pads leave each row's state and convolution window as its real tokens left them) or None;
        # logits_at: [B] positions or None -> logits [B, T, vocab] (pad positions: unspecified), or
        # [B, 1, vocab] at logits_at (a serving prefill needs one row of the head's [T, vocab]); state
        h = self.embed(tokens)
        recurrent, conv = self._split_state(state)
        new_recurrent, new_conv = [], []
        for block, layer_state, conv_state in zip(self.layers, recurrent, conv):
            h, layer_state, conv_state = block(h, layer_state, output_final_state=True, conv_state=conv_state, mask=mask)
            new_recurrent.append(layer_state)
            new_conv.append(conv_state)
        if logits_at is not None:
            h = h[torch.arange(h.shape[0], device=h.device), logits_at].unsqueeze(1)  # [B, 1, dim]
        return self.logits(self.norm(h)), new_recurrent + (new_conv if self.args.use_short_conv else [])

    def decode_step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        # tokens: [B, 1]; state: as init_state's -> logits [B, 1, vocab], the state after these tokens
        h = self.embed(tokens)
        recurrent, conv = self._split_state(state)
        new_recurrent, new_conv = [], []
        for block, layer_state, conv_state in zip(self.layers, recurrent, conv):
            h, layer_state, conv_state = block.step(h, layer_state, conv_state)
            new_recurrent.append(layer_state)
            new_conv.append(conv_state)
        return self.logits(self.norm(h)), new_recurrent + (new_conv if self.args.use_short_conv else [])

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation: tokens [B, T] -> [B, T + max_new_tokens]. The state never grows."""
        generated, _ = self.generate_with_state(tokens, max_new_tokens)
        return generated

    @torch.no_grad()
    def generate_with_state(self, tokens: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, State]:
        """`generate`, also returning the state after the last generated token was read."""
        logits, state = self.prefill(tokens)
        pieces = [tokens]
        for _ in range(max_new_tokens):
            next_token = logits[:, -1:].argmax(-1)  # [B, 1]
            pieces.append(next_token)
            logits, state = self.decode_step(next_token, state)
        return torch.cat(pieces, dim=1), state

