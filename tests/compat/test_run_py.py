import json
import subprocess
import sys

import pytest

from assay.compat.dataset import query
from assay.compat.probe import ProbeRequest, probe_and_record


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
