"""Fixtures for the trainer tests: the three Qwen3 zoo entries they train, and torchrun in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import run_torchrun


@pytest.fixture(scope="session")
def train_zoo(zoo_dir) -> Path:
    """The session's zoo (tests/conftest.py): qwen3 (random weights), qwen3-moe, qwen3-pretrained, ..."""
    return zoo_dir


@pytest.fixture
def torchrun():
    return run_torchrun
