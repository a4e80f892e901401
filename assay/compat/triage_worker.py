"""`assay triage`'s child processes (triage.py): `python -m assay.compat.triage_worker rerun|minify ...`.

rerun RUN_PY DEBUG_DIR AFTER LEVEL: the row's run.py with torch's minifier switched on, dumping its
launcher under DEBUG_DIR. minify LAUNCHER: torch's minifier_launcher.py, run as its own script would be.
Both first import ASSAY_PLUGINS, so a backend registered by a plugin is found by name.
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from assay.core.plugins import load_plugins

    load_plugins()
    import torch._dynamo.config as dynamo_config

    mode, script, *rest = argv
    if mode == "rerun":
        debug_dir, after, level = rest
        dynamo_config.repro_after = after
        dynamo_config.repro_level = int(level)
        dynamo_config.debug_dir_root = debug_dir
    elif mode != "minify":
        raise SystemExit(f"unknown mode {mode!r}")
    sys.argv = [script]  # torch's run_repro parses sys.argv: no flags, its own defaults
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
