"""Across results: two stacks compared, failures grouped by signature, and the charts' numbers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from assay.app.results.cells import cell_text
from assay.app.results.listing import Filters, row_mask, text_mask
from assay.app.results.model_page import result_key_label
from assay.app.results.snapshot import Snapshot
from assay.app.results.status import ANY, NOT_TESTED, result_label
from assay.compat.results.diff import diff_stacks
from assay.compat.results.schema import FAILURES

DIFF_COLUMNS = ["change", "model", "dtype", "base", "new", "base eval", "new eval", "base reason", "new reason"]
GROUP_COLUMNS = ["count", "signature", "statuses", "models", "stacks", "graph breaks and recompiles"]
PASS_RATE_COLUMNS = ["stack", "passed", "failed", "skipped", "tested", "pass rate"]


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame  # DIFF_COLUMNS, regressions first
    summary: str


def compare_stacks(folder: str | Path, base: str, new: str) -> Comparison:
    result = diff_stacks(folder, base, new)
    shown = lambda status: NOT_TESTED if status is None else result_label(status)  # noqa: E731
    table = pd.DataFrame(
        [[c.kind.replace("_", " "), c.model, cell_text(c.dtype), shown(c.base_status), shown(c.new_status), cell_text(c.base_eval),
          cell_text(c.new_eval), cell_text(c.base_reason), cell_text(c.new_reason)] for c in result.changes],
        columns=DIFF_COLUMNS, dtype=object,
    )
    rate = lambda r: "-" if r is None else f"{100 * r:.0f}%"  # noqa: E731
    counts = ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in result.counts().items() if n)
    summary = (f"{result.base} → {result.new}: pass rate over the {result.models_on_both} models tested on both "
               f"{rate(result.base_pass_rate)} → {rate(result.new_pass_rate)}; {counts or 'no models'}")
    return Comparison(table, summary)


@dataclass(frozen=True)
class FailureGroups:
    table: pd.DataFrame  # GROUP_COLUMNS, largest group first
    models: dict[str, list[str]]  # signature -> every model in the group


def failure_groups(snapshot: Snapshot, filters: Filters, shown_models: int = 12) -> FailureGroups:
    rows = snapshot.rows
    failed = rows[rows["status"].isin(FAILURES) & row_mask(rows, filters) & text_mask(rows["search"], filters.text)]
    records, members = [], {}
    for signature, group in failed.groupby("signature", sort=False):
        models = sorted(set(group["model"]), key=str.lower)
        members[signature] = models
        more = f" … and {len(models) - shown_models} more" if len(models) > shown_models else ""
        records.append([len(group), signature, ", ".join(sorted(set(group["status"]))), ", ".join(models[:shown_models]) + more,
                        ", ".join(sorted(set(group["stack_id"]))), group_reasons(group["compile_reasons"])])
    records.sort(key=lambda r: (-r[0], r[1]))
    table = pd.DataFrame([[str(r[0]), *r[1:]] for r in records], columns=GROUP_COLUMNS, dtype=object)
    return FailureGroups(table, members)


def group_reasons(reasons: pd.Series, shown: int = 4) -> str:
    """The dynamo graph-break and recompile reasons of a failure group's rows, most frequent first: rows
    that failed alike for the same dynamo reason are one problem; the same error with different
    reasons may be several."""
    counts: dict[str, int] = {}
    for row_reasons in reasons:
        listed = row_reasons is not None and not isinstance(row_reasons, (float, type(pd.NA)))  # null: no reasons recorded
        for reason in (row_reasons if listed else []):
            counts[str(reason)] = counts.get(str(reason), 0) + 1
    ranked = sorted(counts, key=lambda r: (-counts[r], r))
    more = f" … and {len(ranked) - shown} more" if len(ranked) > shown else ""
    return "; ".join(f"{r} ({counts[r]})" if counts[r] > 1 else r for r in ranked[:shown]) + more


def pass_rates(snapshot: Snapshot) -> pd.DataFrame:
    """Per stack: PASS over tested rows; skipped rows are counted apart, never as tested or failed."""
    rows = snapshot.rows
    records = []
    for stack_id in snapshot.stacks:
        statuses = rows.loc[rows["stack_id"] == stack_id, "status"]
        passed, skipped = int((statuses == "PASS").sum()), int((statuses == "SKIPPED").sum())
        tested = len(statuses) - skipped
        records.append([stack_id, passed, tested - passed, skipped, tested, passed / tested if tested else None])
    return pd.DataFrame(records, columns=PASS_RATE_COLUMNS)


def per_model_costs(snapshot: Snapshot, stack: str, top: int = 25) -> pd.DataFrame:
    """Compile time and peak memory per model on one stack, the `top` slowest compiles first."""
    rows = snapshot.rows
    chosen = rows[(rows["stack_id"] == stack) & (rows["status"] != "SKIPPED")] if stack and stack != ANY else rows.iloc[0:0]
    chosen = chosen.sort_values(["compile_s", "peak_memory_bytes"], ascending=False, na_position="last").head(top)
    label = chosen["model"] + [f" ({d})" if d and d != "float32" else "" for d in chosen["dtype"].fillna("")]
    return pd.DataFrame({"model": label.to_numpy(), "compile_s": chosen["compile_s"].to_numpy(dtype=float),
                         "peak_mb": (chosen["peak_memory_bytes"].astype(float) / 2**20).to_numpy()})


def per_model_drift(snapshot: Snapshot, stack: str, top: int = 25) -> pd.DataFrame:
    """Per model on one stack, the worst relative logit difference (logit_max_rel_max) and lowest cosine
    similarity against the reference; the `top` largest drifts first. Rows without drift are left out."""
    rows = snapshot.rows
    chosen = rows[(rows["stack_id"] == stack) & rows["logit_max_rel_max"].notna()] if stack and stack != ANY else rows.iloc[0:0]
    chosen = chosen.sort_values("logit_max_rel_max", ascending=False).head(top)
    label = [f"{m} ({d})" if d and d != "float32" else str(m) for m, d in zip(chosen["model"], chosen["dtype"].fillna(""))]
    return pd.DataFrame({"model": label, "max_rel": chosen["logit_max_rel_max"].to_numpy(dtype=float),
                         "cosine_min": chosen["logit_cosine_min"].to_numpy(dtype=float), "status": chosen["status"].to_numpy()})


def model_drift(results: list[dict]) -> dict[str, list[float]]:
    """A model's per-step relative logit difference on each stack it has drift on: label -> one value per step."""
    return {result_key_label(row): [float(v) for v in row["logit_max_rel"]] for row in results
            if row.get("logit_max_rel") is not None and len(row["logit_max_rel"])}
