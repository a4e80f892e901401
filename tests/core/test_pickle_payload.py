"""A checkpoint whose only weights file is a pickle with a code payload stays inert in every command that
takes a checkpoint: the probe records FAIL_LOAD, train (hf and native), serve and convert refuse it in
one line, and the payload (it would create a file) never runs. A control shows it does run when unpickled."""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.cli import refusal_line

PAYLOAD_FILE = "pytorch_model.bin"


class _CreatesAFile:
    """Unpickled, this calls open(path, "w"): the file's existence is the proof that the payload ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


@pytest.fixture
def payload_checkpoint(zoo_dir, tmp_path) -> tuple[Path, Path]:
    """(checkpoint folder, the file its payload would create): the zoo's qwen3 with its weights replaced by
    pytorch_model.bin, a torch.save zip whose pickle calls open() when loaded without weights_only."""
    folder, marker = tmp_path / "payload-model", tmp_path / "payload-ran"
    shutil.copytree(zoo_dir / "qwen3", folder, ignore=shutil.ignore_patterns("*.safetensors", "assay_zoo.json"))
    torch.save({"model.embed_tokens.weight": _CreatesAFile(marker)}, folder / PAYLOAD_FILE)
    return folder, marker


def test_the_payload_is_live(payload_checkpoint):
    """The control: an unrestricted unpickle runs the payload, so its absence below means something."""
    folder, marker = payload_checkpoint
    torch.load(folder / PAYLOAD_FILE, weights_only=False)
    assert marker.is_file()


def assert_refused(completed, fragment: str, marker: Path) -> None:
    error = refusal_line(completed)  # after `assay serve`'s "loading ..." line at most
    assert fragment in error, error
    assert not marker.exists(), "the pickle's payload ran"


@pytest.mark.slow
def test_probe_records_fail_load_and_runs_no_code(payload_checkpoint, assay_cli, tmp_path):
    folder, marker = payload_checkpoint
    completed = assay_cli("probe", str(folder), "--device", "cpu", "--backend", "eager", "--out", str(tmp_path / "results"), "--json")
    assert completed.returncode == 0, completed.stderr[-3000:]
    row = json.loads(completed.stdout)
    row = row[0] if isinstance(row, list) else row
    assert row["status"] == "FAIL_LOAD" and "Weights only load failed" in row["error"]
    assert not marker.exists(), "the pickle's payload ran"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["hf", "native"])
def test_train_refuses_a_pickle_checkpoint_in_one_line(payload_checkpoint, assay_cli, path):
    folder, marker = payload_checkpoint
    completed = assay_cli("train", "--model", str(folder), "--path", path, "--steps", "1", "--seq-len", "32")
    assert_refused(completed, "has neither model.safetensors nor model.safetensors.index.json", marker)


@pytest.mark.slow
def test_serve_refuses_a_pickle_checkpoint_in_one_line(payload_checkpoint, assay_cli):
    folder, marker = payload_checkpoint
    completed = assay_cli("serve", "--model", str(folder), "--port", "0")
    assert_refused(completed, "has neither model.safetensors nor model.safetensors.index.json", marker)


def test_convert_refuses_a_pickle_in_one_line(payload_checkpoint, assay_cli, tmp_path):
    folder, marker = payload_checkpoint
    completed = assay_cli("convert", "gguf", str(folder / PAYLOAD_FILE), str(tmp_path / "out"))
    assert_refused(completed, "is not a GGUF file", marker)
    assert not (tmp_path / "out").exists()
