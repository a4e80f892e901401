"""`assay selftest` (and scripts/device_check.sh): one prepared check of a device, part by part.

Each part is the real `assay` command (probe, kernels check, train, serve-bench) or a Python entry
(gla_check), run as its own process with its own time limit; a part that fails or times out is
recorded and the rest still run. It sits above compat, train and serve (like app) and reaches them
only through their commands. docs/device_check.md says what each part checks and what the JSON holds.
"""

from assay.selftest.parts import SelftestRequest, plan
from assay.selftest.runner import SUMMARY_FILE, SelftestResult, run_selftest

__all__ = ["SUMMARY_FILE", "SelftestRequest", "SelftestResult", "plan", "run_selftest"]
