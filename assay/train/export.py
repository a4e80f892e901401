"""--export-hf: the trained model as a Transformers checkpoint folder, gathered from every rank and written
by rank 0 into a staging folder that replaces the target whole (core.files.atomic_folder): a reader
finds the previous export or the new one, never a mix, and a failed write leaves the previous one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from assay.core.errors import AssayError
from assay.core.files import atomic_folder, reporting_disk_full

if TYPE_CHECKING:  # torch stays unimported until an export runs: the CLI checks the target first
    from assay.train.distributed import Layout
    from assay.train.model_paths import TrainModel

CONFIG_FILE = "config.json"


def check_export_target(out_dir: str | Path | None) -> None:
    """The target is replaced whole, so it must be new, empty, or a checkpoint folder (an earlier export):
    never a folder of other files that a typo would wipe out. Checked before any training."""
    if out_dir is None:
        return
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise AssayError(f"--export-hf {out_dir} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / CONFIG_FILE).is_file():
        raise AssayError(f"--export-hf {out_dir} is a folder of other files (no {CONFIG_FILE}): name a new or empty folder, or an earlier export")


def export_hf(loaded: TrainModel, out_dir: Path, layout: Layout) -> Path:
    """Gather the full weights (a collective under FSDP/TP) and write them from rank 0."""
    from assay.train import distributed

    if layout.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(loaded.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = {key: tensor.detach() for key, tensor in loaded.model.state_dict().items()}
    if layout.is_main:
        kept = f"{out_dir} is as it was" if Path(out_dir).exists() else f"nothing written at {out_dir}"
        with reporting_disk_full(f"the --export-hf checkpoint {out_dir}", kept=kept), atomic_folder(out_dir) as staging:
            loaded.export(staging, state)
    distributed.barrier(layout)
    return Path(out_dir)
