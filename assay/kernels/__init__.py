"""Custom operators in plain PyTorch and their references (gla.py: gated linear attention).

Public callers import them through `assay.ops`; this package holds the implementations.

The replacement registry (registry.py) swaps kernels into a native model by module name:
`apply_kernels(model, ["rope", "grouped_experts"], pattern="layers.[0-3].*")`; rope.py,
grouped_experts.py and attention.py hold those kernels (custom operators, namespace "assay"),
triton_*.py their CUDA implementations, check.py and bench.py `assay kernels check|bench`.
"""

from assay.core.lazy import lazy_exports

# Names load on first use: `assay --help` imports assay.kernels.commands without importing torch.
_EXPORTS = {name: "assay.kernels.registry" for name in ("KERNELS", "Kernel", "Replacement", "apply_kernels", "register_kernel")}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
