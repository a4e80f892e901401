"""`SubnormalCheck`: a dispatch mode that names every op whose floating output holds a subnormal number.

Subnormal (denormal) floats, 0 < |x| < torch.finfo(dtype).tiny, run through a slow microcode path on many
CPUs (on Intel Xeons a whole matmul or elementwise pass over such values is 5-50x slower), and the
flush-to-zero switch `torch.set_flush_denormal` only reaches the calling thread, not PyTorch's intra-op
workers. So the GLA kernels keep every intermediate normal or exactly zero by construction, and this mode
checks that on any CPU:

    with SubnormalCheck() as check:
        gla_chunk(q, k, v, g, chunk_size=64)[0].sum().backward()
    assert not check.found, check.report()

Every aten op that runs under the mode (forward and autograd's backward) has its floating outputs
inspected. Views are skipped (they show values an earlier op made, which that op was charged for), and so
are the allocations whose contents are undefined (`empty`, `empty_like`, `new_empty`, ...).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_aten = torch.ops.aten
# Uninitialised memory: whatever bits were there, subnormal patterns included; no op computed them.
_UNDEFINED = {_aten.empty, _aten.empty_like, _aten.new_empty, _aten.empty_strided, _aten.new_empty_strided, _aten.empty_permuted}


def count_subnormal(tensor: torch.Tensor) -> int:
    """How many entries of a floating tensor are subnormal (0 < |x| < the dtype's smallest normal)."""
    magnitude = tensor.detach().abs()
    return int(((magnitude > 0) & (magnitude < torch.finfo(tensor.dtype).tiny)).sum())


class SubnormalCheck(TorchDispatchMode):
    """found: {op name: subnormal values it wrote}, in the order the ops first made one."""

    def __init__(self):
        super().__init__()
        self.found: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket in _UNDEFINED:
            return out
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
                count = count_subnormal(tensor)
                if count:
                    self.found[str(func)] += count
        return out

    def report(self) -> str:
        return "subnormal outputs: " + ", ".join(f"{name} ({count} values)" for name, count in self.found.items())
