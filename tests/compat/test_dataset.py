import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from assay.compat.results.dataset import MARKER, query, stack_file, write_row
from assay.compat.results.schema import COLUMNS, SCHEMA, SCHEMA_VERSION, empty_row

DESIGN_COLUMNS = [
    "model", "task", "architecture", "status", "error", "device", "backend", "num_devices", "stack_id", "versions",
    "run_py", "generated_tokens", "reference_tokens", "load_s", "compile_s", "total_s", "peak_memory_bytes",
]


def make_row(model: str, stack: str = "cpu-eager-test-00000000", status: str = "PASS", **extra) -> dict:
    return empty_row() | {
        "model": model, "status": status, "device": "cpu", "backend": "eager", "dtype": "float32", "stack_id": stack,
        "versions": json.dumps({"torch": "x"}), "generated_tokens": [1, 2, 3], "reference_tokens": [1, 2, 3],
    } | extra


def test_schema_has_the_design_columns_and_a_version():
    assert set(DESIGN_COLUMNS) <= set(COLUMNS)
    assert SCHEMA.metadata[b"assay_schema_version"] == str(SCHEMA_VERSION).encode()


def test_one_file_per_stack_named_after_it(tmp_path):
    write_row(tmp_path, make_row("a", stack="cpu-inductor-s1"))
    write_row(tmp_path, make_row("a", stack="cpu-aot_eager-s2"))
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == ["cpu-aot_eager-s2.parquet", "cpu-inductor-s1.parquet"]
    assert (tmp_path / MARKER).is_file()
    table = pq.read_table(stack_file(tmp_path, "cpu-inductor-s1"))
    assert table.schema.equals(SCHEMA, check_metadata=False)


def test_reprobing_a_model_replaces_its_row(tmp_path):
    write_row(tmp_path, make_row("a", status="FAIL_RUN"))
    write_row(tmp_path, make_row("b"))
    write_row(tmp_path, make_row("a", status="PASS"))
    rows = query(tmp_path)
    assert sorted((r["model"], r["status"]) for r in rows) == [("a", "PASS"), ("b", "PASS")]


def test_query_filters_by_stack_status_and_model(tmp_path):
    write_row(tmp_path, make_row("org/alpha", stack="cpu-inductor-s1"))
    write_row(tmp_path, make_row("org/beta", stack="cpu-inductor-s1", status="OOM"))
    write_row(tmp_path, make_row("org/alpha", stack="cpu-eager-s2", status="FAIL_LOAD"))
    assert {r["model"] for r in query(tmp_path, stack="cpu-inductor-s1")} == {"org/alpha", "org/beta"}
    assert [r["model"] for r in query(tmp_path, status="oom")] == ["org/beta"]
    assert {r["stack_id"] for r in query(tmp_path, model="ALPHA")} == {"cpu-inductor-s1", "cpu-eager-s2"}


WRITER = """
import sys, json
sys.path.insert(0, {tests!r})
from compat.test_dataset import make_row
from assay.compat.results.dataset import write_row
i = 0
while True:
    write_row({folder!r}, make_row(f"model-{{i}}", error="x" * 20000))
    print(i, flush=True)
    i += 1
"""


def test_kill_during_writes_loses_no_completed_row_and_leaves_no_partial_file(tmp_path):
    folder = tmp_path / "results"
    tests_dir = os.path.dirname(os.path.dirname(__file__))
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(tests=tests_dir, folder=str(folder))], stdout=subprocess.PIPE, text=True)
    completed = -1
    deadline = time.time() + 120
    while completed < 15 and time.time() < deadline:
        completed = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)  # most likely mid-write: each write rewrites a growing file
    writer.wait()
    rows = query(folder)  # the file on disk is a complete Parquet file
    names = {r["model"] for r in rows}
    assert {f"model-{i}" for i in range(completed + 1)} <= names  # every acknowledged row survived
    assert len(names) == len(rows)  # no duplicates
    write_row(folder, make_row("after-kill"))  # the next writer cleans what the killed one left
    assert not list(folder.glob(".*.tmp")), "a temporary file was left behind"
    assert len(query(folder)) == len(rows) + 1


def test_results_cli_table_and_json(tmp_path, assay_cli):
    write_row(tmp_path, make_row("org/alpha", stack="cpu-inductor-s1", stack_label="test stack"))
    write_row(tmp_path, make_row("org/beta", stack="cpu-inductor-s1", status="FAIL_LOAD", reason="bad weights", stack_label="test stack"))
    table = assay_cli("results", str(tmp_path))
    assert table.returncode == 0, table.stderr
    assert "cpu-inductor-s1: 1/2 PASS" in table.stdout and "bad weights" in table.stdout
    listed = json.loads(assay_cli("results", str(tmp_path), "--status", "FAIL_LOAD", "--json").stdout)
    assert [r["model"] for r in listed] == ["org/beta"]


def test_empty_results_folder_is_valid_and_empty(tmp_path, assay_cli):
    from assay.compat.results.dataset import init_results

    init_results(tmp_path)
    result = assay_cli("results", str(tmp_path), "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == []


@pytest.mark.parametrize("make_bad", ["missing", "plain_folder", "file"])
def test_results_refuses_a_folder_that_is_not_one(tmp_path, assay_cli, make_bad):
    target = tmp_path / "target"
    if make_bad == "plain_folder":
        target.mkdir()
        (target / "notes.txt").write_text("hello")
    elif make_bad == "file":
        target.write_text("hello")
    result = assay_cli("results", str(target))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "not a results folder" in result.stderr
