"""`assay selftest` (and scripts/device_check.sh): one prepared check of a device, part by part.

Each part is the real `assay` command (probe, kernels check, train, serve-bench) or a Python entry
(gla_check), run as its own process with its own time limit; a part that fails or times out is
recorded and the rest still run. It sits above compat, train and serve (like app) and reaches them
only through their commands. docs/device_check.md says what each part checks and what the JSON holds.
"""

from assay.core.lazy import lazy_exports

# Lazy, like the other systems: registering `assay selftest` for `assay --help` imports only its commands.
_EXPORTS = {
    "SelftestRequest": "assay.selftest.parts",
    "plan": "assay.selftest.parts",
    "SUMMARY_FILE": "assay.selftest.runner",
    "SelftestResult": "assay.selftest.runner",
    "run_selftest": "assay.selftest.runner",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
