"""What the training benchmarks share: the checkpoints they train (the zoo's, and sizes written here with
a fixed seed), the request every path is built from (the same trainer, loss, optimizer and data), and
interleaving trainers step by step on a shared machine."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from assay.core.tokens import TOKEN_IDS
from assay.train import OptimConfig, TrainRequest
from assay.train.trainer import Trainer

BATCH, SEQ_LEN = 4, 512
DENSE = dict(max_position_embeddings=2048, tie_word_embeddings=False, **TOKEN_IDS)
WRITTEN_SIZES = {  # sizes the zoo does not have, written here with a fixed seed
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "8x512": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    # 8x512's block, 2 layers: a quick look at a compile option before paying for 8x512
    "2x512": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}
SIZES = ("tiny", "small", "8x512", "moe")
ZOO_SIZES = {"tiny": "qwen3", "moe": "qwen3-moe"}
PATHS = ("hf", "native", "native+kernels", "native+compile")
# Run only when named in --paths: --compile with mode max-autotune-no-cudagraphs (GEMM choices benchmarked at
# compile); --compile with two of the --levers variants patched into the blocks (blocked attention, fused gate/up:
# an experiment of this bench, not a trainer option).
EXTRA_PATHS = ("native+compile-autotune", "native+compile-levers")
COMPILE_MODE = {"native+compile-autotune": "max-autotune-no-cudagraphs"}
KERNELS = {"dense": ("rope", "attention"), "moe": ("rope", "grouped_experts", "attention")}


def write_checkpoint(folder: Path, config: dict, vocab_size: int | None = None) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from assay.zoo.tokenizer import VOCAB_SIZE, write_tokenizer

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab_size or VOCAB_SIZE, **DENSE, **config)).save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def checkpoints(scratch: Path, sizes) -> dict[str, Path]:
    from assay.zoo import build_zoo

    zoo_names = [ZOO_SIZES[size] for size in sizes if size in ZOO_SIZES]
    if zoo_names:
        build_zoo(scratch / "zoo", zoo_names, progress=False)
    return {
        size: scratch / "zoo" / ZOO_SIZES[size] if size in ZOO_SIZES else write_checkpoint(scratch / size, WRITTEN_SIZES[size])
        for size in sizes
    }


def request(checkpoint: Path, path: str, steps: int, warmup: int, peak: float, **extra) -> TrainRequest:
    model_path = "hf" if path == "hf" else "native"
    kernels = KERNELS["moe" if "moe" in checkpoint.name else "dense"] if path == "native+kernels" else None
    return TrainRequest(
        model=str(checkpoint), path=model_path, kernels=kernels, compile=path.startswith("native+compile"), backend="inductor",
        compile_mode=COMPILE_MODE.get(path, "default"),
        steps=steps, batch=BATCH, seq_len=SEQ_LEN, optim=OptimConfig(lr=3e-4, warmup_steps=1), peak_flops=str(peak),
        timing_warmup_steps=warmup, **extra,
    )


def interleave(trainers: dict[str, Trainer], steps: int) -> None:
    names = list(trainers)
    for step in range(steps):
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order: no path always runs first
            trainers[name].step(step)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}

