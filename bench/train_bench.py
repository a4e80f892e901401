"""Training throughput and MFU of the `native` model path vs the `hf` path, same checkpoint, on CPU.

    python bench/train_bench.py            -> bench/results/train.json and a table

One Qwen3 checkpoint of a small but not trivial size (8 layers, hidden 512, the zoo's 1024-token
vocabulary), batch 4 x 512 tokens, float32, AdamW, the embedded corpus: the Transformers baseline of
measured-here.md. Both paths run through the same trainer (assay.train.Trainer), so loss, optimizer,
data and timing are identical; only the model code differs.

The machine is shared, so the two trainers are interleaved step by step (hf, native, then native,
hf, ...): neighbouring steps see the same load, and each pair gives a ratio. The first
`--timing-warmup` steps of each trainer are excluded. Throughput per path is its steady tokens over
its steady time; MFU is against the fp32 matmul peak measured here once, before the steps
(core.metrics.measure_peak_flops). The headline ratio is the median of the per-pair ratios (robust to
a burst of load on one step); the ratio of the pooled throughputs is recorded beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from assay.core.files import atomic_write_json
from assay.core.metrics import measure_peak_flops
from assay.core.numerics import compare
from assay.core.output import print_table
from assay.train import OptimConfig, TrainRequest
from assay.train.records import phase_mfu, phase_tokens_per_s, steady_records
from assay.train.trainer import Trainer
from assay.zoo.tokenizer import TOKEN_IDS

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = dict(
    hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
    max_position_embeddings=2048, tie_word_embeddings=False, **TOKEN_IDS,
)
BATCH, SEQ_LEN = 4, 512
# native at least as fast as hf
TARGET_RATIO = 1.0


def write_checkpoint(folder: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from assay.zoo.tokenizer import VOCAB_SIZE, write_tokenizer

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB_SIZE, **CONFIG)).save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="steps per path (warm-up included)")
    parser.add_argument("--timing-warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "train.json")
    options = parser.parse_args()

    load_before = os.getloadavg()
    peak = measure_peak_flops("cpu", torch.float32)
    paths = ("hf", "native")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = write_checkpoint(Path(scratch) / "qwen3-8x512")
        trainers = {
            path: Trainer(TrainRequest(
                model=str(checkpoint), path=path, steps=options.steps, batch=BATCH, seq_len=SEQ_LEN,
                optim=OptimConfig(lr=3e-4, warmup_steps=1), peak_flops=str(peak), timing_warmup_steps=options.timing_warmup,
            ))
            for path in paths
        }
        for step in range(options.steps):
            for path in (paths if step % 2 == 0 else paths[::-1]):
                trainers[path].step(step)
        summaries = {path: trainer.summary() for path, trainer in trainers.items()}
        records = {path: trainer.records for path, trainer in trainers.items()}
        for trainer in trainers.values():
            trainer.close()
    load_after = os.getloadavg()

    steady = {path: steady_records(records[path]) for path in paths}
    pair_ratios = [n["tokens_per_s"] / h["tokens_per_s"] for n, h in zip(steady["native"], steady["hf"])]
    per_path = {
        path: {
            "steady_tokens_per_s": phase_tokens_per_s(steady[path]),
            "steady_mfu": phase_mfu(steady[path]),
            "best_step_tokens_per_s": max(r["tokens_per_s"] for r in steady[path]),
            "median_step_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady[path]),
            "warmup_tokens_per_s": summaries[path]["warmup_tokens_per_s"],
            "steady_steps": len(steady[path]),
            "step_s": [r["step_s"] for r in records[path]],
            "losses": [r["loss"] for r in records[path]],
            "params_total": summaries[path]["params_total"],
            "active_matmul_params": summaries[path]["active_matmul_params"],
            "flops_per_token": summaries[path]["flops_per_token"],
            "peak_memory_bytes": summaries[path]["peak_memory_bytes"],
        }
        for path in paths
    }
    ratio = statistics.median(pair_ratios)
    report = {
        "benchmark": "train: native vs hf model path, same checkpoint, same trainer, steps interleaved",
        "config": {**CONFIG, "vocab_size": 1024, "batch": BATCH, "seq_len": SEQ_LEN, "dtype": "float32", "optimizer": "AdamW",
                   "steps_per_path": options.steps, "timing_warmup_steps": options.timing_warmup},
        "device": "cpu", "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "peak_flops_fp32_measured": peak,
        "native": per_path["native"], "hf": per_path["hf"],
        "native_over_hf_tokens_per_s": ratio,
        "native_over_hf_pair_ratios": pair_ratios,
        "native_over_hf_pooled": per_path["native"]["steady_tokens_per_s"] / per_path["hf"]["steady_tokens_per_s"],
        "losses_native_vs_hf": asdict(compare("train_loss", torch.tensor(per_path["native"]["losses"]), torch.tensor(per_path["hf"]["losses"]), torch.float32)),
        "target": f"native >= {TARGET_RATIO} x hf (median pair ratio)", "target_met": ratio >= TARGET_RATIO,
        "wall_s": time.perf_counter() - started,
        "load_average_before_after": [load_before, load_after],
        "note": "2-core CPU shared with other engineers' processes during the run (see load averages): absolute "
                "tokens/s, MFU and the measured peak move with their load; the ratio comes from interleaved steps.",
    }
    atomic_write_json(options.out, report)
    print_table(
        [{"path": p, **{k: v for k, v in per_path[p].items() if k in ("steady_tokens_per_s", "steady_mfu", "median_step_tokens_per_s", "steady_steps")}}
         for p in paths],
        ["path", "steady_tokens_per_s", "steady_mfu", "median_step_tokens_per_s", "steady_steps"],
        title=f"native / hf = {ratio:.3f} median of {len(pair_ratios)} step pairs (peak {peak / 1e9:.0f} GFLOP/s measured; {options.out})",
    )


if __name__ == "__main__":
    main()
