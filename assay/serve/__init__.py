"""Serving fixed-state models: a slot pool, continuous batching at bucketed decode widths, the cost of
compilation made visible, and `assay serve-bench`.

    from assay.serve import Engine, EngineConfig
    engine = Engine.from_checkpoint("zoo/gla", EngineConfig(max_seqs=8, buckets=(1, 2, 4, 8)))
    engine.warm_up(); engine.add_request("r1", tokens, max_tokens=16)
    while engine.has_unfinished(): events = engine.step()
"""

from assay.serve.accounting import EngineStats, StepRecord
from assay.serve.adapters import ADAPTERS, ModelAdapter, load_adapter
from assay.serve.engine import Engine, EngineConfig, QueueFull, TokenEvent, run_to_completion
from assay.serve.pool import SlotPool
from assay.serve.scheduler import DEFAULT_BUCKETS, decode_width, parse_buckets

__all__ = [
    "ADAPTERS",
    "DEFAULT_BUCKETS",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "ModelAdapter",
    "QueueFull",
    "SlotPool",
    "StepRecord",
    "TokenEvent",
    "decode_width",
    "load_adapter",
    "parse_buckets",
    "run_to_completion",
]
