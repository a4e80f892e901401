"""Session-wide fixtures: the tiny zoo is built once (about 20 s) and shared by every test, and by every
pytest-xdist worker (`scripts/test.sh` runs the suite in several); how the files are shared out to workers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from helpers.cli import run_assay, run_assay_process

# Set before torch is imported, here and in every process a test starts. The suite runs several workers on few cores
# (scripts/test.sh): one intra-op thread per torch process spares spinning OpenMP threads that wait for a
# core, and inductor compiles in the process that asks instead of starting a pool of compile workers (each
# one imports torch) in every process that compiles. A test that is about threads sets its own count.
# Measured on 2 cores, 3 workers, 8 compile-heavy files: 552 s -> 450 s, and 956 -> 769 CPU-seconds.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every test uses local checkpoints; a Hub call is a bug
# glibc's malloc, read at each process's start (so here, before pytest-xdist starts its workers): blocks under
# 16 MiB come from the heap, and up to 128 MiB of freed heap is kept instead of returned to the kernel at every
# free. A training loop's temporaries are then reused, not faulted in again page by page: GLA's MQAR training,
# 150 steps on one thread, 32.5 s -> 26.2 s (sys 5.3 -> 0.4 s, 2.4M -> 0.1M page faults). What a test computes
# is unchanged.
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(16 * 2**20))
os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(128 * 2**20))
# torch's CPU allocator asks for transparent huge pages (madvise) for tensors of 2 MiB and more: one page fault per
# 2 MiB instead of 512. Measured on the real-model training and probe tests: page faults 2.35M -> 1.23M, system
# time 12.6 -> 9.9 s of 43 CPU-seconds. Values computed are unchanged; only how memory is mapped.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

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

    folder = Path(os.environ["ASSAY_TEST_ZOO"]) if os.environ.get("ASSAY_TEST_ZOO") else _shared_folder(tmp_path_factory) / "zoo"
    with FileLock(f"{folder}.lock"):  # the first worker builds it, the others wait and find every entry finished
        build_zoo(folder, progress=False)
    return folder


def _shared_folder(tmp_path_factory) -> Path:
    """The session's temporary folder, or under pytest-xdist the one all its workers' folders are in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


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

    # Each xdist worker has its own user cache (isolated_user_cache); the conversion is done once for all.
    kept_root = os.environ.get("ASSAY_TEST_REAL") or (os.environ.get("PYTEST_XDIST_WORKER") and _shared_folder(tmp_path_factory) / "real")
    if kept_root:
        with FileLock(f"{kept_root}.lock"):
            kept = cached_smollm2(root=kept_root)
        cache = smollm2_cache_folder()
        if not cache.exists():
            shutil.copytree(kept, cache, copy_function=_link_or_copy)
    return cached_smollm2()


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)



# How the suite is shared out to pytest-xdist workers (scripts/test.sh runs it with `-n 3 --dist loadfile`).
# A file's tests go to one worker, so its module fixtures (a started server, a trained run) are made once;
# the files that start a Ray cluster share one worker, one cluster at a time (two at once on two cores
# time out their actors' start).
RAY_FILES = ("serve/test_ray_serve.py", "serve/test_ray_replica_loss.py", "compat/test_ray_sweep.py")
# The files that took longest in a profile of the whole suite (over a minute of a worker's time each),
# longest first: they start first, so no worker is left running one of them alone at the end.
LONGEST_FIRST = (
    "compat/test_real_model.py", "recall/test_learning.py", "test_readme_tour.py", *RAY_FILES, "compat/test_eval.py",
    "compat/test_sharded.py", "ops/test_gla.py", "serve/test_guided_decode.py", "compat/test_sweep.py",
    "train/test_crash_resume.py", "compat/test_triage.py", "serve/test_structured_real.py", "compat/test_probe.py",
    "app/test_browser.py", "train/test_distributed.py", "selftest/test_selftest.py", "serve/test_soak.py",
    "kernels/test_triton_interpreter.py", "compat/test_zygote.py", "serve/test_real_serving.py", "serve/test_lm_eval.py",
)


def _relative(path: Path) -> str:
    root = Path(__file__).parent
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name


def pytest_collection_modifyitems(config, items):
    """The longest files first; the rest, and the tests inside each file, keep their order (a stable sort)."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_relative(item.path), len(rank)))


class FileScheduling:
    """pytest-xdist's file-by-file scheduling, with the Ray files as one unit and the collection's order kept."""

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config, log):
        from xdist.scheduler import LoadScopeScheduling

        if config.getvalue("dist") != "loadfile":
            return None

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::", 1)[0]
                return "ray" if path.removeprefix("tests/") in RAY_FILES else path

        config.option.loadscopereorder = False  # xdist would put the files with most tests first instead
        return Scheduling(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(FileScheduling(), "assay-file-scheduling")
