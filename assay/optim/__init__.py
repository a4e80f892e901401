"""Optimizers: Muon for hidden matrices with AdamW for the rest, on one device or FSDP2-sharded."""

from assay.optim.distributed_muon import CommStats
from assay.optim.muon import Muon, muon_param_groups, split_params, zeropower_via_newtonschulz

__all__ = ["CommStats", "Muon", "muon_param_groups", "split_params", "zeropower_via_newtonschulz"]
