"""Custom operators in plain PyTorch and their references (gla.py: gated linear attention).

Public callers import them through `assay.ops`; this package holds the implementations.

The replacement registry (registry.py) swaps kernels into a native model by module name:
`apply_kernels(model, ["rope", "grouped_experts"], pattern="layers.[0-3].*")`; rope.py,
grouped_experts.py and attention.py hold those kernels (custom operators, namespace "assay"),
triton_*.py their CUDA implementations, check.py and bench.py `assay kernels check|bench`.
"""

from assay.kernels.registry import KERNELS, Kernel, Replacement, apply_kernels, register_kernel

__all__ = ["KERNELS", "Kernel", "Replacement", "apply_kernels", "register_kernel"]
