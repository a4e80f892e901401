"""Training checkpoints with torch.distributed.checkpoint (DCP), written atomically.

Layout under --checkpoint-dir:
    step-000010/            a complete checkpoint: DCP files (.metadata, __*_*.distcp), trainer_state.json,
                            rng-rank{r}.pt (each rank's generator states)
    .step-000020.tmp/       one being written; renamed to step-000020 only once every rank has finished

A folder named step-N is therefore always complete: a run killed mid-write leaves the previous one,
and the newest `keep` checkpoints are kept. DCP stores each rank's shard of a DTensor (FSDP, TP), so a
checkpoint can be resumed under another layout of the same model.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import warnings
from pathlib import Path

import torch

from assay.core.errors import AssayError
from assay.core.files import atomic_write_json
from assay.train.distributed import Layout, barrier, broadcast_object

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), path) for path in folder.iterdir() if (m := _STEP_DIR.match(path.name)) and (path / STATE_FILE).is_file()]
    return [path for _, path in sorted(found)]


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
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    folder: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict,
    layout: Layout, keep: int = 2,
) -> Path:
    """Every rank calls this (DCP is collective). Returns the finished step folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(folder)
    final = folder / step_dir_name(step)
    staging = folder / f".{final.name}.tmp"
    if layout.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)  # left by a run killed while writing this step
        staging.mkdir()
    barrier(layout)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    with _single_process_is_intended():
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(staging), no_dist=not layout.distributed)
    torch.save(_rng_state(), staging / f"rng-rank{layout.rank}.pt")
    barrier(layout)
    if layout.is_main:
        atomic_write_json(staging / STATE_FILE, trainer_state | {"step": step})
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
        for old in complete_checkpoints(folder)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(layout)
    return final


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, layout: Layout) -> dict:
    """Restore model, optimizer and this rank's RNG in place; returns trainer_state.json's contents."""
    import torch.distributed.checkpoint as dcp
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
    except Exception as error:  # DCP raises CheckpointException (a wrapper of each rank's failure)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise AssayError(f"cannot load checkpoint {path} into this model: {first_line}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng_file = path / f"rng-rank{layout.rank}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=True))
    return trainer_state


def resume_point(folder: str | Path | None, layout: Layout) -> Path:
    """The checkpoint every rank resumes from (rank 0 decides, so all ranks agree)."""
    if folder is None:
        raise AssayError("--resume needs --checkpoint-dir")
    chosen = broadcast_object(str(latest_checkpoint(folder) or ""), layout)
    if not chosen:
        raise AssayError(f"--resume: no complete checkpoint (step-N folder) in {folder}")
    return Path(chosen)
