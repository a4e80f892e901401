"""A full disk: every writer that ends in a file or folder under a final name (training checkpoint,
--export-hf, the results Parquet, publish, export-space, zoo build, convert gguf) is run in a child
process whose RLIMIT_FSIZE is smaller than what it must write, so the write fails with EFBIG (Python
ignores SIGXFSZ) as it would with ENOSPC on a full disk. Each answers one line and exit 2, the previous
good file or folder stays byte for byte, and no partial file is left under a final name or beside it.

RLIMIT_FSIZE rather than a small tmpfs: it needs no mount privilege, so CI runs it as well."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assay.core.errors import AssayError
from assay.core.files import append_jsonl, disk_full_error, reporting_disk_full

REPO = Path(__file__).resolve().parents[2]
LIMIT = 128 * 1024  # smaller than the zoo qwen3's weights (561 KB) and its checkpoint; larger than any log or JSON line


def run_limited(*args: str, limit: int = LIMIT, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m assay ARGS` with no file larger than `limit` bytes allowed."""
    from helpers.cli import run_assay

    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return run_assay(*args, timeout=timeout, env=env, cwd=REPO, file_size_limit=limit)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones included) and its SHA-256."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.rglob("*")) if path.is_file()}


def assert_one_line_exit_2(completed: subprocess.CompletedProcess, *fragments: str) -> None:
    from helpers.cli import refusal_line

    error = refusal_line(completed)  # progress lines (a resumed run says where it resumed) may come first
    assert "file too large" in error, error
    for fragment in fragments:
        assert fragment in error, error


def leftovers(folder: Path) -> list[str]:
    """Staging folders and temporaries of this module's writers beside the targets."""
    return sorted(path.name for path in folder.iterdir() if path.name.startswith(".") and path.name.endswith((".tmp", ".staging", ".retired")))


def test_disk_full_errors_are_recognised_through_wrappers():
    assert disk_full_error(OSError(errno.ENOSPC, "No space left on device")).errno == errno.ENOSPC
    try:
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError as inner:
            raise RuntimeError("write failed") from inner
    except RuntimeError as wrapped:
        assert disk_full_error(wrapped).errno == errno.EFBIG
    assert disk_full_error(OSError("IOError: [Errno 28] No space left on device")) == "No space left on device"  # pyarrow's text
    assert disk_full_error(OSError(errno.EACCES, "Permission denied")) is None
    with pytest.raises(AssayError, match="cannot write x: no space left on device; y is kept"):
        with reporting_disk_full("x", kept="y is kept"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PermissionError):
        with reporting_disk_full("x"):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_a_jsonl_line_that_does_not_fit_is_cut_back_off(tmp_path):
    """A metrics line that cannot be written whole leaves the file as it was (no half line to misread on resume)."""
    metrics = tmp_path / "run.jsonl"
    append_jsonl(metrics, {"step": 1})
    before = metrics.read_bytes()
    script = ("import resource, signal, sys; from assay.core.files import append_jsonl; "
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 10}, {len(before) + 10})); "
              f"append_jsonl(sys.argv[1], {{'step': 2, 'note': 'x' * 100}})")
    completed = subprocess.run([sys.executable, "-c", script, str(metrics)], capture_output=True, text=True,
                               env=os.environ | {"PYTHONPATH": str(REPO)})
    assert completed.returncode != 0 and "File too large" in completed.stderr
    assert metrics.read_bytes() == before


@pytest.mark.slow
def test_training_checkpoint_and_export_on_a_full_disk_keep_the_previous_ones(zoo_dir, assay_cli, tmp_path):
    model, checkpoints, export = str(zoo_dir / "qwen3"), tmp_path / "ckpt", tmp_path / "export"
    common = ("train", "--model", model, "--seq-len", "32", "--batch", "2", "--json")
    good = assay_cli(*common, "--steps", "3", "--checkpoint-dir", str(checkpoints), "--export-hf", str(export))
    assert good.returncode == 0, good.stderr[-3000:]
    before = snapshot(tmp_path)

    full = run_limited(*common, "--steps", "6", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3", "--resume")
    assert_one_line_exit_2(full, f"cannot write checkpoint {checkpoints / 'step-000006'}",
                           f"the previous checkpoint {checkpoints / 'step-000003'} is kept")
    full = run_limited(*common, "--steps", "1", "--export-hf", str(export))
    assert_one_line_exit_2(full, f"cannot write the --export-hf checkpoint {export}", f"{export} is as it was")
    assert snapshot(tmp_path) == before  # step-3 and the export byte for byte; no step-6, no staging folder
    assert leftovers(tmp_path) == [] and leftovers(checkpoints) == []


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    """A small results folder (fits the limit) and a large one (a row whose error text fills 200 KB of Parquet)."""
    from assay.compat.results.dataset import write_row
    from assay.compat.results.schema import empty_row

    def row(model: str, error: str) -> dict:
        return empty_row() | {"model": model, "status": "FAIL_RUN", "error": error, "device": "cpu", "backend": "eager",
                              "dtype": "float32", "stack_id": "cpu-eager-test-00000000", "versions": "{}"}

    folders = {"small": tmp_path_factory.mktemp("small-results"), "large": tmp_path_factory.mktemp("large-results")}
    write_row(folders["small"], row("a", "short"))
    write_row(folders["large"], row("b", os.urandom(200_000).hex()))  # random: zstd cannot shrink it under the limit
    return folders


@pytest.mark.slow
def test_results_parquet_on_a_full_disk_keeps_the_previous_file(results, assay_cli, tmp_path):
    out = tmp_path / "merged"
    assert assay_cli("merge", str(out), str(results["small"])).returncode == 0
    before = snapshot(out)
    full = run_limited("merge", str(out), str(results["large"]))
    parquet = out / "cpu-eager-test-00000000.parquet"
    assert_one_line_exit_2(full, f"cannot write results file {parquet}", f"{parquet} is as it was")
    assert snapshot(out) == before and leftovers(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["publish", "export-space"])
def test_publish_and_export_space_on_a_full_disk_keep_the_previous_folder(results, assay_cli, tmp_path, command):
    out = tmp_path / "out"
    good = assay_cli(command, str(out), "--results", str(results["small"]))
    assert good.returncode == 0, good.stderr[-3000:]
    before = snapshot(out)
    full = run_limited(command, str(out), "--results", str(results["large"]))
    assert_one_line_exit_2(full, f"writing {tmp_path}")  # the file it was writing, in the staging folder beside OUT
    assert snapshot(out) == before and leftovers(tmp_path) == []


@pytest.mark.slow
def test_zoo_build_on_a_full_disk_keeps_the_previous_entry(zoo_dir, tmp_path):
    zoo = tmp_path / "zoo"
    shutil.copytree(zoo_dir / "qwen3", zoo / "qwen3")
    before = snapshot(zoo)
    full = run_limited("zoo", "build", str(zoo), "--only", "qwen3", "--force", "--json")
    assert_one_line_exit_2(full, f"cannot write zoo entry {zoo / 'qwen3'}", f"{zoo / 'qwen3'} is as it was")
    assert snapshot(zoo) == before and leftovers(zoo) == []


@pytest.mark.slow
def test_convert_gguf_on_a_full_disk_writes_nothing(tmp_path):
    from assay.zoo.real import smollm2_gguf_path

    out = tmp_path / "smollm2"
    full = run_limited("convert", "gguf", str(smollm2_gguf_path()), str(out), "--json", limit=1 << 20)
    assert_one_line_exit_2(full, f"cannot write the conversion {out}", f"nothing written at {out}")
    assert not out.exists() and leftovers(tmp_path) == []
