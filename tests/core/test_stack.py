import json

import pytest
import torch
import transformers

from assay.core.stack import collect_stack


def test_stack_id_is_stable_and_names_the_stack():
    first, second = collect_stack("cpu", "inductor"), collect_stack("cpu", "inductor")
    assert first.stack_id == second.stack_id
    assert first.stack_id.startswith("cpu-inductor-torch")
    assert f"tf{transformers.__version__}" in first.stack_id


def test_stack_id_changes_with_the_backend_and_its_compiler():
    assert collect_stack("cpu", "inductor").stack_id != collect_stack("cpu", "aot_eager").stack_id
    assert "torch" in collect_stack("cpu", "inductor").compiler  # inductor's compiler is torch (+ triton)


@pytest.mark.slow
def test_stack_json_lists_versions_device_and_os(assay_cli):
    result = assay_cli("stack", "--json", "--backend", "aot_eager")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["libraries"]["torch"] == torch.__version__
    assert record["libraries"]["transformers"] == transformers.__version__
    assert record["device_type"] == "cpu" and record["device_count"] == 1
    assert record["os"] and record["python"]
    assert record["stack_id"] == collect_stack("cpu", "aot_eager").stack_id
