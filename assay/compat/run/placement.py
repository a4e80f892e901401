"""Where a probe runs: how many devices it needs, and a pool that hands them out fairly.

compat.md: a model is loaded on the minimum number of devices that holds its weights. Weights are
measured from the checkpoint's safetensors (or its index) and scaled to the probe's dtype; a margin
covers activations, the static cache and the runtime.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

from assay.core.dtypes import DTYPE_BYTES
from assay.core.errors import AssayError

# Weights take most of the memory; generation of 32 tokens adds activations, the static cache and
# the compiler's workspace. 1.3x the weights has held for every zoo entry; a user can force --devices.
MEMORY_MARGIN = 1.3
BYTES_PER_ELEMENT = DTYPE_BYTES

# The environment variable that limits a process to some devices, per device type.
VISIBLE_DEVICES_ENV = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "neuron": "NEURON_RT_VISIBLE_CORES",
    "xpu": "ZE_AFFINITY_MASK",
    "hpu": "HABANA_VISIBLE_MODULES",
}


def weight_bytes(model_path: str, dtype: str) -> int | None:
    """Bytes of the checkpoint's weights in `dtype`, or None when unknown (a Hub id not downloaded)."""
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    stored = None
    if index.is_file():
        stored = json.loads(index.read_text()).get("metadata", {}).get("total_size")
    if stored is None:
        files = list(folder.glob("*.safetensors"))
        if not files:
            return None
        stored = sum(f.stat().st_size for f in files)
    stored_dtype_bytes = _stored_element_bytes(folder)
    return int(stored * BYTES_PER_ELEMENT[dtype] / stored_dtype_bytes)


def _stored_element_bytes(folder: Path) -> int:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return 4
    dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
    return BYTES_PER_ELEMENT.get(str(dtype), 4)


def devices_needed(model_path: str, dtype: str, device_memory_bytes: int, max_devices: int) -> int:
    weights = weight_bytes(model_path, dtype)
    if weights is None:
        return 1
    needed = max(1, math.ceil(weights * MEMORY_MARGIN / device_memory_bytes))
    if needed > max_devices:
        raise AssayError(f"{model_path} needs {needed} devices of {device_memory_bytes / 2**30:.1f} GiB; --max-devices is {max_devices}")
    # Tensor parallelism splits heads evenly: round up to a power of two.
    return 1 << (needed - 1).bit_length()


class DevicePool:
    """Hands out device indices; a probe that needs k waits until k are free (first come, first served)."""

    def __init__(self, count: int):
        self.free = list(range(count))
        self.count = count
        self._condition = threading.Condition()

    def acquire(self, k: int) -> list[int]:
        if k > self.count:
            raise AssayError(f"a probe needs {k} devices but the pool has {self.count}")
        with self._condition:
            self._condition.wait_for(lambda: len(self.free) >= k)
            taken, self.free = self.free[:k], self.free[k:]
            return taken

    def release(self, indices: list[int]) -> None:
        with self._condition:
            self.free = sorted(self.free + indices)
            self._condition.notify_all()


def child_env(device_type: str, indices: list[int], cpu_threads: int) -> dict[str, str]:
    """What a probe process may use: its devices, and its share of the CPU cores."""
    env = {"OMP_NUM_THREADS": str(cpu_threads), "MKL_NUM_THREADS": str(cpu_threads)}
    variable = VISIBLE_DEVICES_ENV.get(device_type)
    if variable:
        env[variable] = ",".join(str(i) for i in indices)
    return env
