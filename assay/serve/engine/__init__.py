"""The engine layer: requests in, tokens out. The engine (engine.py) runs each step the scheduler plans
(scheduler.py), samples each row's next token (sampling.py) and keeps the accounting (stats.py); loop.py is
the thread that steps it behind the HTTP server. The model step itself is the runner's (assay.serve.runner).

Names load on first use: the torch-free config is read by `assay serve` before torch is imported.
"""

from __future__ import annotations

from assay.core.lazy import lazy_exports

_EXPORTS = {
    "EngineConfig": "assay.serve.engine.config",
    "QueueFull": "assay.serve.engine.config",
    "TokenEvent": "assay.serve.engine.config",
    "Engine": "assay.serve.engine.engine",
    "run_to_completion": "assay.serve.engine.engine",
    "EngineFailed": "assay.serve.engine.loop",
    "EngineLoop": "assay.serve.engine.loop",
    "SamplingParams": "assay.serve.engine.sampling",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
