"""Serving fixed-state models: a slot pool, continuous batching at bucketed decode widths, the cost of
compilation made visible, and `assay serve-bench`. Three layers, a request flowing one way: http/ (the
OpenAI-compatible API) -> engine/ (scheduler, sampling, accounting) -> runner/ (the model step).

    from assay.serve import Engine, EngineConfig
    engine = Engine.from_checkpoint("zoo/gla", EngineConfig(max_seqs=8, buckets=(1, 2, 4, 8)))
    engine.warm_up(); engine.add_request("r1", tokens, max_tokens=16)
    while engine.has_unfinished(): events = engine.step()
"""

from __future__ import annotations

from assay.core.lazy import lazy_exports

# Names load on first use: `assay --help` imports assay.serve.commands without importing torch.
_EXPORTS = {
    "Engine": "assay.serve.engine.engine",
    "run_to_completion": "assay.serve.engine.engine",
    "EngineConfig": "assay.serve.engine.config",
    "QueueFull": "assay.serve.engine.config",
    "TokenEvent": "assay.serve.engine.config",
    "SamplingParams": "assay.serve.engine.sampling",
    "EngineStats": "assay.serve.engine.stats",
    "StepRecord": "assay.serve.engine.stats",
    "SlotPool": "assay.serve.runner.pool",
    "load_slot_model": "assay.serve.runner.weights",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
