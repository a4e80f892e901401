"""Devices and compile backends chosen by name; synchronisation and peak memory per device type.

Nothing in assay assumes CUDA: `cpu` here, `cuda`, `neuron`, `xpu`, `mps` elsewhere, each through
the `torch.<type>` module that its PyTorch backend registers.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass

import torch

from assay.core.errors import AssayError

KNOWN_DEVICE_TYPES = ("cpu", "cuda", "neuron", "xpu", "mps", "hpu", "npu", "xla", "meta")

# Vendor backends register themselves with dynamo when their package is imported; a name in this
# table is imported on demand so that `--backend neuron` works without the user importing it first.
VENDOR_BACKEND_MODULES = {
    "neuron": ("torch_neuronx",),
    "openxla": ("torch_xla",),
    "hpu_backend": ("habana_frameworks.torch",),
    "ipex": ("intel_extension_for_pytorch",),
}


def device_module(device_type: str):
    """The `torch.<type>` module of a device type (torch.cuda, torch.xpu, torch.neuron, ...), or None."""
    return getattr(torch, device_type, None)


def resolve_device(name: str) -> torch.device:
    """Parse and check a device name; an unknown or absent device is an AssayError."""
    device_type = str(name).split(":")[0]
    if device_type in VENDOR_BACKEND_MODULES:
        _import_vendor(device_type)  # a vendor's package registers its device type on import
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        if device_type in VENDOR_BACKEND_MODULES:
            raise AssayError(
                f"device {name!r} needs {VENDOR_BACKEND_MODULES[device_type][0]}, which is not installed"
            ) from None
        raise AssayError(f"unknown device {name!r} (expected cpu, cuda, neuron, xpu, mps, ... with an optional :index)") from None
    if device.type == "cpu":
        return device
    if device.type == "meta":
        raise AssayError("device 'meta' holds no data and cannot run a model")
    module = device_module(device.type)
    available = getattr(module, "is_available", None) if module is not None else None
    if available is None or not available():
        raise AssayError(f"device {name!r} is not available on this machine (torch {torch.__version__})")
    count = device_count(device.type)
    if device.index is not None and device.index >= count:
        raise AssayError(f"device {name!r} does not exist: this machine has {count} {device.type} device(s)")
    return device


def device_count(device_type: str) -> int:
    if device_type == "cpu":
        return 1
    module = device_module(device_type)
    count = getattr(module, "device_count", None)
    return int(count()) if count else 0


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cpu":
        import platform

        try:
            with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
                for line in cpuinfo:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    module = device_module(device.type)
    get_name = getattr(module, "get_device_name", None)
    try:
        return str(get_name(device)) if get_name else device.type
    except Exception:  # some backends cannot name a device before it is initialised
        return device.type


def list_backends() -> list[str]:
    import torch._dynamo

    names = set(torch._dynamo.list_backends(exclude_tags=()))
    return sorted(names | set(VENDOR_BACKEND_MODULES))


def resolve_backend(name: str) -> str:
    """Check a torch.compile backend name; vendor backends are imported so they register."""
    import torch._dynamo

    if name in torch._dynamo.list_backends(exclude_tags=()):
        return name
    if name in VENDOR_BACKEND_MODULES:
        _import_vendor(name)
        if name in torch._dynamo.list_backends(exclude_tags=()):
            return name
        raise AssayError(f"compile backend {name!r} needs {VENDOR_BACKEND_MODULES[name][0]}, which is not installed")
    known = ", ".join(b for b in sorted(torch._dynamo.list_backends(exclude_tags=())) if "TESTING" not in b and "minifier" not in b)
    raise AssayError(f"unknown compile backend {name!r} (known here: {known})")


def _import_vendor(name: str) -> None:
    for module in VENDOR_BACKEND_MODULES.get(name, ()):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def synchronize(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cpu":
        return
    sync = getattr(device_module(device.type), "synchronize", None)
    if sync:
        sync()


def host_rss_bytes() -> int:
    import psutil

    return int(psutil.Process(os.getpid()).memory_info().rss)


class PeakMemory:
    """Peak memory over a region: the device allocator's peak, or sampled host RSS on CPU.

    with PeakMemory(device) as meter: ...; meter.peak_bytes
    On CPU a background thread samples this process's resident set every `interval_s`, since the
    CPU allocator keeps no peak counter that can be reset.
    """

    def __init__(self, device: torch.device | str, interval_s: float = 0.005):
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def kind(self) -> str:
        return "host_rss" if self.device.type == "cpu" else f"{self.device.type}_allocated"

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cpu":
            self.peak_bytes = host_rss_bytes()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        else:
            reset = getattr(device_module(self.device.type), "reset_peak_memory_stats", None)
            if reset:
                reset(self.device)
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, host_rss_bytes())
            time.sleep(self.interval_s)

    def read(self) -> int:
        if self.device.type == "cpu":
            return max(self.peak_bytes, host_rss_bytes())
        peak = getattr(device_module(self.device.type), "max_memory_allocated", None)
        return int(peak(self.device)) if peak else 0

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self.peak_bytes = self.read()


def memory_in_use_bytes(device: torch.device | str) -> int:
    """Memory held now: device allocator bytes, or host RSS on CPU (what training logs show per step)."""
    device = torch.device(device)
    if device.type == "cpu":
        return host_rss_bytes()
    allocated = getattr(device_module(device.type), "memory_allocated", None)
    return int(allocated(device)) if allocated else 0


def total_memory_bytes(device: torch.device | str) -> int:
    """Memory one device holds (host RAM on CPU), for placing a model on the fewest devices."""
    device = torch.device(device)
    if device.type == "cpu":
        import psutil

        return int(psutil.virtual_memory().total)
    module = device_module(device.type)
    props = getattr(module, "get_device_properties", None)
    if props:
        return int(props(device).total_memory)
    raise AssayError(f"cannot read the memory of a {device.type} device; pass --device-memory")


def free_memory_bytes(device: torch.device | str) -> int | None:
    """Memory a new allocation can take now (host RAM available on CPU, the allocator's free bytes on a
    device); None where the device type cannot tell. For sizing what is allocated whole at start-up."""
    device = torch.device(device)
    if device.type == "cpu":
        import psutil

        return int(psutil.virtual_memory().available)
    mem_get_info = getattr(device_module(device.type), "mem_get_info", None)
    if mem_get_info is None:
        return None
    try:
        return int(mem_get_info(device)[0])
    except (RuntimeError, TypeError):
        return None


@dataclass(frozen=True)
class DeviceInfo:
    type: str
    name: str
    count: int


def describe_device(device_type: str) -> DeviceInfo:
    count = device_count(device_type) if device_type == "cpu" or device_module(device_type) else 0
    name = device_name(torch.device(device_type)) if count else "absent"
    return DeviceInfo(type=device_type, name=name, count=count)
