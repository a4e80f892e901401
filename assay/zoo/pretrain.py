"""A short pre-training run on the embedded corpus for the zoo's "pretrained" entries.

A few hundred AdamW steps bring a tiny Qwen3 far below the random-init loss ln(vocab), which is what
the training pilot's initialisation check needs to tell loaded weights from random ones.
"""

from __future__ import annotations

import torch


def corpus_token_ids(tokenizer_json: str | None = None) -> torch.Tensor:
    from tokenizers import Tokenizer

    from assay.zoo.corpus import corpus_text
    from assay.zoo.tokenizer import build_tokenizer_json

    tokenizer = Tokenizer.from_str(tokenizer_json or build_tokenizer_json())
    return torch.tensor(tokenizer.encode(corpus_text()).ids, dtype=torch.long)


def transformers_loss(model, window: torch.Tensor) -> torch.Tensor:
    """A Transformers causal LM's own loss (it shifts the labels itself). window: [B, T + 1]."""
    return model(input_ids=window[:, :-1], labels=window[:, :-1]).loss


def next_token_loss(model, window: torch.Tensor) -> torch.Tensor:
    """For a model whose forward maps tokens [B, T] to logits [B, T, vocab] (assay's native models)."""
    logits = model(window[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten())


def pretrain_on_corpus(
    model, steps: int, seed: int, batch: int = 8, seq_len: int = 128, lr: float = 3e-3, loss_fn=transformers_loss
) -> list[float]:
    """AdamW with one-cycle schedule on random corpus windows; loss_fn(model, window [B, seq_len + 1]) -> loss."""
    tokens = corpus_token_ids()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=generator)
        window = torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()])
        loss = loss_fn(model, window)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses
