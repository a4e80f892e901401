"""`assay diff`: per model, how its status changed between two stacks.

Kinds: regressed (PASS -> failure), fixed (failure -> PASS), failure_changed (one failure type to
another), eval_regressed (PASS on both, but the new stack's eval DISAGREEs with the reference or failed
while the base's did not: `--eval`, docs/dataset.md "The eval"), drift_regressed (PASS on both, but the logit drift grew past DRIFT_FACTOR: an accuracy
regression that has not flipped a token yet, docs/triage.md), both_fail, both_pass, only_base /
only_new (tested on one stack only), and skipped when either side is a deliberate SKIPPED (never
counted as a failure).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from assay.compat.results.dataset import query
from assay.compat.results.schema import FAILURES
from assay.core.errors import AssayError

# The order a reader wants: what broke first.
KIND_ORDER = ("regressed", "failure_changed", "eval_regressed", "drift_regressed", "fixed", "both_fail", "only_base", "only_new", "skipped", "both_pass")


@dataclass(frozen=True)
class ModelChange:
    model: str
    dtype: str | None
    kind: str
    base_status: str | None
    new_status: str | None
    base_reason: str | None
    new_reason: str | None
    base_drift: float | None = None  # logit_max_rel_max: the worst relative logit difference over compared steps
    new_drift: float | None = None
    base_eval: str | None = None  # eval_status (AGREE, DISAGREE, FAIL; None: no eval), with the lowest task agreement
    new_eval: str | None = None


@dataclass(frozen=True)
class StackDiff:
    base: str
    new: str
    changes: list[ModelChange]
    base_pass_rate: float | None  # over models tested (not skipped) on both stacks
    new_pass_rate: float | None
    models_on_both: int

    def counts(self) -> dict[str, int]:
        return {kind: sum(c.kind == kind for c in self.changes) for kind in KIND_ORDER}

    def as_dict(self) -> dict:
        return asdict(self) | {"counts": self.counts()}


# A drift regression: the new stack's worst relative logit difference is this many times the base's,
# and above DRIFT_FLOOR. Below the floor both are float32 round-off (a reordered sum moves logits by
# ~1e-7 of their scale), whose ratio says nothing.
DRIFT_FACTOR = 10.0
DRIFT_FLOOR = 1e-5


def drift_regressed(base_drift: float | None, new_drift: float | None) -> bool:
    if new_drift is None or base_drift is None:
        return False
    return new_drift > DRIFT_FLOOR and new_drift > DRIFT_FACTOR * base_drift


BAD_EVALS = ("DISAGREE", "FAIL")


def eval_regressed(base_eval: str | None, new_eval: str | None) -> bool:
    return new_eval in BAD_EVALS and base_eval not in BAD_EVALS


def eval_label(row: dict | None) -> str | None:
    """ "AGREE 1.00": the eval's status and its lowest task agreement; None without an eval."""
    status = row.get("eval_status") if row else None
    if not isinstance(status, str) or not status:  # null, or a table reader's NaN
        return None
    agreement = row.get("eval_agreement_min")
    return status + ("" if not isinstance(agreement, float) or agreement != agreement else f" {agreement:.2f}")


def _kind(base: dict | None, new: dict | None) -> str:
    if base is None:
        return "only_new"
    if new is None:
        return "only_base"
    b, n = base["status"], new["status"]
    if "SKIPPED" in (b, n):
        return "skipped"
    if b == "PASS" and n == "PASS":
        if eval_regressed(base.get("eval_status"), new.get("eval_status")):
            return "eval_regressed"
        return "drift_regressed" if drift_regressed(base.get("logit_max_rel_max"), new.get("logit_max_rel_max")) else "both_pass"
    if b == "PASS":
        return "regressed"
    if n == "PASS":
        return "fixed"
    return "failure_changed" if b != n else "both_fail"


def resolve_stack(folder, name: str, stacks: list[str]) -> str:
    if name in stacks:
        return name
    matches = [s for s in stacks if name in s]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise AssayError(f"no stack matching {name!r} in {folder} (stacks: {', '.join(stacks) or 'none'})")
    raise AssayError(f"{name!r} matches several stacks: {', '.join(matches)}")


def diff_stacks(folder, base: str, new: str) -> StackDiff:
    rows = query(folder, columns=["model", "dtype", "stack_id", "status", "reason", "logit_max_rel_max", "eval_status", "eval_agreement_min"])
    stacks = sorted({r["stack_id"] for r in rows})
    base_id, new_id = resolve_stack(folder, base, stacks), resolve_stack(folder, new, stacks)
    if base_id == new_id:
        raise AssayError(f"--base and --new name the same stack ({base_id})")
    by_stack = {sid: {(r["model"], r["dtype"]): r for r in rows if r["stack_id"] == sid} for sid in (base_id, new_id)}
    keys = sorted(set(by_stack[base_id]) | set(by_stack[new_id]), key=lambda k: (k[0], k[1] or ""))
    changes = []
    for key in keys:
        b, n = by_stack[base_id].get(key), by_stack[new_id].get(key)
        changes.append(
            ModelChange(
                model=key[0], dtype=key[1], kind=_kind(b, n),
                base_status=b and b["status"], new_status=n and n["status"],
                base_reason=b and b["reason"], new_reason=n and n["reason"],
                base_drift=b and b["logit_max_rel_max"], new_drift=n and n["logit_max_rel_max"],
                base_eval=eval_label(b), new_eval=eval_label(n),
            )
        )
    changes.sort(key=lambda c: (KIND_ORDER.index(c.kind), c.model))
    tested_both = [c for c in changes if c.kind not in ("only_base", "only_new", "skipped")]
    rate = lambda side: (sum(getattr(c, f"{side}_status") == "PASS" for c in tested_both) / len(tested_both)) if tested_both else None  # noqa: E731
    return StackDiff(base_id, new_id, changes, rate("base"), rate("new"), len(tested_both))


def is_failure(status: str | None) -> bool:
    return status in FAILURES
