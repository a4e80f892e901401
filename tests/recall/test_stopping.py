"""--until-accuracy, the curriculum and `assay recall sweep`: when a model stops, what its rows say, and
the accuracy-vs-state sweep end to end."""

from __future__ import annotations

import pytest

import json

from assay.recall.models import matched_params, model_args, state_bytes
from assay.recall.shapes import ModelSize, MQARLayout
from assay.recall.sweep import RecallSweepRequest, sweep_points
from assay.recall.train import DEFAULT_MAX_STEPS, RecallTrainRequest, train_recall

# One pair: the only value in the sequence is the answer, so a model gets there in tens of steps.
EASY = MQARLayout(n_keys=16, n_values=16)
TINY = ModelSize(dim=32, n_heads=2, hidden_dim=64)


def test_until_accuracy_stops_at_the_first_validation_that_reaches_it(tmp_path):
    request = RecallTrainRequest(out=tmp_path, archs=("qwen3",), pairs=(1,), seq_lens=(16,), steps=600, batch=32, lr=1e-2,
                                 until_accuracy=0.9, eval_every=10, val_examples=32, layout=EASY, size=TINY, eval_examples=32)
    result = train_recall(request)
    (row,) = result.rows
    (model,) = result.models
    assert row["stopped_by"] == "until-accuracy" and row["converged"] is True
    assert row["steps"] < 600 and row["steps"] % 10 == 0
    assert row["val_accuracy"] >= 0.9 and row["target"] == 0.9
    # Every earlier validation was below the target (else the run would have stopped there).
    history = model["validation"]
    assert history[-1]["step"] == row["steps"]
    assert all(entry["val_accuracy"]["1"] < 0.9 for entry in history[:-1])
    assert row["minutes"] > 0 and row["wall_minutes"] > 0


def test_a_budget_that_runs_out_is_recorded_as_not_converged(tmp_path):
    request = RecallTrainRequest(out=tmp_path, archs=("gla",), pairs=(4,), seq_lens=(32,), steps=5, batch=8, until_accuracy=1.0,
                                 eval_every=100, layout=EASY, size=TINY, eval_examples=8, short_first=None)
    (row,) = train_recall(request).rows
    # 5 steps cannot recall 4 pairs: the run ends on its steps, validated once at the end, marked not converged.
    assert row["stopped_by"] == "steps" and row["steps"] == 5 and row["converged"] is False
    assert row["val_accuracy"] < 1.0
    saved = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    assert saved["converged"] is False and saved["arch"] == "gla" and saved["pairs"] == 4


@pytest.mark.slow
def test_a_cpu_budget_plans_the_schedule_for_the_steps_it_buys(tmp_path):
    # Only --budget-min: the warm-up + cosine horizon is the budget's steps (timed on a throwaway trainer),
    # so the LR decays over the run instead of staying at the peak of a 100,000-step plan.
    request = RecallTrainRequest(out=tmp_path, archs=("qwen3",), pairs=(1,), seq_lens=(16,), budget_min=0.05, batch=8, lr=1e-2,
                                 warmup_steps=5, layout=EASY, size=TINY, eval_examples=8, until_accuracy=None, short_first=None)
    (model,) = train_recall(request).models
    assert model["calibrated_step_cpu_s"] > 0
    assert 5 < model["steps_planned"] < DEFAULT_MAX_STEPS
    # The budget, not the plan, ends the run: steps cheaper than timed continue at the schedule's floor.
    assert model["stopped_by"] == "budget-min" and model["minutes"] >= request.budget_min
    assert model["steps_done"] >= 0.5 * model["steps_planned"]
    # The cosine ends at 10% of the peak: at half the plan or later the LR is clearly below the peak.
    assert model["final_lr"] < 0.9 * request.lr


def test_curriculum_adds_pair_counts_as_the_active_ones_reach_the_target(tmp_path):
    request = RecallTrainRequest(out=tmp_path, archs=("qwen3",), pairs=(1, 4), seq_lens=(16,), steps=40, batch=32, lr=1e-2,
                                 until_accuracy=0.9, eval_every=10, curriculum=True, layout=EASY, size=TINY, eval_examples=16)
    (model,) = train_recall(request).models
    active = [entry["active_pairs"] for entry in model["validation"]]
    assert active[0] == [1]  # the first steps train on one pair only
    for entry, following in zip(model["validation"], model["validation"][1:]):
        # A count is added only after a validation where every active count reached the target.
        grew = len(following["active_pairs"]) > len(entry["active_pairs"])
        assert grew == all(entry["val_accuracy"][str(p)] >= 0.9 for p in entry["active_pairs"]) or entry["active_pairs"] == [1, 4]


def test_sweep_points_grow_gla_state_at_matched_parameters():
    # The state formula at the 1,024-id vocabulary, four attention heads, no convolutions (whose window the
    # next test adds): one head at expand_k 1 holds 8x four heads at 0.5.
    request = RecallSweepRequest(out=None, widths=(32, 64), gla_states=((4, 0.5), (1, 1.0)), attention_heads=4, gla_short_conv=False,
                                 layout=MQARLayout(n_keys=64, n_values=64))
    points = sweep_points(request)
    assert [(p.arch, p.size.dim) for p in points] == [("qwen3", 32), ("gla", 32), ("gla", 32), ("qwen3", 64), ("gla", 64), ("gla", 64)]
    for dim in (32, 64):
        small, large = [p.size for p in points if p.arch == "gla" and p.size.dim == dim]
        # n_layers x dim^2 x expand_k / heads floats: one head at expand_k 1 holds 8x the state of four at 0.5.
        assert state_bytes("gla", model_args("gla", large), 64) == 8 * state_bytes("gla", model_args("gla", small), 64)
        for size in (small, large):
            counts = matched_params(size)
            assert abs(counts["gla"] - counts["qwen3"]) <= 0.10 * min(counts.values())


@pytest.mark.slow
def test_sweep_command_writes_rows_per_state_and_the_plot(tmp_path, assay_cli):
    out = tmp_path / "sweep"
    result = assay_cli("recall", "sweep", "--out", str(out), "--widths", "16", "--gla-states", "4:0.5,1:1", "--pairs", "2,4",
                       "--seq-len", "32", "--steps", "3", "--until-accuracy", "1", "--keys", "16", "--eval-examples", "4",
                       "--attention-heads", "4", "--no-short-conv", "--filler", "928", "--json")  # the zoo's 1,024 ids
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    rows = data["rows"]
    assert {(r["arch"], r["heads"], r["expand_k"], r["pairs"]) for r in rows} == {
        ("qwen3", 4, None, 2), ("qwen3", 4, None, 4), ("gla", 4, 0.5, 2), ("gla", 4, 0.5, 4), ("gla", 1, 1.0, 2), ("gla", 1, 1.0, 4)}
    assert all(r["steps"] == 3 and r["converged"] is False and r["accuracy"] is not None for r in rows)
    states = {(r["arch"], r["heads"]): r["state_bytes"] for r in rows}
    assert states[("gla", 1)] == 8 * states[("gla", 4)] and states[("qwen3", 4)] > states[("gla", 1)]
    assert json.loads((out / "sweep.json").read_text())["rows"] == rows
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_patience_stops_a_run_whose_accuracy_stopped_rising_and_calls_it_a_plateau(tmp_path):
    # lr 1e-6: the model cannot move in 60 steps, so validation never rises by half a point. With patience 2
    # the run stops at the third validation (the first sets the best, two more without progress).
    request = RecallTrainRequest(out=tmp_path, archs=("qwen3",), pairs=(4,), seq_lens=(32,), steps=60, batch=8, lr=1e-6,
                                 until_accuracy=0.99, patience=2, eval_every=5, val_examples=16, layout=EASY, size=TINY, eval_examples=8,
                                 short_first=None)
    result = train_recall(request)
    (model,), (row,) = result.models, result.rows
    assert model["stopped_by"] == "plateau" and model["steps_done"] == 15
    assert row["converged"] is True and row["reached_target"] is False and row["stopped_by"] == "plateau"
    assert model["converged"] is True and model["reached_target"] is False and model["patience"] == 2
    scores = [entry["val_accuracy"]["4"] for entry in model["validation"]]
    assert max(scores[1:]) <= scores[0] + 0.005


def test_plateau_counts_validations_since_the_best_by_half_a_point():
    from assay.recall.train import Plateau

    plateau = Plateau(2)
    # 0.5 sets the best; 0.503 is not half a point better; 0.51 is (reset); then two without progress.
    assert [plateau.stalled(s) for s in (0.5, 0.503, 0.51, 0.512, 0.5)] == [False, False, False, False, True]
    assert not any(Plateau(None).stalled(0.1) for _ in range(5))


def test_short_convolutions_add_their_window_to_the_gla_state_and_the_sweep_tag():
    plain = ModelSize()
    conv = ModelSize(gla_short_conv=True)
    args = model_args("gla", conv)
    assert args.use_short_conv and not model_args("gla", plain).use_short_conv
    # per layer: 3 past inputs of q, k (32 wide each) and v (64 wide), float32
    assert state_bytes("gla", args, 64) == state_bytes("gla", model_args("gla", plain), 64) + 2 * 3 * (32 + 32 + 64) * 4
    points = sweep_points(RecallSweepRequest(out=None, widths=(64,), gla_states=((4, 0.5),), gla_short_conv=True, attention_heads=4))
    assert [p.tag for p in points] == ["-d64-h4", "-d64-h4-k0.5-conv"]
    assert abs(matched_params(conv)["gla"] - matched_params(conv)["qwen3"]) <= 0.10 * matched_params(conv)["qwen3"]
