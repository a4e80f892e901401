"""The folder's stack files read into a light index: no run.py, no token lists, errors kept only as
their signature; read again when a file changes. Searching and filtering run over it in memory."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from assay.app.results.status import parsed_versions, result_label
from assay.compat.results.dataset import check_results, connect, stack_files
from assay.compat.results.diff import eval_label
from assay.compat.results.schema import FAILURES
from assay.compat.results.signature import error_signature

_INDEX_SQL = """
SELECT model, stands_in_for, task, architecture, status, reason, device, device_name, backend, dtype, num_devices,
       parallelism, stack_id, stack_label, versions, load_s, compile_s, decode_tokens_per_s, total_s,
       peak_memory_bytes, memory_kind, logit_max_rel_max, logit_cosine_min, compile_reasons, repro_verified,
       eval_status, eval_agreement_min,
       CASE WHEN status IN ({failures}) THEN coalesce(error, reason, status) END AS failure_text
FROM results
"""



@dataclass(frozen=True)
class Snapshot:
    """The index of one folder's results at one moment: one row per (stack, model, dtype)."""

    folder: Path
    rows: pd.DataFrame
    stacks: tuple[str, ...]
    stamp: tuple = field(default=(), compare=False)


def _stamp(folder: Path) -> tuple:
    # A results folder's own files or a published folder's (its card names them): the same reader for both.
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in stack_files(folder))


def load_snapshot(folder: str | Path) -> Snapshot:
    folder = check_results(folder)
    stamp = _stamp(folder)
    sql = _INDEX_SQL.format(failures=", ".join(f"'{s}'" for s in FAILURES))
    rows = connect(folder).execute(sql).fetch_df()
    if rows.empty:
        rows = pd.DataFrame(columns=[*rows.columns])
    rows = rows.astype({"stands_in_for": object, "task": object, "reason": object, "failure_text": object})
    parsed = [parsed_versions(v) for v in rows["versions"]]
    rows["compiler"] = [p[0] for p in parsed]
    rows["transformers"] = [p[1] for p in parsed]
    rows["public"] = rows["stands_in_for"].where(rows["stands_in_for"].notna() & (rows["stands_in_for"] != ""), rows["model"])
    rows["result"] = [result_label(s) for s in rows["status"]]
    rows["eval"] = [eval_label({"eval_status": s, "eval_agreement_min": a}) or "" for s, a in zip(rows["eval_status"], rows["eval_agreement_min"])]
    rows["signature"] = [error_signature(t) if isinstance(t, str) else "" for t in rows["failure_text"]]
    rows["search"] = (rows["model"].str.lower() + "\n" + rows["public"].str.lower()) if len(rows) else pd.Series(dtype=object)
    rows = rows.drop(columns=["versions", "failure_text"]).sort_values(["public", "model", "stack_id", "dtype"], kind="stable")
    return Snapshot(folder, rows.reset_index(drop=True), tuple(sorted(rows["stack_id"].unique())), stamp)


class ResultsSource:
    """The folder's current snapshot, read again only when a stack file changed (cheap stat per call)."""

    def __init__(self, folder: str | Path):
        self.folder = check_results(folder)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._snapshot is None or self._snapshot.stamp != _stamp(self.folder):
                self._snapshot = load_snapshot(self.folder)
            return self._snapshot
