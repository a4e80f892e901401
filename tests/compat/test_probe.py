import json
import sys

import pytest

from assay.compat.results.dataset import query
from assay.compat.probe.execute import probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.run.single import probe_and_record
from assay.compat.results.schema import SCHEMA_VERSION
from assay.zoo import ZOO



@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(name for name, entry in ZOO.items() if entry.transformers_native))
def test_zoo_model_passes_under_aot_eager(zoo_dir, name):
    row = probe(ProbeRequest(str(zoo_dir / name), backend="aot_eager", new_tokens=12))
    assert row["status"] == "PASS", (row["reason"], row["error"])
    assert row["generated_tokens"] == row["reference_tokens"] and len(row["generated_tokens"]) == 12
    assert row["model"] == f"assay-zoo/{name}" and row["stands_in_for"] == ZOO[name].stands_in_for
    assert row["graphs"] >= 1 and row["load_s"] > 0 and row["compile_s"] > 0 and row["decode_tokens_per_s"] > 0
    assert row["total_s"] >= row["load_s"] + row["compile_s"]
    assert row["peak_memory_bytes"] > 50 * 2**20 and row["memory_kind"] == "host_rss"


def test_garbage_tokens_are_fail_accuracy_outside_top5(zoo_dir):
    row = probe(ProbeRequest(str(zoo_dir / "llama"), backend="test_garbage_logits", new_tokens=8))
    assert row["status"] == "FAIL_ACCURACY"
    # Transformers runs the prefill eager and compiles the decode step: token 0 comes from the prefill,
    # token 1 is the first one a compiled graph produced.
    assert row["first_mismatch"] == 1
    assert row["generated_tokens"][0] == row["reference_tokens"][0]
    assert row["mismatch_in_top5"] is False
    assert row["mismatch_actual"] == row["generated_tokens"][1] != row["mismatch_expected"]
    assert "garbage" in row["reason"]


def test_drifting_tokens_are_fail_accuracy_inside_top5(zoo_dir):
    row = probe(ProbeRequest(str(zoo_dir / "llama"), backend="test_drifting_logits", new_tokens=8))
    assert row["status"] == "FAIL_ACCURACY"
    assert row["mismatch_in_top5"] is True
    assert "drift" in row["reason"]


def test_compiler_error_is_fail_compile(zoo_dir):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="test_compiler_crash", new_tokens=4))
    assert row["status"] == "FAIL_COMPILE"
    assert "vendor compiler: unsupported operator" in row["error"]


def test_runtime_error_is_fail_run(zoo_dir):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="test_runtime_crash", new_tokens=4))
    assert row["status"] == "FAIL_RUN"
    assert "kernel launch failed" in row["reason"]


def _copy_checkpoint(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupt_safetensors_is_fail_load(zoo_dir, tmp_path):
    broken = _copy_checkpoint(zoo_dir / "qwen3", tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    row = probe_and_record(ProbeRequest(str(broken), backend="aot_eager"), tmp_path / "results")
    assert row["status"] == "FAIL_LOAD"
    assert row["error"] and "Traceback" in row["error"]
    assert query(tmp_path / "results")[0]["status"] == "FAIL_LOAD"


def test_unknown_architecture_is_fail_load(zoo_dir, tmp_path):
    custom = _copy_checkpoint(zoo_dir / "qwen3", tmp_path / "custom")
    config = json.loads((custom / "config.json").read_text())
    config["model_type"] = "my_private_arch"
    config["architectures"] = ["MyPrivateForCausalLM"]
    (custom / "config.json").write_text(json.dumps(config))
    (custom / "assay_zoo.json").unlink()
    row = probe(ProbeRequest(str(custom), backend="aot_eager"))
    assert row["status"] == "FAIL_LOAD"
    assert "my_private_arch" in row["reason"] + row["error"]


@pytest.mark.slow
def test_gla_loads_through_assays_registration_and_its_run_py_reproduces(zoo_dir, tmp_path, assay_cli):
    # zoo/gla is in fla's GLA layout (model_type "gla"), which Transformers does not implement: `import
    # assay` registers assay's GLA with its Auto classes, in the probe's own process (a CLI subprocess here).
    import subprocess

    result = assay_cli("probe", str(zoo_dir / "gla"), "--backend", "aot_eager", "--new-tokens", "6", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    row = json.loads(result.stdout)
    assert row["status"] == "PASS", (row["reason"], row["error"])
    assert row["model"] == "assay-zoo/gla" and row["architecture"] == "GLAForCausalLM" and row["graphs"] >= 1
    # a fixed-size recurrent state, no static KV cache; run.py imports assay for the model code, and says so
    assert row["cache_kind"] == "fixed_state" and row["model_code"] == "assay"
    [stored] = query(tmp_path)
    assert stored["cache_kind"] == "fixed_state" and stored["schema_version"] == SCHEMA_VERSION >= 2
    assert "\nimport assay  #" in stored["run_py"] and "Requires: torch, transformers and assay" in stored["run_py"]
    script = tmp_path / "run.py"
    script.write_text(stored["run_py"])
    rerun = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["tokens"] == row["generated_tokens"]


def test_a_transformers_model_records_a_static_kv_cache_and_no_model_code(zoo_dir):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="eager", new_tokens=2))
    assert row["cache_kind"] == "static_kv" and row["model_code"] is None
    assert "import assay" not in row["run_py"]


@pytest.mark.slow
def test_deliberate_skip_is_recorded_and_not_a_failure(zoo_dir, tmp_path, assay_cli):
    result = assay_cli("probe", str(zoo_dir / "gpt2"), "--skip", "low priority", "--out", str(tmp_path), "--strict", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "SKIPPED"
    listing = assay_cli("results", str(tmp_path))
    assert "0/0 PASS" in listing.stdout and "low priority" in listing.stdout


@pytest.mark.slow
def test_strict_exits_1_on_a_failed_probe(zoo_dir, tmp_path, assay_cli):
    broken = _copy_checkpoint(zoo_dir / "gpt2", tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    result = assay_cli("probe", str(broken), "--backend", "aot_eager", "--out", str(tmp_path / "r"), "--strict")
    assert result.returncode == 1
    assert "FAIL_LOAD" in result.stdout


def test_image_text_model_gets_image_and_prompt(zoo_dir):
    row = probe(ProbeRequest(str(zoo_dir / "llava"), backend="aot_eager", new_tokens=4))
    assert row["task"] == "image-text-to-text"
    # LLaVA expands <image> into one token per vision patch: the prompt is longer than the text alone.
    assert row["prompt_tokens"] > 16


@pytest.mark.slow
def test_many_probes_in_one_process_each_compile(zoo_dir):
    # Every Transformers model shares dynamo's cache entries for generate's code objects: without a
    # reset between probes, later models would add recompiles to the earlier ones' until the limit.
    for name in ("gemma2", "mistral", "gemma3", "qwen3"):
        row = probe(ProbeRequest(str(zoo_dir / name), backend="aot_eager", new_tokens=4))
        assert row["status"] == "PASS" and row["graphs"] >= 1, (name, row["reason"])


@pytest.mark.slow
def test_sliding_window_static_cache_compiles_without_a_recompile_per_step(zoo_dir):
    # mistral's sliding-window static cache counts its length in a Python int; before the recipe marked
    # it dynamic, each of the 32 steps recompiled until the limit (8 graphs) and the rest ran eager.
    row = probe(ProbeRequest(str(zoo_dir / "mistral"), backend="aot_eager", new_tokens=32))
    assert row["status"] == "PASS", row["reason"]
    assert row["graphs"] <= 2 and row["recompiles"] <= 1, (row["graphs"], row["recompiles"])


@pytest.mark.slow
def test_reaching_the_recompile_limit_is_a_compile_failure(zoo_dir, monkeypatch):
    from assay.compat.probe import recipe

    monkeypatch.setattr(recipe, "DYNAMIC_SOURCES", "")  # the int specialised again: a recompile per step
    row = probe(ProbeRequest(str(zoo_dir / "mistral"), backend="aot_eager", new_tokens=32))
    assert row["status"] == "FAIL_COMPILE", (row["status"], row["reason"])
    assert "recompile" in row["reason"].lower()
