"""How fast the `assay` command answers: `python bench/core/cli_startup.py` -> bench/results/cli_startup.json.

Wall time and CPU time (user + system, the child's own) of `python -m assay --help`, `python -m assay stack
--json`, an eager `assay serve` until it prints its URL (then stopped with SIGINT) and a one-step `assay
train` on the tiny zoo's Llama, each a fresh interpreter, interleaved with two references measured in the
same run: a bare interpreter (`python -c pass`) and `python -c "import torch"` (what --help would cost if it
imported torch). Medians and minimums of several rounds; the CPU model and the load average are saved with
them, since this machine is shared.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import os
import resource
import signal
import statistics
import subprocess
import tempfile
import time

from assay.core.files import atomic_write_json
from assay.core.output import print_table
from bench.common import RESULTS, load_average, machine


def commands(zoo: Path) -> dict[str, list[str]]:
    assay = [sys.executable, "-m", "assay"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "assay --help": [*assay, "--help"],
        "assay stack --json": [*assay, "stack", "--json", "--backend", "aot_eager"],
        "assay serve --eager (to its URL)": [*assay, "serve", "--model", str(zoo / "llama"), "--eager", "--max-seqs", "2", "--port", "0"],
        "assay train (one step)": [*assay, "train", "--model", str(zoo / "llama"), "--steps", "1", "--batch", "2", "--seq-len", "16", "--json"],
    }


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(name: str, argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process: until its exit, or a server until its first line."""
    cpu = children_cpu_s()
    start = time.perf_counter()
    if name.startswith("assay serve"):
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = process.stdout.readline()
        wall = time.perf_counter() - start
        process.send_signal(signal.SIGINT)
        process.wait(60)
        if "http" not in line:
            raise SystemExit(f"{name}: no URL in its first line: {line!r}")
    else:
        subprocess.run(argv, check=True, capture_output=True)
        wall = time.perf_counter() - start
    return wall, children_cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--zoo", type=Path, default=None, help="a tiny zoo folder (default: its Llama built in a temporary folder)")
    parser.add_argument("--out", type=Path, default=RESULTS / "cli_startup.json")
    options = parser.parse_args()
    if options.zoo is not None:
        measure(options.zoo, options.rounds, options.out)
        return
    from assay.zoo import build_zoo

    with tempfile.TemporaryDirectory(prefix="cli-startup-zoo-") as zoo:
        print("building the tiny zoo's Llama ...", file=sys.stderr)
        build_zoo(Path(zoo), names=["llama"], progress=False)
        measure(Path(zoo), options.rounds, options.out)


def measure(zoo: Path, rounds: int, out: Path) -> None:
    argvs = commands(zoo)
    times: dict[str, list[float]] = {name: [] for name in argvs}
    cpu: dict[str, list[float]] = {name: [] for name in argvs}
    machine_before = machine()
    for round_number in range(rounds):
        for name, argv in argvs.items():  # interleaved: a burst of other work hits every command alike
            wall, used = timed(name, argv)
            times[name].append(wall)
            cpu[name].append(used)
        print(f"round {round_number + 1}/{rounds} done", file=sys.stderr)
    rows = [{"command": name, "median_s": statistics.median(times[name]), "min_s": min(times[name]),
             "cpu_median_s": statistics.median(cpu[name]), "rounds": len(times[name])} for name in argvs]
    record = {"rows": rows, "times_s": times, "cpu_s": cpu, "machine": machine_before, "loadavg_before": machine_before["loadavg"],
              "loadavg_after": load_average(), "cpus": os.cpu_count()}
    atomic_write_json(out, record)
    print_table(rows, ["command", "median_s", "min_s", "cpu_median_s", "rounds"],
                title=f"assay start-up (load {machine_before['loadavg'][0]:.1f})")


if __name__ == "__main__":
    main()
