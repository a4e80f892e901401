"""Feed-forward layers: the gated MLP (SwiGLU, GeGLU) and the grouped experts of a mixture-of-experts layer (the
kernel seam GroupedExperts, kernel "grouped_experts")."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


# The gate's activation, by Transformers' hidden_act name: SwiGLU (Llama, Qwen3) or GeGLU with the tanh GELU (Gemma).
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class MLP(nn.Module):
    """A gated MLP: w2(act(w1 x) * w3 x), act SiLU (SwiGLU) by default."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False, activation: str = "silu"):
        super().__init__()
        self.activation = activation
        self.act = ACTIVATIONS[activation]
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        return self.w2(self.act(self.w1(x)) * self.w3(x))

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


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
