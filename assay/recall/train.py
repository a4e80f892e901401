"""`assay recall train`: small GLA and attention models trained on MQAR for a fixed budget, scored per pair count.

One model per (architecture, seq_len), trained on a mixture of the requested pair counts that fit the
length, then scored on each count separately: cheaper than one model per cell, and the same trained
weights answer every pair count, so a row's drop with more pairs is the architecture's, not a
different run's luck. Training goes through the training pilot (assay.train.Trainer: its optimizer,
schedule, loss and step records) with an MQARBatches source in place of text.

Budget: --steps (the schedule's length) and/or --budget-min (CPU minutes of this process per model,
checked between steps: on a shared machine wall time depends on the neighbours, CPU time much less).
With only a minute budget the schedule's horizon is the steps the budget buys: fifteen steps of a throwaway
trainer are timed (CPU) first, so warm-up and cosine decay span the real run; if the budget outlasts
the plan, training goes on at the schedule's floor until it is spent. --until-accuracy X
scores a validation set (a seed neither training nor the final score uses) every --eval-every steps and
stops the model once every pair count reaches X. Every row records steps done, CPU and wall minutes,
why the model stopped, and `converged`: whether its pair count reached the target on validation
(None when no target was given), so a budget-limited row is never mistaken for a converged one.

Curriculum (--curriculum): training starts on the smallest pair count and adds the next one each time
every active count reaches the target on validation (Zoology-style: a model first learns to look a key
up with few pairs, then more pairs only sharpen it).

results.json (written atomically after each model, so a stopped run keeps finished models) holds one
row per (arch, seq_len, pairs) and each model's checkpoint folder, loadable by `recall needle`.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from assay.core.files import atomic_write_json
from assay.recall.request import RecallTrainRequest, validate_train_request
from assay.recall.models import build_model, matched_params, model_args, state_bytes, state_kind, write_checkpoint
from assay.recall.mqar import MQARBatches, ShortFirst, check_fits, evaluate, model_predictor, short_pair_counts

RESULTS_FILE = "results.json"
SCHEMA = "assay.recall.train/1"
DEFAULT_MAX_STEPS = 100_000  # the calibration trainer's schedule length (never run that far)
VALIDATION_SEED = 20_011  # added to the run's seed: validation sequences (the final score uses + 10_007)


@dataclass
class RecallTrainResult:
    rows: list[dict]
    models: list[dict]
    params: dict[str, int]
    out: Path

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "rows": self.rows, "models": self.models, "params": self.params}


def train_recall(request: RecallTrainRequest) -> RecallTrainResult:
    validate_train_request(request)
    # The model's vocabulary is the task's: keys, values and filler (layout.vocab_size), whatever size says.
    request = replace(request, size=replace(request.size, vocab_size=request.layout.vocab_size))
    out = Path(request.out)
    params = matched_params(request.size, request.archs)
    result = RecallTrainResult([], [], params, out)
    threads_before = torch.get_num_threads()
    if request.threads:
        torch.set_num_threads(request.threads)
    try:
        for seq_len in request.seq_lens:
            fitting = [p for p in request.pairs if check_fits(request.layout, seq_len, p) is None]
            for arch in request.archs:
                args = model_args(arch, request.size)
                memory = state_bytes(arch, args, seq_len)
                for pairs in request.pairs:
                    problem = check_fits(request.layout, seq_len, pairs)
                    if problem:
                        result.rows.append(_row(arch, seq_len, pairs, params[arch], memory, status="skipped", reason=problem))
                if not fitting:
                    continue
                model_info, scores, validation = _train_one(request, arch, seq_len, fitting, out)
                result.models.append(model_info)
                plateaued = model_info["stopped_by"] == "plateau"
                watching = model_info["converged"] is not None  # a target or a patience was given
                for pairs, score in scores.items():
                    target = request.until_accuracy
                    reached = validation[pairs] >= target if target is not None else None
                    result.rows.append(_row(
                        arch, seq_len, pairs, params[arch], memory, status="ok", accuracy=score.accuracy, correct=score.correct,
                        total=score.total, steps=model_info["steps_done"], minutes=model_info["minutes"],
                        wall_minutes=model_info["wall_minutes"], final_loss=model_info["final_loss"], checkpoint=model_info["checkpoint"],
                        val_accuracy=validation.get(pairs), target=target, stopped_by=model_info["stopped_by"],
                        # This pair count reached the target, or the model stopped improving (its lowest count's
                        # accuracy on a plateau under --patience): the row is then the model's converged score.
                        converged=(plateaued or bool(reached)) if watching else None, reached_target=reached,
                    ))
                result.rows.sort(key=lambda r: (r["seq_len"], r["arch"], r["pairs"]))
                _write(result, request)
    finally:
        torch.set_num_threads(threads_before)
    _write(result, request)
    return result


def _row(arch, seq_len, pairs, params, memory, status, reason=None, **measured) -> dict:
    return {
        "arch": arch, "seq_len": seq_len, "pairs": pairs, "status": status, "reason": reason,
        "accuracy": measured.get("accuracy"), "correct": measured.get("correct"), "total": measured.get("total"),
        "params": params, "state_bytes": memory, "state_kind": state_kind(arch),
        "steps": measured.get("steps"), "minutes": measured.get("minutes"), "wall_minutes": measured.get("wall_minutes"),
        "final_loss": measured.get("final_loss"), "val_accuracy": measured.get("val_accuracy"), "target": measured.get("target"),
        "converged": measured.get("converged"), "reached_target": measured.get("reached_target"), "stopped_by": measured.get("stopped_by"), "checkpoint": measured.get("checkpoint"),
    }


def _write(result: RecallTrainResult, request: RecallTrainRequest) -> None:
    settings = asdict(request) | {"out": str(request.out)}
    atomic_write_json(result.out / RESULTS_FILE, result.as_dict() | {"request": settings})


def _train_one(request: RecallTrainRequest, arch: str, seq_len: int, pair_counts: list[int], out: Path):
    """Build, train (budget, target) and score one model; (model info, {pairs: Score}, {pairs: validation accuracy})."""
    from assay.core.progress import progress_bar
    from assay.train.optimization import OptimConfig
    from assay.train.trainer import TrainRequest, Trainer

    name = f"{arch}-L{seq_len}{request.tag}"
    model, args = build_model(arch, request.size, seed=request.seed)
    initial = write_checkpoint(model, arch, args, out / "models" / f"{name}-init", request.layout)
    del model
    batch = request.tokens_per_step // seq_len if request.tokens_per_step else request.batch
    active = pair_counts[:1] if request.curriculum else list(pair_counts)
    source = main = MQARBatches(request.layout, seq_len, batch, active, seed=request.seed)
    short_len = request.short_first if request.short_first and request.short_first < seq_len else None
    if short_len:
        short_pairs = short_pair_counts(request.layout, short_len, pair_counts)
        # As many tokens per step as the full length; its own seed, so the two stages never share a sequence.
        short = MQARBatches(request.layout, short_len, max(1, batch * seq_len // short_len), short_pairs, seed=request.seed + 1)
        source = ShortFirst(short, main)

    def make_trainer(steps: int) -> Trainer:
        # Weight decay 0: the embeddings of rarely drawn keys would be decayed towards zero between their uses.
        optim = OptimConfig(lr=request.lr, warmup_steps=min(request.warmup_steps, steps), weight_decay=0.0)
        return Trainer(TrainRequest(
            model=str(initial), path="native", steps=steps, batch=batch, seq_len=seq_len, optim=optim,
            seed=request.seed, device=request.device, batch_source=source,
        ))

    clock = BudgetClock(request.budget_min)  # started before the calibration: its steps are paid from the budget
    max_steps, step_cpu_s = request.steps, None
    if max_steps is None:
        # Only a CPU budget: plan the warm-up + cosine schedule for the steps that budget buys, so the LR
        # decays over the real run (a schedule planned for 100,000 steps would stay at its peak).
        step_cpu_s = _calibrate(make_trainer)
        max_steps = max(request.warmup_steps + 1, int(clock.remaining_s() / step_cpu_s))
    trainer = make_trainer(max_steps)
    record = None
    validation: dict[int, float] = {}
    history: list[dict] = []
    stopped_by = "steps"
    watching = request.until_accuracy is not None or request.patience is not None
    plateau = Plateau(request.patience)
    try:
        loaded = trainer.loaded
        predict = model_predictor(loaded.logits, trainer.device)

        def validate() -> dict[int, float]:
            # Its own seed: neither a training step nor the final score ever draws these sequences.
            loaded.model.eval()
            scores = {p: evaluate(predict, request.layout, seq_len, p, request.val_examples, seed=request.seed + VALIDATION_SEED).accuracy
                      for p in pair_counts}
            loaded.model.train()
            history.append({"step": len(trainer.records), "cpu_minutes": clock.cpu_minutes(), "active_pairs": list(source.pair_counts),
                            "stage_seq_len": short_len if short_len and source.on_short else seq_len,
                            "val_accuracy": {str(p): a for p, a in scores.items()}})
            return scores

        def short_stage_done() -> bool:
            # The short stage's own validation (its length, its pair counts), on the validation seed.
            loaded.model.eval()
            scores = {p: evaluate(predict, request.layout, short_len, p, request.val_examples, seed=request.seed + VALIDATION_SEED).accuracy
                      for p in short_pairs}
            loaded.model.train()
            history[-1]["short_val_accuracy"] = {str(p): a for p, a in scores.items()}
            return all(a >= request.until_accuracy for a in scores.values())

        with progress_bar(f"recall {name}", total=request.steps or 0, enabled=request.progress) as advance:
            # A calibrated horizon is a plan, not a limit: if the steps turn out cheaper than timed (the first
            # steps of a process are slow), training goes on at the schedule's floor until the budget is spent.
            for step in range(request.steps) if request.steps is not None else itertools.count():
                if clock.spent():
                    stopped_by = "budget-min"
                    break
                record = trainer.step(step)
                advance(f"loss {record['loss']:.3f}" + (f" val {min(validation.values()):.2f}" if validation else ""))
                if watching and (step + 1) % request.eval_every == 0:
                    validation = validate()
                    if request.until_accuracy is not None and all(validation[p] >= request.until_accuracy for p in pair_counts):
                        stopped_by = "until-accuracy"
                        break
                    # The plateau counts only at the full length: the short stage's scores there are a warm-up.
                    if not (short_len and source.on_short) and plateau.stalled(min(validation.values())):
                        stopped_by = "plateau"
                        break
                    if short_len and source.on_short and short_stage_done():
                        source.advance(step + 1)
                    if request.curriculum and all(validation[p] >= request.until_accuracy for p in source.pair_counts):
                        source.pair_counts = pair_counts[: len(source.pair_counts) + 1]
        if watching and (not history or history[-1]["step"] != len(trainer.records)):
            validation = validate()  # the state the model stopped in, not the last periodic check
        cpu_minutes, wall_minutes = clock.cpu_minutes(), clock.wall_minutes()
        loaded.model.eval()
        # Scored on sequences the training stream never shows (another seed), the same set for every model.
        scores = {p: evaluate(predict, request.layout, seq_len, p, request.eval_examples, seed=request.seed + 10_007) for p in pair_counts}
        state = {key: tensor.detach().cpu() for key, tensor in loaded.model.state_dict().items()}
        checkpoint = write_checkpoint(state, arch, args, out / "models" / name, request.layout)
    finally:
        trainer.close()
    steps_done = len(trainer.records)
    info = {
        "name": name, "arch": arch, "seq_len": seq_len, "pairs_trained": pair_counts, "batch": batch, "checkpoint": str(checkpoint),
        "steps_done": steps_done, "steps_planned": max_steps, "calibrated_step_cpu_s": step_cpu_s, "minutes": cpu_minutes, "wall_minutes": wall_minutes,
        "final_loss": record["loss"] if record else None, "final_lr": record["lr"] if record else None, "first_loss": trainer.records[0]["loss"] if trainer.records else None,
        "stopped_by": stopped_by, "target": request.until_accuracy,
        # The length curriculum: the short length, and the steps spent on it (all of them if it never moved on).
        "short_first": short_len, "short_steps": (source.switched_at if source.switched_at is not None else steps_done) if short_len else None,
        # Converged: reached the target, or stopped improving (a plateau under --patience); stopped_by says which.
        "converged": (stopped_by == "plateau" or (request.until_accuracy is not None and all(validation[p] >= request.until_accuracy for p in pair_counts)))
        if watching else None,
        "reached_target": all(validation[p] >= request.until_accuracy for p in pair_counts) if request.until_accuracy is not None else None,
        "patience": request.patience,
        "validation": history,
    }
    return info, scores, validation


PLATEAU_MIN_GAIN = 0.005  # half a point of accuracy: a smaller rise does not count as progress


class Plateau:
    """Counts validations since the score last beat its best by PLATEAU_MIN_GAIN; stalled after `patience` of them."""

    def __init__(self, patience: int | None):
        self.patience, self.best, self.since_best = patience, -math.inf, 0

    def stalled(self, score: float) -> bool:
        if self.patience is None:
            return False
        if score > self.best + PLATEAU_MIN_GAIN:
            self.best, self.since_best = score, 0
        else:
            self.since_best += 1
        return self.since_best >= self.patience


CALIBRATION_STEPS = (5, 20)  # steps timed to plan a budget's schedule: after the first (slow) ones, fifteen of them


def _calibrate(make_trainer) -> float:
    """CPU seconds per optimizer step of this model and batch, from a throwaway trainer (its updates are dropped)."""
    first, last = CALIBRATION_STEPS
    trainer = make_trainer(DEFAULT_MAX_STEPS)
    try:
        for step in range(last):
            if step == first:
                started = time.process_time()
            trainer.step(step)
        return max(1e-6, (time.process_time() - started) / (last - first))
    finally:
        trainer.close()


class BudgetClock:
    """CPU minutes of this process (all its threads) against the budget, and wall minutes beside them.
    CPU time is the budget because ~8 jobs share two cores here: wall time would measure the neighbours."""

    def __init__(self, budget_min: float | None):
        self.budget_s = budget_min * 60 if budget_min else math.inf
        self.cpu_start, self.wall_start = time.process_time(), time.monotonic()

    def cpu_minutes(self) -> float:
        return (time.process_time() - self.cpu_start) / 60

    def wall_minutes(self) -> float:
        return (time.monotonic() - self.wall_start) / 60

    def remaining_s(self) -> float:
        return self.budget_s - (time.process_time() - self.cpu_start)

    def spent(self) -> bool:
        return time.process_time() - self.cpu_start >= self.budget_s
