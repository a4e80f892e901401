"""Entry points the zygote tests fork: `main([behaviour, out_file])`, each a real process that behaves or not."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time


def main(args: list[str]) -> int:
    behaviour, out_file = args
    if behaviour == "describe":
        import torch

        started = time.perf_counter()
        importlib.import_module("transformers")  # already imported by the zygote: costs nothing here

        facts = {
            "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
            "torch_threads": torch.get_num_threads(), "marker": os.environ.get("ASSAY_TEST_MARKER"),
            "import_s": time.perf_counter() - started, "stdout_is_devnull": os.path.samestat(os.fstat(1), os.stat(os.devnull)),
        }
        with open(out_file, "w") as handle:
            json.dump(facts, handle)
        print("to stderr", file=sys.stderr)
        return 0
    if behaviour == "segfault":
        import ctypes

        ctypes.string_at(0)
    if behaviour == "hang":
        with open(out_file, "w") as handle:
            handle.write(str(os.getpid()))
        while True:
            time.sleep(1)
    if behaviour == "hog":
        chunks = []
        while True:
            chunks.append(bytearray(64 * 2**20))
    if behaviour == "raise":
        raise ValueError("raised in the forked child")
    if behaviour == "exit3":
        sys.exit(3)
    raise SystemExit(f"unknown behaviour {behaviour}")
