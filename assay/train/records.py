"""Per-step training records (the metrics JSONL) and the one way they are summed into phases.

A phase's throughput is its tokens over its time (not the mean of per-step rates, which a single
fast step would skew); its MFU is that throughput over the same FLOP/peak ratio every step used.
"""

from __future__ import annotations


def warmup_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("warmup")]


def steady_records(records: list[dict]) -> list[dict]:
    return [r for r in records if not r.get("warmup") and r.get("step_s")]


def phase_tokens_per_s(records: list[dict]) -> float | None:
    seconds = sum(r["step_s"] for r in records if r.get("step_s"))
    return sum(r["tokens"] for r in records if r.get("step_s")) / seconds if seconds else None


def phase_mfu(records: list[dict]) -> float | None:
    """Phase throughput x (mfu / tokens_per_s) of its steps: the FLOPs-per-token / peak ratio is the same for each."""
    speed = phase_tokens_per_s(records)
    timed = [r for r in records if r.get("mfu") is not None and r.get("tokens_per_s")]
    if speed is None or not timed:
        return None
    return speed * timed[0]["mfu"] / timed[0]["tokens_per_s"]
