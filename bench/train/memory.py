"""Training memory in fresh processes (peak RSS growth over the steps, the allocator's history its own): the
loss at Qwen3's 151,936-token vocabulary with the full logits vs in chunks, and --activation-checkpointing
none/full/selective (their speed interleaved in the calling process). Called by bench/train/throughput.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from assay.train.records import phase_tokens_per_s, steady_records
from assay.train.trainer import Trainer
from bench.train.fixtures import BATCH, SEQ_LEN, WRITTEN_SIZES, interleave, request, spread, write_checkpoint

QWEN3_VOCAB = 151_936

_MEMORY_CHILD = r"""
import json, resource, sys, time, torch
from assay.train import OptimConfig, TrainRequest
from assay.train.trainer import Trainer
torch.set_num_threads(int(sys.argv[4]))
kwargs = json.loads(sys.argv[2])
trainer = Trainer(TrainRequest(model=sys.argv[1], steps=int(sys.argv[3]), optim=OptimConfig(lr=3e-4, warmup_steps=1), **kwargs))
before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
for step in range(int(sys.argv[3])):
    trainer.step(step)
elapsed = time.perf_counter() - started
after_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_rss_growth_bytes": (after_kib - before_kib) * 1024, "peak_rss_bytes": after_kib * 1024,
                  "losses": [r["loss"] for r in trainer.records], "step_s": [r["step_s"] for r in trainer.records],
                  "loss_chunk_tokens": trainer.loss_chunk_tokens, "wall_s": elapsed}))
trainer.close()
"""


def memory_run(checkpoint: Path, steps: int, threads: int, **kwargs) -> dict:
    """Peak RSS growth of `steps` training steps in a fresh process (the allocator's history is its own)."""
    completed = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(checkpoint), json.dumps(kwargs), str(steps), str(threads)],
        capture_output=True, text=True, check=True, env=os.environ | {"TRANSFORMERS_VERBOSITY": "error"},
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def chunked_loss_memory(scratch: Path, threads: int) -> dict:
    """Qwen3's vocabulary on a 2-layer hidden-256 model, batch 2 x 512: the full fp32 logits are 622 MB."""
    checkpoint = write_checkpoint(scratch / "vocab151936", dict(WRITTEN_SIZES["small"], num_hidden_layers=2), vocab_size=QWEN3_VOCAB)
    common = dict(batch=2, seq_len=512, path="native")
    full = memory_run(checkpoint, 2, threads, loss_chunk_tokens=0, **common)
    chunked = memory_run(checkpoint, 2, threads, **common)  # automatic chunking
    return {
        "config": {"vocab_size": QWEN3_VOCAB, "layers": 2, "hidden": 256, "batch": 2, "seq_len": 512, "path": "native"},
        "full_logits_fp32_bytes": 2 * 512 * QWEN3_VOCAB * 4,
        "full": full, "chunked": chunked,
        "peak_growth_saved_bytes": full["peak_rss_growth_bytes"] - chunked["peak_rss_growth_bytes"],
        "first_loss_rel_diff": abs(full["losses"][0] - chunked["losses"][0]) / full["losses"][0],
    }


def activation_checkpointing(checkpoint: Path, steps: int, warmup: int, peak: float, threads: int) -> dict:
    modes = ("none", "full", "selective")
    memory = {mode: memory_run(checkpoint, 2, threads, path="native", batch=BATCH, seq_len=SEQ_LEN, activation_checkpointing=mode)
              for mode in modes}
    trainers = {mode: Trainer(request(checkpoint, "native", steps, warmup, peak, activation_checkpointing=mode)) for mode in modes}
    try:
        interleave(trainers, steps)
        steady = {mode: steady_records(trainer.records) for mode, trainer in trainers.items()}
        losses = {mode: [r["loss"] for r in trainer.records] for mode, trainer in trainers.items()}
    finally:
        for trainer in trainers.values():
            trainer.close()
    return {
        mode: {
            "peak_rss_growth_bytes": memory[mode]["peak_rss_growth_bytes"],
            "steady_tokens_per_s": phase_tokens_per_s(steady[mode]),
            "over_none": spread([m["tokens_per_s"] / n["tokens_per_s"] for m, n in zip(steady[mode], steady["none"])]),
            "first_loss": losses[mode][0],
        }
        for mode in modes
    } | {"size": checkpoint.name}

