"""torch.profiler's per-op table of one steady training step per path, and the step's self CPU time by
kind of work (matmul, SDPA, compiled graphs, optimizer, other). Called by bench/train/throughput.py --profile."""

from __future__ import annotations

from assay.train.trainer import Trainer
from bench.train.fixtures import request
from pathlib import Path



# Where a step's CPU time goes, by kind of work: the matmuls and SDPA run the same aten kernels on every
# path, so their sum bounds how much faster than hf eager any path can get without faster kernels.
PROFILE_KINDS = (("matmul", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")), ("sdpa", ("aten::_scaled_dot_product",)),
                 ("compiled_graphs", ("## Call CompiledFxGraph",)), ("optimizer", ("aten::_fused_adamw", "aten::_foreach")))


def profile_breakdown(averages) -> dict:
    """Self CPU seconds per kind of work (PROFILE_KINDS, the rest as `other`) of one profiled step."""
    kinds = {name: 0.0 for name, _ in PROFILE_KINDS} | {"other": 0.0}
    for event in averages:
        kind = next((name for name, prefixes in PROFILE_KINDS if event.key.startswith(prefixes)), "other")
        kinds[kind] += event.self_cpu_time_total / 1e6
    return kinds


def profile_paths(checkpoint: Path, peak: float, out: Path, paths=("hf", "native")) -> dict:
    from torch.profiler import ProfilerActivity, profile

    tables, totals, breakdown = [], {}, {}
    for path in paths:
        trainer = Trainer(request(checkpoint, path, 4, 1, peak))
        try:
            for step in range(3):  # compiled paths compile here, outside the profiled step
                trainer.step(step)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                trainer.step(3)
        finally:
            trainer.close()
        averages = prof.key_averages()
        totals[path] = {e.key: e.self_cpu_time_total / 1e3 for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:15]}
        breakdown[path] = profile_breakdown(averages)
        by_shape = prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=40, max_shapes_column_width=60)
        tables.append(f"===== {path}: one steady step at {checkpoint.name}\n{averages.table(sort_by='self_cpu_time_total', row_limit=25)}\n{by_shape}")
    out.write_text("\n".join(tables))
    return {"table": out.name, "top_self_cpu_ms": totals, "self_cpu_s_by_kind": breakdown}

