"""The selftest's GLA part: `assay.ops.gla_chunk` vs `gla_recurrent`, forward, on one device.

    python -m assay.selftest.gla_check --device cuda --lengths 4096,16384   -> JSON on stdout

Per length: the best steady time of each form on the device (float32, no grad), the chunked form's
speed-up, and both forms' relative error against the step-by-step recurrence evaluated in float64
on the CPU (the same reference on every device; MPS has no float64), checked against the
("recurrence", float32) tolerance of core.numerics. Width as bench/gla/kernel.py: B=1, H=4, K=V=64.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from assay.core.device import device_name, resolve_device
from assay.core.errors import AssayError
from assay.core.metrics import StepTimer
from assay.core.numerics import compare
from assay.core.values import comma_list
from assay.ops import gla_chunk, gla_recurrent

BATCH, HEADS, KEY_DIM, VALUE_DIM = 1, 4, 64, 64


def _inputs(time_steps: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator) for _ in range(2))
    v = torch.randn(BATCH, time_steps, HEADS, VALUE_DIM, generator=generator)
    g = F.logsigmoid(torch.randn(BATCH, time_steps, HEADS, KEY_DIM, generator=generator)) / 16  # GLA's slow forget gate
    return q, k, v, g


def _best_time(call, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    """Best of `repeats` steady runs after one warm-up run (allocator, first kernel launches)."""
    timer = StepTimer(device, warmup_steps=1)
    output = None
    for _ in range(1 + repeats):
        timer.start()
        output = call()
        timer.stop()
    return min(timer.steady), output


def run_gla_check(device: str, lengths: tuple[int, ...], repeats: int = 3, seed: int = 0) -> dict:
    target = resolve_device(device)
    rows = []
    for time_steps in lengths:
        host_inputs = _inputs(time_steps, seed)
        q, k, v, g = (x.to(target) for x in host_inputs)
        with torch.no_grad():
            chunk_s, chunk_out = _best_time(lambda: gla_chunk(q, k, v, g)[0], target, repeats)
            # The step loop is T small launches: fewer repeats, it is the slow side of the ratio anyway.
            recurrent_s, recurrent_out = _best_time(lambda: gla_recurrent(q, k, v, g)[0], target, max(1, repeats - 1))
            reference, _ = gla_recurrent(*(x.double() for x in host_inputs))
        chunk_cmp = compare("recurrence", chunk_out, reference, torch.float32)
        recurrent_cmp = compare("recurrence", recurrent_out, reference, torch.float32)
        rows.append({
            "T": time_steps, "chunk_s": chunk_s, "recurrent_s": recurrent_s, "speedup": recurrent_s / chunk_s,
            "chunk_tokens_per_s": BATCH * time_steps / chunk_s, "recurrent_tokens_per_s": BATCH * time_steps / recurrent_s,
            "chunk_rel_error": chunk_cmp.rel, "recurrent_rel_error": recurrent_cmp.rel, "tol": chunk_cmp.tol,
            "ok": chunk_cmp.ok and recurrent_cmp.ok,
        })
    return {
        "device": str(target), "device_name": device_name(target), "dtype": "float32", "mode": "fwd",
        "shape": {"batch": BATCH, "heads": HEADS, "key_dim": KEY_DIM, "value_dim": VALUE_DIM}, "repeats": repeats,
        "reference": "gla_recurrent in float64 on the CPU", "ok": all(row["ok"] for row in rows), "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m assay.selftest.gla_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", default="4096,16384", help="sequence lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of gla_chunk per length (best kept)")
    args = parser.parse_args(argv)
    try:
        result = run_gla_check(args.device, comma_list("--lengths", args.lengths, int), args.repeats)
    except AssayError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
