"""The software/hardware fingerprint a result holds for, and its stable `stack_id`.

A result is only valid for the stack that produced it (compat.md): the id is derived from the
versions that can change a result, so two machines with the same stack write the same Parquet file.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata

import torch

from assay.core.device import describe_device

# Libraries whose version can change a generated token or a loss.
RESULT_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "accelerate", "numpy")
# Libraries recorded for reproduction but not part of the id (they do not touch the numbers).
RECORDED_LIBRARIES = ("pyarrow", "duckdb", "huggingface_hub", "typer", "rich")

# The compiler behind each compile backend: its packages' versions are part of the id.
BACKEND_COMPILERS = {
    "inductor": ("torch", "triton"),
    "neuron": ("neuronx-cc", "torch-neuronx", "libneuronxla"),
    "openxla": ("torch-xla",),
    "eager": (),
    "aot_eager": (),
}
# Vendor packages found by name fragment: recorded whatever the backend, since they can patch torch.
VENDOR_NAME_FRAGMENTS = ("neuron", "habana", "intel-extension-for-pytorch", "torch-xla", "torch-npu", "torch_npu", "ipex", "rocm", "triton")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def vendor_packages() -> dict[str, str]:
    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if any(fragment in name for fragment in VENDOR_NAME_FRAGMENTS):
            found[name] = dist.version
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Stack:
    python: str
    libraries: dict[str, str | None]
    backend: str
    compiler: dict[str, str | None]
    vendor_packages: dict[str, str]
    device_type: str
    device_name: str
    device_count: int
    os: str
    extra: dict[str, str | None] = field(default_factory=dict)

    def id_fields(self) -> dict:
        """The fields that can change a result; everything else is context."""
        return {
            "python": ".".join(self.python.split(".")[:2]),
            "libraries": {name: self.libraries.get(name) for name in RESULT_LIBRARIES},
            "backend": self.backend,
            "compiler": self.compiler,
            "vendor_packages": self.vendor_packages,
            "device_type": self.device_type,
            "device_name": self.device_name,
        }

    @property
    def stack_id(self) -> str:
        """Readable prefix + hash: `cpu-inductor-torch2.13.0-tf5.24.0-1a2b3c4d` (safe as a file name)."""
        digest = hashlib.sha256(json.dumps(self.id_fields(), sort_keys=True).encode()).hexdigest()[:8]
        torch_version = (self.libraries.get("torch") or "none").split("+")[0]
        tf_version = self.libraries.get("transformers") or "none"
        return f"{self.device_type}-{self.backend}-torch{torch_version}-tf{tf_version}-{digest}"

    @property
    def label(self) -> str:
        compiler = ", ".join(f"{k} {v}" for k, v in self.compiler.items() if v) or "no compiler"
        return (
            f"{self.device_name} x{self.device_count} ({self.device_type}), {self.backend} [{compiler}], "
            f"torch {self.libraries.get('torch')}, transformers {self.libraries.get('transformers')}, "
            f"Python {self.python}"
        )

    def as_dict(self) -> dict:
        record = asdict(self)
        record["stack_id"] = self.stack_id
        record["label"] = self.label
        return record

    def versions_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)


def collect_stack(device_type: str = "cpu", backend: str = "inductor") -> Stack:
    libraries = {name: package_version(name) for name in RESULT_LIBRARIES + RECORDED_LIBRARIES}
    libraries["torch"] = torch.__version__
    compiler_packages = BACKEND_COMPILERS.get(backend, (backend,))
    compiler = {name: package_version(name) for name in compiler_packages}
    if "torch" in compiler:
        compiler["torch"] = torch.__version__
    device = describe_device(device_type)
    return Stack(
        python=platform.python_version(),
        libraries=libraries,
        backend=backend,
        compiler=compiler,
        vendor_packages=vendor_packages(),
        device_type=device.type,
        device_name=device.name,
        device_count=device.count,
        os=f"{platform.system()} {platform.release()} ({platform.machine()}), {sys.platform}",
    )
