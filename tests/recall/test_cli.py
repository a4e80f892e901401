"""`assay recall train|needle|report` end to end in a subprocess, and bad input as one line with exit 2."""

from __future__ import annotations

import json

import pytest

from assay.recall.train import SCHEMA


@pytest.mark.slow
def test_train_writes_results_checkpoints_and_plot(recall_run):
    data = json.loads((recall_run / "results.json").read_text())
    assert data["schema"] == SCHEMA
    cells = {(r["arch"], r["pairs"]): r for r in data["rows"]}
    assert set(cells) == {(a, p) for a in ("gla", "qwen3") for p in (2, 4, 16)}
    # 16 pairs need 64 tokens: marked skipped with the reason, not trained, not a crash.
    assert cells[("gla", 16)]["status"] == "skipped" and "seq_len >= 64" in cells[("gla", 16)]["reason"]
    for arch in ("gla", "qwen3"):
        row = cells[(arch, 4)]
        assert row["status"] == "ok" and row["steps"] == 6 and row["total"] == 8 * 4 and 0 <= row["accuracy"] <= 1
        config = json.loads((recall_run / "models" / f"{arch}-L32" / "config.json").read_text())
        # --keys 32 --filler 16: the model's vocabulary is the task's, 64 (specials) + 32 keys + 32 values + 16 filler.
        assert config["vocab_size"] == 64 + 32 + 32 + 16
    assert cells[("gla", 4)]["state_kind"] == "state" and cells[("qwen3", 4)]["state_kind"] == "kv_cache"
    assert cells[("gla", 4)]["params"] != cells[("qwen3", 4)]["params"]  # both counts reported, each its own
    assert (recall_run / "recall.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_report_prints_the_table_and_draws(recall_run, tmp_path, assay_cli):
    png = tmp_path / "recall.png"
    result = assay_cli("recall", "report", str(recall_run), "-o", str(png))
    assert result.returncode == 0, result.stderr
    assert "qwen3" in result.stdout and "kv_cache" in result.stdout and "skipped" in result.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    as_json = assay_cli("recall", "report", str(recall_run), "--json")
    assert json.loads(as_json.stdout)["rows"] == json.loads((recall_run / "results.json").read_text())["rows"]


@pytest.mark.slow
def test_needle_command_prints_json_grid_and_heat_map(recall_run, tmp_path, assay_cli):
    png = tmp_path / "needle.png"
    result = assay_cli("recall", "needle", "--model", str(recall_run / "models" / "gla-L32"), "--lengths", "32,64",
                       "--depths", "0,1", "--trials", "2", "--json", "-o", str(png))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "gla" and data["format"] == "tokens"
    assert len(data["grid"]) == 2 and len(data["grid"][0]) == 2
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (["recall", "train", "--out", "X", "--pairs", "8,x", "--steps", "1"], "--pairs '8,x': 'x' is not an integer"),
    (["recall", "train", "--out", "X", "--arch", "rwkv", "--steps", "1"], "unknown --arch 'rwkv'"),
    (["recall", "train", "--out", "X", "--budget-min", "-1"], "--budget-min must be a positive"),
    (["recall", "needle", "--model", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["recall", "needle", "--model", "X", "--depths", "0,1.5"], "--depths 1.5"),
    (["recall", "report", "/nonexistent/dir"], "no results.json"),
    (["recall", "train", "--out", "X", "--steps", "1", "--until-accuracy", "1.5"], "--until-accuracy must be in (0, 1]"),
    (["recall", "train", "--out", "X", "--steps", "1", "--curriculum", "--until-accuracy", "0"], "--curriculum adds pair counts"),
    (["recall", "train", "--out", "X", "--steps", "1", "--init-std", "0"], "--init-std must be a positive number"),
    (["recall", "train", "--out", "X", "--steps", "1", "--short-first", "16", "--until-accuracy", "0"], "--short-first moves to the full length"),
    (["recall", "train", "--out", "X", "--steps", "1", "--keys", "0"], "invalid MQAR token layout"),
    (["recall", "train", "--out", "X", "--steps", "1", "--short-first", "2", "--until-accuracy", "0.9"], "--short-first 2: needs >= 4 tokens"),
    (["recall", "train", "--out", "X", "--steps", "1", "--patience", "0"], "--patience must be >= 1"),
    (["recall", "sweep", "--out", "X", "--widths", "30"], "--widths 30"),
    (["recall", "sweep", "--out", "X", "--gla-states", "4:x"], "--gla-states"),
    (["recall", "sweep", "--out", "X", "--attention-heads", "0"], "--attention-heads must be >= 1"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, assay_cli, args, message):
    args = [str(tmp_path / a) if a == "X" else a for a in args]
    result = assay_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.stderr


def test_train_defaults_are_the_recipe_that_converges():
    # `assay recall train` with no flags runs assay.recall.recipe (docs/recall.md says why each value): the
    # request's defaults are the recipe's, and the command leaves every recipe option unset (None), so the
    # request decides; its help names the same values.
    import typer

    from assay.recall import recipe
    from assay.recall.commands import register
    from assay.recall.train import RecallTrainRequest

    request = RecallTrainRequest(out=None)
    assert (request.pairs, request.seq_lens, request.batch, request.short_first) == (recipe.PAIRS, (recipe.SEQ_LEN,), recipe.BATCH, recipe.SHORT_FIRST)
    assert (request.budget_min, request.until_accuracy) == (recipe.BUDGET_MIN, recipe.UNTIL_ACCURACY)
    assert request.size == recipe.SIZE and request.size.n_heads == 1 and request.size.init_std == 0.05 and request.size.gla_short_conv
    assert (request.layout.n_keys, request.layout.n_filler) == (recipe.KEYS, recipe.FILLER)
    app = typer.Typer()
    register(app)
    command = typer.main.get_command(app).commands["recall"].commands["train"]
    options = {param.name: param for param in command.params}
    recipe_options = ["pairs", "seq_len", "budget_min", "until_accuracy", "short_first", "short_conv", "batch", "heads", "init_std", "keys", "filler"]
    assert all(options[name].default is None for name in recipe_options)
    assert "(recipe: 4,16)" in options["pairs"].help and "(recipe: 0.05)" in options["init_std"].help and "(recipe: 1)" in options["heads"].help

