"""The compatibility matrix: probe a checkpoint on a stack, sweep many, record the rows, compare stacks.

Imports run one way: commands -> run -> probe -> eval -> results (the contracts in pyproject.toml).
- probe/: one probe in this process (request.py, plan.py, execute.py, recipe.py, reference.py, ...)
- eval/: the lm-eval tasks a probe scores with `--eval` and their verdict
- run/: a probe in its own process, sweeps (local or Ray), placement on devices, triage
- results/: the dataset's schema, its Parquet files, diffs between stacks, error signatures

The names most callers need, imported on first use (this package stays light for `assay --help`).
"""

from __future__ import annotations

import importlib

_FACE = {
    "ProbeRequest": "assay.compat.probe.request",
    "SweepRequest": "assay.compat.probe.request",
    "probe_and_record": "assay.compat.run.single",
    "run_sweep": "assay.compat.run.sweep",
    "query": "assay.compat.results.dataset",
    "diff_stacks": "assay.compat.results.diff",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name not in _FACE:
        raise AttributeError(f"module 'assay.compat' has no attribute {name!r}")
    return getattr(importlib.import_module(_FACE[name]), name)
