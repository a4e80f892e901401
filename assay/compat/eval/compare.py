"""The eval's verdict: the device's answers against the CPU eager reference's, item by item.

Per task: accuracy on each side and their difference; agreement, the share of items where both chose
the same answer (multiple choice: the most likely choice; a cloze: whether the target is the greedy
continuation); the largest |log-likelihood difference| over every item and choice.

The threshold (docs/dataset.md, "The eval"): a task DISAGREEs when
- agreement < AGREEMENT_MIN (0.95): more than 1 item in 20 changed its answer. Numerical noise alone
  flips only items whose two best answers are nearly tied. Measured on the 200 embedded items: SmolLM2
  under inductor in float32 flipped none (largest |Δ log-likelihood| 7e-5 nats), in bfloat16 one
  (agreement 0.99 and 1.00, though its greedy tokens diverged at step 19); on the tiny zoo model an
  activation off by 1% flipped none, the LM head's matmul at twice its value 13 of 100; or
- |accuracy difference| > 2 * sqrt(d) / n, with d the items whose answer changed and n the items: a sign
  test at two standard deviations. Flips caused by noise are as likely to fix an answer as to break
  one; d flips that all go one way (5 of 5, say: probability 1 in 16) say the device is worse, not noisier.
Tasks that agree on both counts make the row AGREE; any task that does not makes it DISAGREE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AGREEMENT_MIN = 0.95
SIGN_TEST_SIGMAS = 2.0


@dataclass(frozen=True)
class TaskComparison:
    task: str
    items: int
    accuracy: float
    reference_accuracy: float
    agreement: float
    loglik_max_diff: float
    disagreements: list[int]  # the documents whose answer changed
    seconds: float
    reference_seconds: float

    @property
    def accuracy_diff(self) -> float:
        return self.accuracy - self.reference_accuracy

    def accuracy_bound(self) -> float:
        return SIGN_TEST_SIGMAS * math.sqrt(len(self.disagreements)) / self.items

    def problems(self) -> list[str]:
        found = []
        if self.agreement < AGREEMENT_MIN:
            found.append(f"{self.task}: agreement {self.agreement:.2f} < {AGREEMENT_MIN}")
        if abs(self.accuracy_diff) > self.accuracy_bound() + 1e-12:
            found.append(f"{self.task}: accuracy {self.accuracy:.2f} vs {self.reference_accuracy:.2f}, beyond chance "
                         f"for {len(self.disagreements)} changed answers (bound {self.accuracy_bound():.3f})")
        return found


def compare_task(device: dict, reference: dict, seconds: float, reference_seconds: float) -> TaskComparison:
    """device, reference: eval_recipe.score's dicts for the same task (items in document order)."""
    ours, theirs = device["items"], reference["items"]
    if [i["doc"] for i in ours] != [i["doc"] for i in theirs] or any(len(a["logliks"]) != len(b["logliks"]) for a, b in zip(ours, theirs)):
        raise ValueError(f"{device['task']}: the device and the reference scored different items or choices")
    if not ours:
        raise ValueError(f"{device['task']}: the task has no items")
    changed = [a["doc"] for a, b in zip(ours, theirs) if a["chosen"] != b["chosen"]]
    drift = max(abs(x - y) for a, b in zip(ours, theirs) for x, y in zip(a["logliks"], b["logliks"]))
    count = len(ours)
    return TaskComparison(
        task=device["task"], items=count, accuracy=sum(i["correct"] for i in ours) / count,
        reference_accuracy=sum(i["correct"] for i in theirs) / count, agreement=1 - len(changed) / count,
        loglik_max_diff=drift, disagreements=changed, seconds=seconds, reference_seconds=reference_seconds,
    )


def verdict(comparisons: list[TaskComparison]) -> tuple[str, str]:
    """(eval_status, eval_reason): AGREE or DISAGREE, and one line that says why."""
    problems = [p for c in comparisons for p in c.problems()]
    if problems:
        return "DISAGREE", "; ".join(problems)
    summary = ", ".join(f"{c.task} {c.accuracy:.2f} (agreement {c.agreement:.2f})" for c in comparisons)
    return "AGREE", f"accuracy equals the CPU eager reference's within chance: {summary}"


def row_columns(comparisons: list[TaskComparison]) -> dict:
    """The dataset's eval columns (schema 5), one list entry per task in the order asked."""
    status, reason = verdict(comparisons)
    return {
        "eval_tasks": [c.task for c in comparisons],
        "eval_items": [c.items for c in comparisons],
        "eval_accuracy": [c.accuracy for c in comparisons],
        "eval_reference_accuracy": [c.reference_accuracy for c in comparisons],
        "eval_accuracy_diff": [c.accuracy_diff for c in comparisons],
        "eval_agreement": [c.agreement for c in comparisons],
        "eval_loglik_max_diff": [c.loglik_max_diff for c in comparisons],
        "eval_seconds": [c.seconds for c in comparisons],
        "eval_reference_seconds": [c.reference_seconds for c in comparisons],
        "eval_disagreements": [f"{c.task}#{doc}" for c in comparisons for doc in c.disagreements],
        "eval_agreement_min": min(c.agreement for c in comparisons),
        "eval_status": status,
        "eval_reason": reason,
    }


def device_only_columns(scores: list[dict]) -> dict:
    """The eval columns without a reference: each task's items, accuracy on the device and seconds."""
    return {
        "eval_tasks": [s["task"] for s in scores],
        "eval_items": [len(s["items"]) for s in scores],
        "eval_accuracy": [s["accuracy"] for s in scores],
        "eval_seconds": [s["seconds"] for s in scores],
        "eval_reason": "device accuracy only: no single-device reference (--no-reference)",
    }
