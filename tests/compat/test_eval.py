"""`assay probe --eval`: task accuracy on the device next to the CPU eager reference, item by item.

The zoo's briefly trained qwen3 (it scores above chance on the next-sentence task) under aot_eager-based
backends: the honest one agrees item by item, one that doubles the LM head's matmul is caught, one that
nudges an activation by 1% shows drift but keeps every answer. All share the session's reference cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from compat.test_dataset import make_row

from assay.compat.results.dataset import query, write_row
from assay.compat.results.diff import diff_stacks
from assay.compat.eval.compare import AGREEMENT_MIN, TaskComparison, verdict
from assay.compat.eval.task_files import EMBEDDED, TASKS_DIR
from assay.compat.probe.execute import probe
from assay.compat.probe.plan import plan_probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.run.single import probe_and_record
from assay.compat.results.schema import SCHEMA, SCHEMA_VERSION
from assay.core.numerics import tolerance

BOTH = ("assay_cloze", "assay_next_sentence")


def _cached_reference(plan, task: str, limit: int | None = None) -> dict | None:
    """The reference's per-item scores of one task (its first `limit` documents), as the probe stored them
    in the reference cache; None when it holds none."""
    from assay.compat.eval import recipe as eval_recipe
    from assay.compat.probe.reference_cache import ReferenceCache, default_root, eval_reference_key

    sha = eval_recipe.task_content_sha256(eval_recipe.load_task(TASKS_DIR / f"{task}.yaml"), limit)
    return ReferenceCache(default_root()).load_eval(eval_reference_key(plan, sha, "float32"))


@pytest.fixture(scope="module")
def honest(zoo_dir):
    request = ProbeRequest(str(zoo_dir / "qwen3-pretrained"), backend="aot_eager", new_tokens=4, eval_tasks=BOTH)
    return request, probe(request)


@pytest.mark.slow
def test_an_honest_backend_agrees_with_the_reference_item_by_item(honest):
    request, row = honest
    assert row["status"] == "PASS" and row["eval_status"] == "AGREE", (row["eval_reason"], row["eval_error"])
    assert row["eval_tasks"] == list(BOTH) and row["eval_items"] == [100, 100]
    assert row["eval_agreement"] == [1.0, 1.0] and row["eval_disagreements"] == [] and row["eval_accuracy_diff"] == [0.0, 0.0]
    assert row["eval_accuracy"][1] > 0.25  # the next sentence among four: above chance, so answers can be lost
    # Log-likelihoods are sums over a choice's tokens: relative to the largest, within the compiled-vs-eager float32 tolerance.
    plan = plan_probe(request)
    for task, drift in zip(BOTH, row["eval_loglik_max_diff"]):
        largest = max(abs(x) for item in _cached_reference(plan, task)["items"] for x in item["logliks"])
        assert drift <= tolerance("compiled_vs_eager", torch.float32) * largest, (task, drift, largest)
    # A few padded shapes, each compiled once (power-of-two lengths from 64; the zoo tokenizer's longest item is ~170 tokens).
    assert 1 <= row["eval_graphs"] <= 4 and row["eval_recompiles"] == row["eval_graphs"] - 1
    assert all(s > 0 for s in row["eval_seconds"] + row["eval_reference_seconds"]) and row["eval_s"] > 0
    assert row["eval_reference_dtype"] == "float32" and "--eval assay_cloze,assay_next_sentence" in row["command"]


@pytest.mark.slow
def test_the_reference_comes_from_the_cache_the_second_time(honest):
    request, first = honest
    again = probe(replace(request, backend="eager"))
    assert first["eval_reference_cache_hit"] is False and again["eval_reference_cache_hit"] is True
    assert again["eval_reference_accuracy"] == first["eval_reference_accuracy"] and again["eval_status"] == "AGREE"
    assert sum(again["eval_reference_seconds"]) < sum(first["eval_reference_seconds"])


@pytest.mark.slow
def test_a_backend_that_doubles_the_lm_head_is_caught(zoo_dir, honest):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3-pretrained"), backend="test_hot_logits", new_tokens=4, eval_tasks=("assay_next_sentence",)))
    # Doubled logits keep every argmax: the tokens still match, the token check cannot see this fault.
    assert row["status"] == "PASS", row["reason"]
    assert row["eval_status"] == "DISAGREE" and row["eval_reference_cache_hit"] is True
    agreement = dict(zip(row["eval_tasks"], row["eval_agreement"]))
    assert agreement["assay_next_sentence"] < AGREEMENT_MIN and f"assay_next_sentence: agreement {agreement['assay_next_sentence']:.2f}" in row["eval_reason"]
    assert len([d for d in row["eval_disagreements"] if d.startswith("assay_next_sentence#")]) > (1 - AGREEMENT_MIN) * 100
    assert row["eval_loglik_max_diff"][0] > 1.0


@pytest.mark.slow
def test_a_one_percent_nudge_shows_drift_but_keeps_every_answer(zoo_dir, honest):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3-pretrained"), backend="test_nudged_silu", new_tokens=4, eval_tasks=("assay_next_sentence",)))
    assert row["eval_status"] == "AGREE" and row["eval_agreement"] == [1.0], row["eval_reason"]
    assert row["eval_loglik_max_diff"][0] > 1e-3  # the fault is measured, though no answer crosses a near-tie


def _comparison(agreement_items: int, device_correct: int, reference_correct: int, items: int = 100) -> TaskComparison:
    changed = list(range(items - agreement_items))
    return TaskComparison("t", items, device_correct / items, reference_correct / items, agreement_items / items, 0.0, changed, 1.0, 1.0)


def test_the_verdict_flags_low_agreement_and_one_sided_flips():
    assert verdict([_comparison(100, 60, 60)])[0] == "AGREE"
    assert verdict([_comparison(95, 60, 61)])[0] == "AGREE"  # 5 flips, 3 lost and 2 won: noise
    status, reason = verdict([_comparison(94, 60, 60)])
    assert status == "DISAGREE" and "agreement 0.94 < 0.95" in reason
    # 5 flips, all lost: agreement is 0.95, but |0.05| > 2 * sqrt(5) / 100 = 0.045, a sign test's 2 sigma
    status, reason = verdict([_comparison(95, 55, 60)])
    assert status == "DISAGREE" and "beyond chance" in reason
    assert verdict([_comparison(96, 56, 60)])[0] == "AGREE"  # 4 lost of 4: 0.04 <= 2 * sqrt(4) / 100


def test_schema_4_files_still_read_with_the_eval_columns_null(tmp_path):
    old_columns = [f for f in SCHEMA if not f.name.startswith("eval_")]
    row = {f.name: None for f in old_columns} | {"schema_version": 4, "model": "m", "status": "PASS", "device": "cpu",
                                                  "backend": "eager", "stack_id": "cpu-eager-v4", "dtype": "float32"}
    pq.write_table(pa.Table.from_pylist([row], schema=pa.schema(old_columns)), tmp_path / "cpu-eager-v4.parquet")
    write_row(tmp_path, row | {"stack_id": "cpu-eager-v5", "eval_tasks": ["assay_cloze"], "eval_status": "DISAGREE", "eval_agreement_min": 0.5})
    rows = {r["stack_id"]: r for r in query(tmp_path)}
    assert rows["cpu-eager-v4"]["schema_version"] == 4 and rows["cpu-eager-v4"]["eval_status"] is None
    assert rows["cpu-eager-v5"]["schema_version"] == SCHEMA_VERSION == 7
    [change] = diff_stacks(tmp_path, "v4", "v5").changes
    assert change.kind == "eval_regressed" and change.base_eval is None and change.new_eval == "DISAGREE 0.50"


def test_diff_puts_an_eval_regression_after_status_regressions(tmp_path):
    write_row(tmp_path, make_row("a", stack="cpu-x-old", eval_status="AGREE", eval_agreement_min=1.0))
    write_row(tmp_path, make_row("a", stack="cpu-x-new", eval_status="DISAGREE", eval_agreement_min=0.8))
    write_row(tmp_path, make_row("b", stack="cpu-x-old"))
    write_row(tmp_path, make_row("b", stack="cpu-x-new", status="FAIL_RUN"))
    write_row(tmp_path, make_row("c", stack="cpu-x-old", eval_status="DISAGREE", eval_agreement_min=0.8))
    write_row(tmp_path, make_row("c", stack="cpu-x-new", eval_status="AGREE", eval_agreement_min=1.0))
    changes = diff_stacks(tmp_path, "old", "new").changes
    assert [(c.model, c.kind) for c in changes] == [("b", "regressed"), ("a", "eval_regressed"), ("c", "both_pass")]
    assert changes[1].base_eval == "AGREE 1.00" and changes[1].new_eval == "DISAGREE 0.80"


@pytest.mark.slow
def test_a_probe_without_eval_never_imports_lm_eval(zoo_dir):
    script = (f"import sys\nfrom assay.compat.probe.execute import probe\nfrom assay.compat.probe.request import ProbeRequest\n"
              f"row = probe(ProbeRequest({str(zoo_dir / 'qwen3')!r}, backend='eager', new_tokens=2))\n"
              "print(row['status'], 'lm_eval' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == ["PASS", "False"]


@pytest.mark.slow
def test_a_users_own_task_file_runs_offline_by_path(zoo_dir, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"q": f"The value of {n} plus one is", "a": f" {n + 1}"}) + "\n" for n in range(12)))
    (tmp_path / "mine.yaml").write_text(
        "task: my_arithmetic\ndataset_path: json\ndataset_kwargs:\n"
        f"  data_files:\n    test: {items}\n  cache_dir: {tmp_path / 'datasets-cache'}\n"
        "test_split: test\noutput_type: loglikelihood\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
        "metric_list:\n  - metric: acc\n")
    row = probe(ProbeRequest(str(zoo_dir / "qwen3-pretrained"), backend="aot_eager", new_tokens=2, eval_tasks=(str(tmp_path / "mine.yaml"),)))
    assert row["eval_tasks"] == ["my_arithmetic"] and row["eval_items"] == [12] and row["eval_status"] == "AGREE", row["eval_reason"]
    assert f"--eval {tmp_path / 'mine.yaml'}" in row["command"]


@pytest.mark.slow
def test_run_py_reproduces_the_eval_item_by_item_without_assay(zoo_dir, tmp_path):
    # With --eval-limit 30: the row, its command and its run.py score the task's first 30 documents.
    request = ProbeRequest(str(zoo_dir / "qwen3-pretrained"), backend="aot_eager", new_tokens=4, eval_tasks=("assay_next_sentence",),
                           eval_limit=30)
    row = probe_and_record(request, tmp_path / "results")
    [stored] = query(tmp_path / "results")
    assert stored["eval_limit"] == 30 and stored["eval_items"] == [30] and "--eval-limit 30" in stored["command"]
    assert "import assay" not in stored["run_py"] and "from assay" not in stored["run_py"] and "EVAL_FILES" in stored["run_py"]
    script = tmp_path / "run.py"
    script.write_text(stored["run_py"])
    scratch = tmp_path / "tmp"  # the run's temporary folder: it writes its embedded task files there
    scratch.mkdir()
    result = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env=os.environ | {"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert not list(scratch.glob("assay-eval-tasks-*")), "run.py left its task files behind"
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["tokens"] == row["generated_tokens"]
    rerun = printed["eval"]["assay_next_sentence"]
    assert rerun["accuracy"] == row["eval_accuracy"][0] and len(rerun["chosen"]) == 30
    # The probe agreed with the reference item by item, so the rerun's answers are the reference's (cached
    # under the first 30 documents' hash: a limited reference never answers for the whole task).
    reference = _cached_reference(plan_probe(request), "assay_next_sentence", limit=30)
    assert len(reference["items"]) == 30 and rerun["chosen"] == [item["chosen"] for item in reference["items"]]


@pytest.mark.parametrize("value, message", [
    ("nosuch_task", "no such task (embedded tasks: assay_cloze, assay_next_sentence, or embedded)"),
    ("notes.txt", "an lm-eval task is a .yaml file"),
    ("group.yaml", "not an lm-eval task file (no `task: NAME`"),
    ("broken.yaml", "the YAML does not parse"),
    (",", "--eval needs at least one task"),
])
def test_bad_eval_tasks_are_one_line_and_exit_2_before_anything_is_written(zoo_dir, tmp_path, assay_cli, value, message):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "group.yaml").write_text("group: mine\ntask:\n  - a\n  - b\n")
    (tmp_path / "broken.yaml").write_text("task: [unclosed\n")
    result = assay_cli("probe", str(zoo_dir / "qwen3"), "--eval", value, "--out", str(tmp_path / "results"), cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "results").exists()


@pytest.mark.parametrize("args, message", [
    (["--eval-limit", "5"], "--eval-limit needs --eval"),
    (["--eval", "assay_cloze", "--eval-limit", "0"], "--eval-limit must be at least 1"),
])
def test_a_bad_eval_limit_is_one_line_and_exit_2(zoo_dir, tmp_path, assay_cli, args, message):
    for command in ("probe", "sweep"):
        result = assay_cli(command, str(zoo_dir / "qwen3"), *args, "--out", str(tmp_path / "results"), cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (command, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "results").exists()


def test_the_embedded_tasks_are_a_hundred_checked_items_each_shipped_as_package_data():
    import tomllib

    import yaml

    from assay.compat.eval.task_files import _TaskYamlLoader

    for name in EMBEDDED:
        config = yaml.load((TASKS_DIR / f"{name}.yaml").read_text(), Loader=_TaskYamlLoader)
        items = [json.loads(line) for line in (TASKS_DIR / f"{name}.jsonl").read_text().splitlines()]
        assert config["task"] == name and len(items) == config["metadata"]["items"] == 100
        assert [item["id"] for item in items] == list(range(100))
    for item in (json.loads(line) for line in (TASKS_DIR / "assay_cloze.jsonl").read_text().splitlines()):
        assert item["target"].isalpha() and item["target"] in item["context"]  # LAMBADA's kind: the passage used the word
    for item in (json.loads(line) for line in (TASKS_DIR / "assay_next_sentence.jsonl").read_text().splitlines()):
        assert len(set(item["choices"])) == 4 and 0 <= item["label"] < 4
    pyproject = tomllib.loads((TASKS_DIR.parents[3] / "pyproject.toml").read_text())
    assert set(pyproject["tool"]["setuptools"]["package-data"]["assay.compat.eval.tasks"]) == {"*.yaml", "*.jsonl"}


def test_the_builder_is_deterministic_and_gives_the_shipped_files_from_their_corpus(tmp_path):
    from assay.compat.eval.tasks.build import build, corpus_sha256

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    build(first), build(second)
    assert all((first / p.name).read_bytes() == (second / p.name).read_bytes() for p in first.iterdir())
    # The shipped files define the tasks; they name the corpus they came from. CPython regenerates
    # pydoc_data.topics each release, so only a Python with that corpus rebuilds them byte for byte.
    if corpus_sha256() in (TASKS_DIR / "assay_cloze.yaml").read_text():
        assert all((first / p.name).read_bytes() == (TASKS_DIR / p.name).read_bytes() for p in first.iterdir())


@pytest.mark.slow
def test_a_sweep_scores_the_tasks_and_probes_again_a_row_that_lacks_one(zoo_dir, tmp_path, assay_cli):
    args = [str(zoo_dir / "gpt2"), "--backend", "eager", "--new-tokens", "2", "--out", str(tmp_path), "--json"]
    plain = json.loads(assay_cli("sweep", *args, timeout=900).stdout)
    assert plain["counts"] == {"PASS": 1} and plain["rows"][0]["eval_tasks"] is None
    # A recorded row without the asked task is not "already recorded": the sweep probes it again, its
    # zygote having imported lm-eval once for every probe it forks.
    evaluated = assay_cli("sweep", *args, "--eval", "assay_cloze", timeout=900)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    [row] = json.loads(evaluated.stdout)["rows"]
    assert row["eval_tasks"] == ["assay_cloze"] and row["eval_status"] == "AGREE", (row["eval_reason"], row["eval_error"])
    assert json.loads(evaluated.stdout)["phases"]["eval_s"] == row["eval_s"] > 0
    again = json.loads(assay_cli("sweep", *args, "--eval", "assay_cloze", timeout=900).stdout)
    assert again["rows"] == [] and again["skipped_existing"] == ["assay-zoo/gpt2"]
    # The same task over other documents (--eval-limit) is not the recorded row's eval: probed again.
    limited = json.loads(assay_cli("sweep", *args, "--eval", "assay_cloze", "--eval-limit", "10", timeout=900).stdout)
    [row] = limited["rows"]
    assert row["eval_limit"] == 10 and row["eval_items"] == [10] and row["eval_status"] == "AGREE", row["eval_reason"]
    [stored] = query(tmp_path)
    assert stored["eval_agreement"] == [1.0] and stored["schema_version"] == SCHEMA_VERSION
