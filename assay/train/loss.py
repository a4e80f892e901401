"""Next-token cross entropy over the output head, in chunks of tokens, without the full logits.

A Qwen3 vocabulary holds 151,936 tokens: the float32 logits of a 4 x 512 batch are 1.2 GB, and autograd
keeps them (and their gradient) alive through the backward pass. `chunked_linear_cross_entropy` takes
the final hidden states and the head's weight instead and, one chunk of tokens at a time, computes the
logits in float32, the loss, and at once their gradients with respect to the hidden states and the
weight (softmax minus one-hot: Liger's fused linear cross entropy, torchtitan's chunked loss). Only one
chunk's logits exist at any time; the backward pass just scales the stored gradients. The FLOPs are
those of the unchunked head (no recomputation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from assay.train.data import IGNORE_INDEX

# Chunk when the step's float32 logits (tokens x vocab x 4 bytes) would exceed this: below it the
# full-logits loss is as fast and a few MB do not matter (the zoo's 1,024-token vocabulary stays unchunked).
AUTO_CHUNK_LOGITS_BYTES = 256 * 2**20
# Automatic chunks hold about this many bytes of float32 logits (a multiple of 64 tokens, at least 64):
# 64 tokens at Qwen3's 151,936 tokens, still a matmul wide enough to run near the machine's rate.
CHUNK_LOGITS_BYTES = 64 * 2**20


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over every scored position, in float32. logits: [B, T, V]; labels: [B, T].

    Positions labelled IGNORE_INDEX are left out (text batches have none, so their loss is unchanged).
    """
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def chunk_tokens_for(setting: int | None, tokens: int, vocab_size: int) -> int:
    """Tokens per loss chunk for a step of `tokens`: 0 means the full-logits loss.

    setting None: automatic (chunks of about CHUNK_LOGITS_BYTES once the logits pass AUTO_CHUNK_LOGITS_BYTES);
    0: never chunk; N > 0: chunks of N tokens.
    """
    if setting is None:
        if tokens * vocab_size * 4 <= AUTO_CHUNK_LOGITS_BYTES:
            return 0
        return max(64, CHUNK_LOGITS_BYTES // (vocab_size * 4) // 64 * 64)
    return setting


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
        # hidden: [N, D]; weight: [V, D]; labels: [N] -> mean loss over the labels that are not IGNORE_INDEX
        scored = labels != IGNORE_INDEX
        count = scored.sum().clamp(min=1).to(torch.float32)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h, target, keep = hidden[rows], labels[rows], scored[rows]
            logits = F.linear(h, weight).float()  # [n, V]: the only logits alive
            log_z = torch.logsumexp(logits, dim=-1)
            safe_target = torch.where(keep, target, 0)
            target_logit = logits.gather(1, safe_target[:, None]).squeeze(1)
            loss_sum += torch.where(keep, log_z - target_logit, 0.0).sum()
            # d(loss_sum)/d(logits) = softmax - one_hot, zero on ignored rows; reuse the logits' memory.
            grad_logits = logits.sub_(log_z[:, None]).exp_()
            grad_logits[torch.arange(h.shape[0], device=h.device), safe_target] -= 1.0
            grad_logits.mul_((keep.to(torch.float32) / count)[:, None])
            grad_logits = grad_logits.to(hidden.dtype)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight.addmm_(grad_logits.t().to(torch.float32), h.to(torch.float32))
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss_sum / count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss.to(grad_weight.dtype), None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """next_token_loss(hidden @ weight.T, labels) without the full logits. hidden: [B, T, D]; weight:
    [V, D] (the output head, bias-free); labels: [B, T]. Equal to the full loss to float32 rounding."""
    if chunk_tokens <= 0:
        raise ValueError("chunk_tokens must be positive")
    return _ChunkedLinearCrossEntropy.apply(hidden.flatten(0, 1), weight, labels.flatten().to(hidden.device), chunk_tokens)
