"""The trainer: one loop for every model path (hf, native, native with kernels), its data, its
distributed layout (FSDP2 x TP on one DeviceMesh), DCP checkpoints and Hugging Face export.

    from assay.train import TrainRequest, train
    result = train(TrainRequest(model="zoo/qwen3", path="native", steps=10))

Names load on first use: `assay --help` imports assay.train.commands without importing torch.
"""

from __future__ import annotations

from assay.core.lazy import lazy_exports

_EXPORTS = {
    "DataSource": "assay.train.data",
    "PackedBatches": "assay.train.data",
    "OptimConfig": "assay.train.optimization",
    "plot_metrics": "assay.train.plot",
    "CheckInit": "assay.train.init_check",
    "CheckpointConfig": "assay.train.config",
    "CompileConfig": "assay.train.config",
    "KernelsConfig": "assay.train.config",
    "MetricsConfig": "assay.train.config",
    "ModelConfig": "assay.train.config",
    "ParallelismConfig": "assay.train.config",
    "TrainingConfig": "assay.train.config",
    "TrainRequest": "assay.train.config",
    "TrainResult": "assay.train.report",
    "Trainer": "assay.train.trainer",
    "TrainingDiverged": "assay.train.trainer",
    "train": "assay.train.trainer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
