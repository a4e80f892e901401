"""Session-wide fixtures: the tiny zoo is built once (about 20 s) and shared by every test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers.cli import run_assay, run_assay_process

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every test uses local checkpoints; a Hub call is a bug

@pytest.fixture(scope="session", autouse=True)
def isolated_user_cache(tmp_path_factory):
    """Tests never share the user's cache: XDG_CACHE_HOME (where the probe's reference cache lives by
    default) points into this session's temporary folder, for this process and every one it starts.
    Hugging Face's cache stays where it was."""
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    os.environ.setdefault("HF_HOME", str(user_cache / "huggingface"))
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory) -> Path:
    """The whole tiny zoo, built once per session. ASSAY_TEST_ZOO=DIR builds into (and reuses) DIR
    across sessions: build_zoo skips finished entries."""
    from assay.zoo import build_zoo

    folder = Path(os.environ["ASSAY_TEST_ZOO"]) if os.environ.get("ASSAY_TEST_ZOO") else tmp_path_factory.mktemp("zoo")
    build_zoo(folder, progress=False)
    return folder


@pytest.fixture
def assay_cli():
    """`assay ARGS` forked from the session's pre-imported CLI zygote (tests/helpers/cli.py)."""
    return run_assay


@pytest.fixture
def assay_process():
    """`python -m assay ARGS` as a real process: for tests whose point is the process (a signal, import time)."""
    return run_assay_process


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (the `real` extra) converted from its GGUF file once per session (about
    30 s), into the session's user cache, where the sharded probe's default judge finds it too.
    ASSAY_TEST_REAL=DIR converts into (and reuses) DIR across sessions, hard-linked into that cache.
    No test skips for lack of it: the test set-up installs the extra, and a missing package fails here
    with one line."""
    from assay.zoo.real import cached_smollm2, smollm2_cache_folder

    if os.environ.get("ASSAY_TEST_REAL"):
        kept = cached_smollm2(root=os.environ["ASSAY_TEST_REAL"])
        cache = smollm2_cache_folder()
        if not cache.exists():
            shutil.copytree(kept, cache, copy_function=_link_or_copy)
    return cached_smollm2()


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)
