"""Bad input, through the real CLI, for every class of issue 22 (docs/errors.md): exit 2, exactly one line
on stderr, no traceback, and nothing written. Each case runs `assay` in a subprocess and compares the
files under its working folder and under the shared inputs before and after.

Bad input is found before any model loads, so each case takes seconds (the interpreter and its imports).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from compat.test_dataset import make_row
from helpers.cli import run_assay

from assay.compat.results.dataset import MARKER, write_rows
from assay.core.checks import TOKENIZER_FILES

# ------------------------------------------------------------------ the inputs, built once


@pytest.fixture(scope="session")
def inputs(zoo_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-inputs")
    made = {"zoo": zoo_dir, "qwen3": zoo_dir / "qwen3", "root": root}

    corrupt = root / "corrupt-results"
    corrupt.mkdir()
    (corrupt / MARKER).write_text(json.dumps({"kind": "assay results", "schema_version": 1}))
    (corrupt / "cpu-eager-test-00000000.parquet").write_bytes(random.Random(0).randbytes(4096))
    made["corrupt"] = corrupt

    good = root / "good-results"
    write_rows(good, [make_row("org/a")])
    made["good_results"] = good

    def copy(name: str) -> Path:
        return Path(shutil.copytree(zoo_dir / "qwen3", root / name))

    no_tokenizer = copy("no-tokenizer")
    for name in TOKENIZER_FILES + ("tokenizer_config.json", "special_tokens_map.json"):
        (no_tokenizer / name).unlink(missing_ok=True)
    made["no_tokenizer"] = no_tokenizer

    config_not_json = copy("config-not-json")
    (config_not_json / "config.json").write_text("{ this is not json")
    made["config_not_json"] = config_not_json

    weights_not_safetensors = copy("weights-not-safetensors")
    (weights_not_safetensors / "model.safetensors").write_bytes(random.Random(1).randbytes(2048))
    made["bad_weights"] = weights_not_safetensors

    made["a_file"] = root / "a-file.txt"
    made["a_file"].write_text("not a folder\n")
    made["a_folder"] = root / "a-folder"
    made["a_folder"].mkdir()
    return made


def _tree(*folders: Path) -> set[str]:
    return {f"{p}:{p.stat().st_size if p.is_file() else 'dir'}" for folder in folders for p in folder.rglob("*")}


def assert_bad_input(inputs: dict, tmp_path: Path, args: list[str], fragment: str) -> None:
    args = [a.format(tmp=tmp_path, **inputs) for a in args]
    before = _tree(tmp_path, inputs["root"])
    result = run_assay(*args, cwd=tmp_path, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert fragment in lines[0], lines[0]
    assert _tree(tmp_path, inputs["root"]) == before, "bad input left files behind"


def cases(*rows):
    return pytest.mark.parametrize("args, fragment", [pytest.param(a, f, id=i) for i, a, f in rows])


# ------------------------------------------------------------------ 1. a corrupt Parquet file in a results folder


@pytest.mark.slow
@cases(
    ("results", ["results", "{corrupt}"], "is not a readable results file"),
    ("results-json", ["results", "{corrupt}", "--json"], "cpu-eager-test-00000000.parquet"),
    ("diff", ["diff", "{corrupt}", "--base", "a", "--new", "b"], "is not a readable results file"),
    ("merge-source", ["merge", "{tmp}/merged", "{corrupt}"], "is not a readable results file"),
    ("merge-into", ["merge", "{corrupt}", "{zoo}"], "is not a readable results file"),
    ("app", ["app", "{corrupt}", "--port", "1"], "is not a readable results file"),
    ("export-space", ["export-space", "{tmp}/space", "--results", "{corrupt}"], "is not a readable results file"),
    ("probe-out", ["probe", "{qwen3}", "--backend", "eager", "--out", "{corrupt}"], "is not a readable results file"),
    ("sweep-out", ["sweep", "{qwen3}", "--backend", "eager", "--out", "{corrupt}"], "is not a readable results file"),
)
def test_corrupt_parquet_is_one_line(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment)


def test_failed_export_leaves_the_previous_export_untouched(inputs, tmp_path):
    results = tmp_path / "results"
    write_rows(results, [make_row("org/a")])
    first = run_assay("export-space", str(tmp_path / "space"), "--results", str(results), "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    exported = {p: p.read_bytes() for p in (tmp_path / "space").rglob("*") if p.is_file()}
    shutil.copy(inputs["corrupt"] / "cpu-eager-test-00000000.parquet", results / "cpu-other-00000000.parquet")
    again = run_assay("export-space", str(tmp_path / "space"), "--results", str(results), cwd=tmp_path)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr[-2000:]
    assert {p: p.read_bytes() for p in (tmp_path / "space").rglob("*") if p.is_file()} == exported
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


# ------------------------------------------------------------------ 2. a checkpoint without tokenizer files


@pytest.mark.slow
@cases(
    ("serve", ["serve", "--model", "{no_tokenizer}", "--port", "0"], "has no tokenizer"),
    ("probe", ["probe", "{no_tokenizer}", "--backend", "eager", "--out", "{tmp}/results"], "has no tokenizer"),
    ("sweep", ["sweep", "{no_tokenizer}", "--backend", "eager", "--out", "{tmp}/results"], "has no tokenizer"),
    ("train", ["train", "--model", "{no_tokenizer}", "--steps", "1", "--metrics", "{tmp}/m.jsonl"], "has no tokenizer"),
    ("recall-needle-text", ["recall", "needle", "--model", "{no_tokenizer}", "--format", "text"], "has no tokenizer"),
    ("recall-needle-auto", ["recall", "needle", "--model", "{no_tokenizer}"], "has no tokenizer"),
)
def test_checkpoint_without_tokenizer_is_bad_input(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment)


# ------------------------------------------------------------------ 3. damaged checkpoints where no row can record them


@cases(
    ("train-config", ["train", "--model", "{config_not_json}", "--steps", "1"], "config.json is not valid JSON"),
    ("serve-config", ["serve", "--model", "{config_not_json}", "--port", "0"], "config.json is not valid JSON"),
    ("needle-config", ["recall", "needle", "--model", "{config_not_json}"], "config.json is not valid JSON"),
    ("train-weights", ["train", "--model", "{bad_weights}", "--steps", "1"], "model.safetensors is not safetensors"),
    ("serve-weights", ["serve", "--model", "{bad_weights}", "--port", "0"], "model.safetensors is not safetensors"),
    ("needle-weights", ["recall", "needle", "--model", "{bad_weights}"], "model.safetensors is not safetensors"),
)
def test_broken_checkpoint_is_bad_input_outside_the_probe(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment)


@pytest.mark.slow
def test_config_not_json_is_a_fail_load_row_and_strict_exits_1(inputs, tmp_path):
    # A broken model is a result (docs/errors.md): recorded, not refused.
    result = run_assay("probe", str(inputs["config_not_json"]), "--backend", "eager", "--out", str(tmp_path / "r"), "--strict", "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    row = json.loads(result.stdout)
    assert row["status"] == "FAIL_LOAD" and "config.json is not valid JSON" in row["reason"]
    listed = run_assay("results", str(tmp_path / "r"), "--json")
    assert [r["status"] for r in json.loads(listed.stdout)] == ["FAIL_LOAD"]


# ------------------------------------------------------------------ 4. probe and sweep check everything before --out exists


@pytest.mark.slow
@cases(
    ("probe-no-such-path", ["probe", "{tmp}/nowhere", "--out", "{tmp}/results"], "is not a checkpoint"),
    ("probe-a-file", ["probe", "{a_file}", "--out", "{tmp}/results"], "is not a checkpoint"),
    ("probe-dtype", ["probe", "{qwen3}", "--dtype", "float8", "--out", "{tmp}/results"], "unknown dtype"),
    ("probe-device", ["probe", "{qwen3}", "--device", "nosuchdevice", "--out", "{tmp}/results"], "nosuchdevice"),
    ("probe-judge", ["probe", "{qwen3}", "--judge", "{tmp}/nowhere", "--out", "{tmp}/results"], "is not a checkpoint"),
    ("sweep-one-bad-model", ["sweep", "{qwen3}", "{tmp}/nowhere", "--backend", "eager", "--out", "{tmp}/results"], "is not a checkpoint"),
    ("sweep-executor", ["sweep", "{qwen3}", "--executor", "bogus", "--out", "{tmp}/results"], "unknown --executor 'bogus'"),
    ("sweep-cache-dir-file", ["sweep", "{qwen3}", "--cache-dir", "{a_file}", "--out", "{tmp}/results"], "is a file, not a folder"),
    ("sweep-dtype", ["sweep", "{qwen3}", "--dtype", "float8", "--out", "{tmp}/results"], "unknown dtype"),
)
def test_probe_and_sweep_reject_before_creating_out(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment)


@pytest.mark.parametrize("args", [["probe", "{tmp}/nowhere", "--out", "{tmp}/results"],
                                  ["probe", "{qwen3}", "--dtype", "float8", "--out", "{tmp}/results"],
                                  ["sweep", "{qwen3}", "{tmp}/nowhere", "--out", "{tmp}/results"],
                                  ["sweep", "{qwen3}", "--executor", "bogus", "--out", "{tmp}/results"],
                                  ["recall", "train", "--out", "{tmp}/r", "--arch", "rwkv", "--steps", "1"],
                                  ["recall", "train", "--out", "{tmp}/r", "--keys", "0", "--steps", "1"],
                                  ["serve", "--model", "{qwen3}", "--max-seqs", "0"],
                                  ["serve", "--model", "{qwen3}", "--dtype", "int4"],
                                  ["serve", "--model", "{qwen3}", "--quantize", "int4"]], ids=" ".join)
def test_bad_paths_names_and_numbers_are_refused_before_importing_torch(inputs, tmp_path, args, assay_process):
    # A wrong path or name is answered at once, not after the 2-4 s of importing torch and dynamo:
    # PYTHONPROFILEIMPORTTIME (python -X importtime) lists every module the process imported on stderr.
    filled = [a.format(tmp=tmp_path, qwen3=inputs["qwen3"]) for a in args]
    result = assay_process(*filled, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "assay.cli" in imported and "torch" not in imported and "transformers" not in imported
    assert [line for line in result.stderr.splitlines() if not line.startswith("import time:")][0].startswith("error: ")


# ------------------------------------------------------------------ 5. values out of range


@cases(
    ("train-lr", ["train", "--model", "{qwen3}", "--lr", "-1"], "--lr must be positive"),
    ("train-warmup", ["train", "--model", "{qwen3}", "--warmup-steps", "-3"], "--warmup-steps must be at least 0"),
    ("train-steps-0", ["train", "--model", "{qwen3}", "--steps", "0", "--metrics", "{tmp}/m.jsonl"], "--steps must be at least 1"),
    ("train-min-lr-ratio", ["train", "--model", "{qwen3}", "--min-lr-ratio", "2"], "--min-lr-ratio must be between 0 and 1"),
    ("train-batch", ["train", "--model", "{qwen3}", "--batch", "0"], "--batch must be at least 1"),
    ("probe-memory", ["probe", "{qwen3}", "--memory-limit-gb", "-1", "--out", "{tmp}/results"], "--memory-limit-gb must be positive"),
    ("probe-timeout", ["probe", "{qwen3}", "--timeout", "0", "--out", "{tmp}/results"], "--timeout must be positive"),
    ("probe-new-tokens", ["probe", "{qwen3}", "--new-tokens", "0", "--out", "{tmp}/results"], "--new-tokens must be at least 1"),
    ("sweep-max-devices", ["sweep", "{qwen3}", "--max-devices", "0", "--out", "{tmp}/results"], "--max-devices must be at least 1"),
    ("sweep-workers", ["sweep", "{qwen3}", "--workers", "0", "--out", "{tmp}/results"], "--workers must be at least 1"),
    ("sweep-device-memory", ["sweep", "{qwen3}", "--device-memory-gb", "0", "--out", "{tmp}/results"], "--device-memory-gb must be positive"),
)
def test_values_out_of_range_are_refused(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment)


# ------------------------------------------------------------------ 6. output targets, checked before the work


@cases(
    ("train-export-hf-file", ["train", "--model", "{qwen3}", "--steps", "1", "--export-hf", "{a_file}"], "is a file, not a folder"),
    ("train-metrics-folder", ["train", "--model", "{qwen3}", "--steps", "1", "--metrics", "{a_folder}"], "is a folder; name a file"),
    ("train-metrics-under-file", ["train", "--model", "{qwen3}", "--steps", "1", "--metrics", "{a_file}/m.jsonl"], "is a file, not a folder"),
    ("train-checkpoint-dir-file", ["train", "--model", "{qwen3}", "--steps", "1", "--checkpoint-dir", "{a_file}"], "is a file, not a folder"),
    ("cache-export-folder", ["cache", "export", "{a_folder}"], "is a folder; name a file"),
    ("cache-export-under-file", ["cache", "export", "{a_file}/cache.tar.gz"], "is a file, not a folder"),
    ("recall-train-out-file", ["recall", "train", "--out", "{a_file}", "--steps", "1"], "is a file, not a folder"),
    ("export-space-under-file", ["export-space", "{a_file}/space", "--results", "{good_results}"], "is a file, not a folder"),
    ("merge-into-file", ["merge", "{a_file}", "{good_results}"], "is not a folder"),
)
def test_output_targets_are_checked_first(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment)


# ------------------------------------------------------------------ 7. a damaged copy of a zoo checkpoint


@pytest.mark.slow
def test_damaged_zoo_copy_does_not_take_the_real_models_name(inputs, tmp_path):
    from assay.zoo.identity import zoo_identity

    intact = Path(shutil.copytree(inputs["qwen3"], tmp_path / "intact"))
    assert zoo_identity(intact)["name"] == "qwen3"  # an exact copy is the same model
    damaged = Path(shutil.copytree(inputs["qwen3"], tmp_path / "damaged"))
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert zoo_identity(damaged) is None
    result = run_assay("probe", str(damaged), "--backend", "eager", "--out", str(tmp_path / "shared"), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    row = json.loads(result.stdout)
    assert row["status"] == "FAIL_LOAD" and row["model"] == str(damaged.resolve())


# ------------------------------------------------------------------ 8. messages that say what is wrong


@cases(
    ("sweep-list-folder", ["sweep", "--list", "{a_folder}", "--out", "{tmp}/results"], "--list {a_folder} is a folder, not a file"),
    ("sweep-list-missing", ["sweep", "--list", "{tmp}/nowhere.txt", "--out", "{tmp}/results"], "does not exist"),
    ("sweep-zoo-file", ["sweep", "--zoo", "{a_file}", "--out", "{tmp}/results"], "is not a folder"),
)
def test_messages_name_the_actual_problem(inputs, tmp_path, args, fragment):
    assert_bad_input(inputs, tmp_path, args, fragment.format(**inputs))
