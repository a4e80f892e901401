"""How fast the `assay` command answers: `python bench/core/cli_startup.py` -> bench/results/cli_startup.json.

Wall time of `python -m assay --help` and `python -m assay stack --json`, each a fresh interpreter,
interleaved with two references measured in the same run: a bare interpreter (`python -c pass`) and
`python -c "import torch"` (what --help would cost if it imported torch). Medians and minimums of
several rounds; the load average is saved with them, since this machine is shared.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import statistics
import subprocess
import time

from assay.core.files import atomic_write_json
from assay.core.output import print_table
from bench.common import RESULTS, load_average, machine

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "assay --help": [sys.executable, "-m", "assay", "--help"],
    "assay stack --json": [sys.executable, "-m", "assay", "stack", "--json", "--backend", "aot_eager"],
}


def wall_s(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS / "cli_startup.json")
    options = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    machine_before = machine()
    for _ in range(options.rounds):
        for name, argv in COMMANDS.items():  # interleaved: a burst of other work hits every command alike
            times[name].append(wall_s(argv))
    rows = [{"command": name, "median_s": statistics.median(t), "min_s": min(t), "rounds": len(t)} for name, t in times.items()]
    record = {"rows": rows, "times_s": times, "machine": machine_before, "loadavg_before": machine_before["loadavg"], "loadavg_after": load_average(), "cpus": os.cpu_count()}
    atomic_write_json(options.out, record)
    print_table(rows, ["command", "median_s", "min_s", "rounds"], title=f"assay start-up (load {load_before[0]:.1f})")


if __name__ == "__main__":
    main()
