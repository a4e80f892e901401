"""A `recall train` run shared by the needle and CLI tests: tiny, trained for a few steps (not to learn)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli import run_assay


@pytest.fixture(scope="session")
def recall_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("recall")
    result = run_assay("recall", "train", "--out", str(out), "--arch", "gla,qwen3", "--pairs", "2,4,16", "--seq-len", "32",
                       "--steps", "6", "--keys", "32", "--filler", "16", "--eval-examples", "8", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return out
