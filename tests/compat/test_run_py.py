import json
import subprocess
import sys

import pytest

from assay.compat.results.dataset import query
from assay.compat.probe.request import ProbeRequest
from assay.compat.run.single import probe_and_record


@pytest.mark.slow
def test_stored_run_py_reproduces_the_tokens_without_assay(zoo_dir, tmp_path):
    row = probe_and_record(ProbeRequest(str(zoo_dir / "qwen3"), backend="aot_eager", new_tokens=10), tmp_path / "results")
    assert row["status"] == "PASS"
    [stored] = query(tmp_path / "results")
    script = tmp_path / "run.py"
    script.write_text(stored["run_py"])
    assert "import assay" not in stored["run_py"] and "from assay" not in stored["run_py"]
    # -I: isolated mode, so neither the working directory nor PYTHONPATH can lend it assay's source.
    result = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["tokens"] == list(stored["generated_tokens"])


@pytest.mark.slow
def test_image_text_run_py_reproduces_the_tokens(zoo_dir, tmp_path):
    row = probe_and_record(ProbeRequest(str(zoo_dir / "gemma3-vision"), backend="eager", new_tokens=6), tmp_path / "results")
    assert row["status"] == "PASS", row["error"]
    script = tmp_path / "run.py"
    script.write_text(row["run_py"])
    result = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["tokens"] == row["generated_tokens"]


def test_a_sharded_run_result_is_json_and_safetensors_and_reading_it_unpickles_nothing(tmp_path):
    # recipe.launch's rank-0 result (a sharded probe's report, a sharded run.py's output): JSON, with the
    # top-level tensors in safetensors beside it; read back with neither torch.load nor pickle.
    import builtins

    import torch

    from assay.compat.probe.recipe import load_result, save_result

    path = str(tmp_path / "rank0.json")
    result = {"tokens": [5, 7, 9], "failure": None, "stats": {"graphs": 1}, "logits": torch.randn(3, 11)}
    save_result(result, path)
    saved = json.loads((tmp_path / "rank0.json").read_text())
    assert saved == {"result": {"tokens": [5, 7, 9], "failure": None, "stats": {"graphs": 1}}, "tensors": ["logits"]}
    loaded = load_result(path)
    assert loaded.keys() == result.keys() and torch.equal(loaded["logits"], result["logits"])

    # A pickle with a code payload put in place of the tensors file is refused, and its payload never runs.
    marker = tmp_path / "payload-ran"

    class CreatesAFile:
        def __reduce__(self):
            return (builtins.open, (str(marker), "w"))

    torch.save({"logits": CreatesAFile()}, path + ".safetensors")
    with pytest.raises(Exception, match="(?i)header|safetensor|deserializ"):
        load_result(path)
    assert not marker.exists()
