"""Training checkpoints with torch.distributed.checkpoint (DCP), committed atomically.

Layout under --checkpoint-dir:
    step-000010/            a complete checkpoint: DCP files (.metadata, __*_*.distcp), rng-rank{r}.pt (each
                            rank's generator states), and trainer_state.json, written last
    .step-000020.tmp/       one being written; renamed to step-000020 only once every rank has finished

The commit is the rename of the staging folder, after every file in it is fsynced, so a folder named
step-N is always complete: a run killed mid-write (SIGKILL, power cut) leaves the previous checkpoint
loadable, and the staging folder is named as incomplete and ignored at the next --resume (and replaced
when that step is written again). A write that runs out of disk is one line (AssayError), the staging
folder removed, the previous checkpoint kept; so does a SIGTERM (or Ctrl-C) inside DCP's save, which DCP
wraps in a CheckpointException: raised again as itself, it ends the command with its one line. The newest `keep` checkpoints are kept. DCP stores each
rank's shard of a DTensor (FSDP, TP), so a checkpoint can be resumed under another layout of the same model.

Only files this trainer wrote are read back: DCP's own format, JSON, and the RNG states through
torch.load(weights_only=True) (tensors, ints and tuples; no code can run).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from assay.core.errors import AssayError
from assay.core.files import atomic_write_json, fsync_dir, fsync_file, reporting_disk_full
from assay.train.crash_points import kill_point
from assay.train.distributed import Layout, barrier, broadcast_object

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_STAGING_DIR = re.compile(r"^\.step-(\d+)\.tmp$")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), path) for path in folder.iterdir() if (m := _STEP_DIR.match(path.name)) and (path / STATE_FILE).is_file()]
    return [path for _, path in sorted(found)]


def incomplete_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of checkpoint writes that never committed: staging folders, and step folders
    without trainer_state.json (copied by hand, or damaged). Oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        if (m := _STAGING_DIR.match(path.name)) or ((m := _STEP_DIR.match(path.name)) and not (path / STATE_FILE).is_file()):
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(folder: str | Path) -> Path | None:
    checkpoints = complete_checkpoints(folder)
    return checkpoints[-1] if checkpoints else None


@contextlib.contextmanager
def _single_process_is_intended():
    """DCP warns that it assumes one process whenever no process group exists; here that is the plan."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process")
        yield


def _rng_state() -> dict:
    """Every generator a step could draw from: torch (CPU and accelerator), Python's, NumPy's global one."""
    version, internal, gauss = random.getstate()
    state = {"cpu": torch.get_rng_state(), "python": [version, torch.tensor(internal, dtype=torch.int64), gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy

        name, keys, position, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [name, torch.from_numpy(keys.astype("int64")), position, has_gauss, cached]
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal.tolist()), gauss))
    if "numpy" in state:
        import numpy

        name, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy().astype("uint32"), position, has_gauss, cached))


def save_checkpoint(
    folder: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict,
    layout: Layout, keep: int = 2,
) -> Path:
    """Every rank calls this (DCP is collective). Returns the committed step folder."""
    folder = Path(folder)
    final = folder / step_dir_name(step)
    staging = folder / f".{final.name}.tmp"
    previous = latest_checkpoint(folder) if layout.is_main else None
    kept = f"the previous checkpoint {previous} is kept" if previous else "no checkpoint was written"
    try:
        with reporting_disk_full(f"checkpoint {final}", kept=kept):
            _write(staging, final, step, model, optimizer, trainer_state, layout)
    except BaseException as error:
        if layout.is_main:
            shutil.rmtree(staging, ignore_errors=True)  # a failed write leaves nothing behind (a killed one cannot clean)
        interrupted = _interruption(error)
        if interrupted is not None:
            raise interrupted from None
        raise
    if layout.is_main:
        for old in complete_checkpoints(folder)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(layout)
    return final


def _interruption(error: BaseException) -> BaseException | None:
    """The interruption (SIGTERM's Terminated, Ctrl-C's KeyboardInterrupt) that DCP caught inside its save
    or load and wrapped, with each rank's failure, into a CheckpointException, or that another error
    replaced while it unwound; None for any other error. Raised again as itself, the CLI ends the command with
    its one line and exit status (143, 130) instead of a CheckpointException's traceback."""
    from assay.core.cli import Terminated

    causes = [failure[0] if isinstance(failure, tuple) and failure else failure
              for failure in (getattr(error, "failures", None) or {}).values()]
    if isinstance(error, Exception):  # not DCP's wrapper (a BaseException): the error itself, e.g. from torch.save
        causes.append(error)
    for cause in causes:
        # The interruption may sit in a failure's context chain: SIGTERM inside torch.save's zip writer leaves
        # a half-written record, and the writer's __exit__ then raises a RuntimeError ("unexpected pos")
        # while the Terminated unwinds (seen once in a clean-clone CI run).
        seen = set()
        while isinstance(cause, BaseException) and id(cause) not in seen:
            if isinstance(cause, (Terminated, KeyboardInterrupt)):
                return cause
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
    return None


def _write(staging: Path, final: Path, step: int, model, optimizer, trainer_state: dict, layout: Layout) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if layout.is_main:
        staging.parent.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)  # left by a run killed while writing this step
        staging.mkdir()
    barrier(layout)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    with _single_process_is_intended():
        # DCP's FileSystemWriter fsyncs each file it writes (sync_files=True).
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(staging), no_dist=not layout.distributed)
    rng_file = staging / f"rng-rank{layout.rank}.pt"
    torch.save(_rng_state(), rng_file)
    fsync_file(rng_file)
    kill_point("checkpoint", step, layout.rank)  # test hook: shards on disk, nothing committed
    barrier(layout)
    if layout.is_main:
        atomic_write_json(staging / STATE_FILE, trainer_state | {"step": step})
        fsync_dir(staging)
        if final.exists():  # this step written before (a run restarted without --resume): swap, never a gap
            retired = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".retired", dir=final.parent))
            os.replace(final, retired)
            os.replace(staging, final)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, final)  # the commit
        fsync_dir(final.parent)


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, layout: Layout) -> dict:
    """Restore model, optimizer and this rank's RNG in place; returns trainer_state.json's contents."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    try:
        trainer_state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise AssayError(f"{path} is not a complete training checkpoint: {error}") from None
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        with _single_process_is_intended():
            dcp.load(state, checkpoint_id=str(path), no_dist=not layout.distributed)
    except (Exception, CheckpointException) as error:  # CheckpointException (a BaseException) wraps each rank's failure
        interrupted = _interruption(error)
        if interrupted is not None:
            raise interrupted from None
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise AssayError(f"cannot load checkpoint {path} into this model: {first_line}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng_file = path / f"rng-rank{layout.rank}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=True))
    return trainer_state


def resume_point(folder: str | Path | None, layout: Layout) -> Path:
    """The checkpoint every rank resumes from (rank 0 decides, so all ranks agree). A write that never
    committed, newer than it, is named on stderr as ignored."""
    if folder is None:
        raise AssayError("--resume needs --checkpoint-dir")
    chosen = broadcast_object(str(latest_checkpoint(folder) or ""), layout)
    if layout.is_main:
        chosen_step = int(_STEP_DIR.match(Path(chosen).name).group(1)) if chosen else 0
        for step, broken in incomplete_checkpoints(folder):
            if step > chosen_step:
                resuming = f"resuming from {Path(chosen).name}" if chosen else "no complete checkpoint to resume from"
                print(f"warning: checkpoint {step_dir_name(step)} is incomplete (killed while writing?): {broken} ignored; {resuming}",
                      file=sys.stderr, flush=True)
    if not chosen:
        raise AssayError(f"--resume: no complete checkpoint (step-N folder) in {folder}")
    return Path(chosen)
