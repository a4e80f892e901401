"""`assay triage`'s child processes (triage.py): `python -m assay.compat.run.triage_worker rerun|minify ...`.

rerun RUN_PY DEBUG_DIR AFTER LEVEL: the row's run.py with torch's minifier switched on, dumping its
launcher under DEBUG_DIR. minify LAUNCHER: torch's minifier_launcher.py, run as its own script would be.
Both first import ASSAY_PLUGINS, so a backend registered by a plugin is found by name.
"""

from __future__ import annotations

import inspect
import os
import runpy
import sys


def _falsely_boxed(fn) -> bool:
    """torch 2.13's aot_module_simplified returns `forward(*runtime_args)`, an unboxed function, wrapped
    with simple_wraps around the boxed compiled function: it copies `_boxed_call = True` onto it. The
    minifier's run_fwd_maybe_bwd believes the flag, calls forward([args]) and every AOT-based backend
    (aot_eager included) fails with an IndexError that is the minifier's, not the backend's."""
    code = getattr(fn, "__code__", None)
    return bool(getattr(fn, "_boxed_call", False)) and code is not None and bool(code.co_flags & inspect.CO_VARARGS)


def _call_aot_forwards_unboxed() -> None:
    import torch._dynamo.debug_utils as debug_utils
    import torch._dynamo.repro.after_dynamo as after_dynamo

    original = debug_utils.run_fwd_maybe_bwd

    def run_fwd_maybe_bwd(gm, args, only_fwd=False, disable_clone=False):
        if _falsely_boxed(gm):
            forward = gm

            def gm(*inputs):  # no _boxed_call: called with *args, as forward expects
                return forward(*inputs)

            for name in ("zero_grad", "named_parameters", "named_buffers"):  # what the minifier asks of a module
                if hasattr(forward, name):
                    setattr(gm, name, getattr(forward, name))
        return original(gm, args, only_fwd, disable_clone)

    debug_utils.run_fwd_maybe_bwd = run_fwd_maybe_bwd
    after_dynamo.run_fwd_maybe_bwd = run_fwd_maybe_bwd


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from assay.core.plugins import load_plugins

    load_plugins()
    import torch._dynamo.config as dynamo_config

    _call_aot_forwards_unboxed()

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
