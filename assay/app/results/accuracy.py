"""A result's accuracy tables, side by side on its model page: the logit drift per compared step, and
with `--eval` the task accuracy on the device next to the CPU eager reference's (docs/app.md)."""

from __future__ import annotations

import pandas as pd

from assay.app.results.cells import cell_count, cell_number, cell_text

DRIFT_COLUMNS = ["step", "max |Δ logit|", "max rel", "cosine"]
EVAL_COLUMNS = ["task", "items", "device acc", "reference acc", "difference", "agreement", "max |Δ loglik|", "device s", "reference s"]


def _listed(row: dict, column: str, count: int) -> list:
    values = row.get(column)
    return list(values) if values is not None and len(values) == count else [None] * count


def drift_table(row: dict) -> pd.DataFrame:
    """One line per compared step (schema 4's logit_* columns); empty when the row compared no logits."""
    steps = len(row.get("logit_max_rel") or [])
    columns = [_listed(row, name, steps) for name in ("logit_max_abs", "logit_max_rel", "logit_cosine")]
    lines = [[str(step), cell_number(abs_), cell_number(rel), "" if cos is None else f"{cos:.9f}"]
             for step, (abs_, rel, cos) in enumerate(zip(*columns))]
    return pd.DataFrame(lines, columns=DRIFT_COLUMNS, dtype=object)


def eval_table(row: dict) -> pd.DataFrame:
    """One line per eval task (schema 5's eval_* columns); empty without --eval."""
    tasks = list(row.get("eval_tasks") or [])
    count = len(tasks)
    values = {name: _listed(row, name, count) for name in (
        "eval_items", "eval_accuracy", "eval_reference_accuracy", "eval_accuracy_diff", "eval_agreement", "eval_loglik_max_diff",
        "eval_seconds", "eval_reference_seconds")}
    signed = lambda value: "" if value is None else f"{value:+.2f}"  # noqa: E731
    share = lambda value: "" if value is None else f"{value:.2f}"  # noqa: E731
    lines = [[cell_text(task), cell_count(values["eval_items"][i]), share(values["eval_accuracy"][i]),
              share(values["eval_reference_accuracy"][i]), signed(values["eval_accuracy_diff"][i]), share(values["eval_agreement"][i]),
              cell_number(values["eval_loglik_max_diff"][i]), cell_number(values["eval_seconds"][i]),
              cell_number(values["eval_reference_seconds"][i])] for i, task in enumerate(tasks)]
    return pd.DataFrame(lines, columns=EVAL_COLUMNS, dtype=object)


def eval_note(row: dict) -> str:
    """The eval's verdict in one line: status and reason, the items that changed answer, the compile counts."""
    if not row.get("eval_tasks"):
        return "no eval recorded (assay probe ... --eval TASKS)"
    parts = [f"{row.get('eval_status') or 'no verdict'}: {cell_text(row.get('eval_reason'))}"]
    changed = list(row.get("eval_disagreements") or [])
    if changed:
        parts.append(f"answers changed on {len(changed)} item{'s' if len(changed) != 1 else ''}: {', '.join(changed[:12])}"
                     + (" …" if len(changed) > 12 else ""))
    if row.get("eval_graphs") is not None:
        parts.append(f"eval graphs {row['eval_graphs']}, recompiles {row.get('eval_recompiles')}")
    if row.get("eval_reference_cache_hit") is not None:
        parts.append("reference from the cache" if row["eval_reference_cache_hit"] else "reference run")
    return "; ".join(parts)
