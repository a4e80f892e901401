"""Per-sequence memory of a model's decoding state, for the serving engine and the README.

A transformer keeps keys and values for every token it has seen: its cache grows with the sequence.
A gated-linear-attention model folds the history into one [K, V] matrix per head and layer: its
state has the same size after 10 tokens as after 100,000. Both functions count bytes for one sequence.

    kv_cache_bytes_per_sequence(24, 24, 128, 8192, torch.bfloat16)   # 2.4 GB: a 3B transformer at 8K tokens
    linear_state_bytes_per_sequence(24, 16, 96, 192, torch.float32)  # 28 MB: the 3B GLA, at any length
"""

from __future__ import annotations

import torch


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_cache_bytes_per_sequence(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Keys and values of every layer for `seq_len` tokens: 2 x layers x kv_heads x head_dim x seq_len x bytes."""
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * _element_size(dtype)


def linear_state_bytes_per_sequence(n_layers: int, n_heads: int, head_k_dim: int, head_v_dim: int, dtype: torch.dtype = torch.float32,
                                    conv_values_per_layer: int = 0) -> int:
    """One [head_k_dim, head_v_dim] matrix per head and layer, plus a short convolution's last inputs per layer
    (conv_values_per_layer: (taps - 1) x channels); no term grows with the sequence."""
    return n_layers * (n_heads * head_k_dim * head_v_dim + conv_values_per_layer) * _element_size(dtype)
