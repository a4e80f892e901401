"""Zoo checkpoints for architectures Transformers does not know, written by assay's native models.

The folder looks like any Hugging Face checkpoint (config.json, model.safetensors,
generation_config.json; build.py adds the tokenizer and the stamp), in the layout of the
architecture's reference implementation, so the reference code (fla for GLA) would load it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from assay.core.tokens import TOKEN_IDS


def write_native_checkpoint(arch: str, args, folder: Path, seed: int, init_std: float, pretrain_steps: int = 0) -> None:
    """The registered architecture `arch` at `args` (the entry's builder passes them: this module never
    imports entries), initialised normal(0, init_std), optionally pretrained on the corpus, exported by its
    registry entry."""
    from transformers import GenerationConfig

    from assay.models import registry
    from assay.zoo.pretrain import next_token_loss, pretrain_on_corpus

    spec = registry.get(arch)
    model = spec.model_cls.build(args, "cpu", torch.float32, seed=seed, std=init_std)
    if pretrain_steps:
        # One thread: the chunked recurrence is hundreds of tiny ops per step, and on a shared 2-core
        # machine a second thread made each op wait on a descheduled peer (0.05 s a step became 0.5 s).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            pretrain_on_corpus(model, steps=pretrain_steps, seed=seed, lr=1e-2, loss_fn=next_token_loss)
        finally:
            torch.set_num_threads(threads)
    spec.export_hf(model, args, folder, None, extra_config=TOKEN_IDS)
    GenerationConfig(**TOKEN_IDS, do_sample=False).save_pretrained(folder)
