"""The probe's bottom layer: what a probe is asked to do, its plan (and the plan's JSON form), how a failure is named.

Everything else in the probe, and run/ above it (isolation, sweeps, the Ray executor), imports from here;
this module imports only torch (lazily) and the standard library.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# How allocators say "no memory" when they raise something other than MemoryError/OutOfMemoryError.
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")


@dataclass(frozen=True)
class ProbeRequest:
    model: str  # Hub id or local checkpoint folder
    device: str = "cpu"
    backend: str = "inductor"
    dtype: str = "float32"
    new_tokens: int = 32
    task: str | None = None  # inferred from the checkpoint when None
    skip_reason: str | None = None  # record a deliberate SKIPPED row instead of running
    devices: int = 1  # > 1: shard the model over this many devices, in processes the probe starts
    judge: str | None = None  # a causal LM that scores fluency (required when sharded without a reference)
    reference: bool = True  # compare with a single-device CPU eager run (skipped only when unaffordable)
    parallelism: str = "auto"  # sharded: "auto" (tensor where a TP plan exists, else expert), "tensor", "expert"
    # Where CPU eager references are cached (reference_cache.py): "auto" = $XDG_CACHE_HOME/assay/references
    # (~/.cache/...) as the probe process sees it, a folder, or None for no cache.
    reference_cache: str | None = "auto"
    # The reference run's dtype: None = the probe's own; "float64" as PyTorch's benchmark harness does,
    # so the logit drift columns measure the device's error rather than two float32 runs' difference.
    reference_dtype: str | None = None
    # lm-eval tasks to score on the device and on the CPU eager reference (evaluation.py): embedded task
    # names or absolute paths of lm-eval task YAML files, as eval_tasks.parse_eval_tasks resolved them.
    eval_tasks: tuple[str, ...] = ()
    # Score only each task's first N documents (lm-eval's --limit); None: every document.
    eval_limit: int | None = None


@dataclass(frozen=True)
class SweepRequest:
    models: list[str]
    out: Path
    probe: ProbeRequest = field(default_factory=lambda: ProbeRequest(model=""))  # options applied to each model
    workers: int = 1
    timeout: float = 600.0
    memory_limit_bytes: int | None = None
    force: bool = False
    executor: str = "local"  # "local" or "ray"
    cache_dir: Path | None = None  # compile caches for the probes (default: torch's own folder)
    max_devices: int = 1
    devices: int | None = None  # force this many devices per probe
    device_memory_bytes: int | None = None
    progress: bool = True
    # Each probe from a freshly started interpreter instead of a fork of the pre-imported zygote
    # (zygote.py): slower by the imports, for a plugin or device runtime that must start unforked.
    fresh_interpreter: bool = False


@dataclass
class ModelRef:
    """What a MODEL argument names: where from_pretrained loads it, and how results name it."""

    load_path: str
    name: str  # the dataset's `model`: Hub id, "assay-zoo/<entry>", or an absolute path
    config: dict = field(default_factory=dict)
    stands_in_for: str | None = None
    zoo_task: str | None = None
    damage: str | None = None  # the checkpoint's files are broken (config.json not JSON): a FAIL_LOAD row


@dataclass
class ProbePlan:
    """A checked request: what will be loaded, where, and the row it will fill in."""

    request: ProbeRequest
    ref: ModelRef
    task: str
    device: "torch.device"
    backend: str
    row: dict

    def to_json(self) -> str:
        """The plan as JSON: what a probe's child process runs, without planning again (no pickle crosses)."""
        return json.dumps({"request": asdict(self.request), "ref": asdict(self.ref), "task": self.task,
                           "device": str(self.device), "backend": self.backend, "row": self.row})

    @classmethod
    def from_json(cls, text: str) -> "ProbePlan":
        import torch

        fields = json.loads(text)
        request = fields["request"]
        return cls(ProbeRequest(**request | {"eval_tasks": tuple(request.get("eval_tasks") or ())}), ModelRef(**fields["ref"]),
                   fields["task"], torch.device(fields["device"]), fields["backend"], fields["row"])


def says_out_of_memory(text: str) -> bool:
    """Whether a dead process's stderr says it ran out of memory."""
    text = text.lower()
    return "memoryerror" in text or "memory allocation" in text or any(m in text for m in OOM_MESSAGES)


def classify_exception(exc: BaseException, phase: str) -> str:
    """Map an exception to a status. phase: "load", "compile" (first compiled call) or "run"."""
    import torch
    import torch._dynamo.exc as dynamo_exc

    # Compilers wrap what they hit (BackendCompilerFailed around a MemoryError): look down the chain.
    chain, cause = [], exc
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = getattr(cause, "inner_exception", None) or cause.__cause__ or cause.__context__
    for link in chain:
        message = str(link).lower()
        if isinstance(link, (torch.OutOfMemoryError, MemoryError)) or any(m in message for m in OOM_MESSAGES):
            return "OOM"
    if phase == "load":
        return "FAIL_LOAD"
    compile_errors = (dynamo_exc.BackendCompilerFailed, dynamo_exc.Unsupported, dynamo_exc.InternalTorchDynamoError)
    if isinstance(exc, compile_errors) or type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return "FAIL_COMPILE"
    return "FAIL_RUN"


def one_line(exc: BaseException) -> str:
    """An exception as the row's one-line reason."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:400] if text else ''}".rstrip(": ")
