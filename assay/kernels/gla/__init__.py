"""Gated linear attention (GLA) in plain PyTorch: the step-by-step reference, one decode step, and the
chunked form with its written-out backward.

    reference.py   gla_recurrent, gla_step, the input checks (shapes, chunk sizes)
    chunk.py       gla_chunk: segments, the autograd Function, the choice of form (eager and compiled)
    factorised.py  one matmul per chunk, for gates that keep a chunk's decay in range
    sub_chunk.py   halves of halves, every exponent bounded: any gate, no cliff
    scan.py        chunk views, batched matmuls, the state scans, cumulative gates

Public: assay.ops.gla_chunk / gla_recurrent / gla_step re-export these (docs/gla.md).
"""

from assay.kernels.gla.chunk import SEGMENT_TOKENS, gla_chunk
from assay.kernels.gla.factorised import FACTORISED_LOG_RANGE
from assay.kernels.gla.reference import (
    CHUNK_MULTIPLE,
    MAX_CHUNK,
    MIN_CHUNK,
    gla_recurrent,
    gla_step,
)
from assay.kernels.gla.sub_chunk import LIMITS, SubChunkPlan, plan

__all__ = [
    "CHUNK_MULTIPLE", "FACTORISED_LOG_RANGE", "LIMITS", "MAX_CHUNK", "MIN_CHUNK", "SEGMENT_TOKENS", "SubChunkPlan",
    "gla_chunk", "gla_recurrent", "gla_step", "plan",
]
