"""Public functional operators; thin re-exports of the implementations in `assay.kernels`."""

from assay.kernels.gla import gla_chunk, gla_recurrent, gla_step

__all__ = ["gla_chunk", "gla_recurrent", "gla_step"]
