"""The runner layer: the model step. The slot model of a checkpoint, found through the architecture registry
and loaded in its dtype (weights.py), the slot pool its state lives in (pool.py, sizing.py), and the decode
step, eager or compiled per width (compiled_decode.py).

Names load on first use: the torch-free dtype names are read by `assay serve` before torch is imported.
"""

from __future__ import annotations

from assay.core.lazy import lazy_exports

_EXPORTS = {
    "CompiledDecode": "assay.serve.runner.compiled_decode",
    "SlotPool": "assay.serve.runner.pool",
    "load_slot_model": "assay.serve.runner.weights",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
