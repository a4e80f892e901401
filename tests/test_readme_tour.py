"""README.md's tour, run top to bottom in a fresh folder, its commands parsed out of the README so the two
cannot drift apart.

The README marks each block of the tour with an HTML comment (invisible on GitHub and on the docs site):
`<!-- tour -->` runs the block (bash, or Python for a ```python block) and needs exit 0; `<!-- tour: server -->`
starts it in the background and waits for its URL; `<!-- tour: stop -->` stops the servers started so far;
`<!-- tour: setup -->` is the set-up the suite's own environment already holds (checked, not run).
Two substitutions, both named here: `assay zoo real smollm2/` becomes a copy of the session's converted model
(the `real_model_dir` fixture: the same conversion, done once per session), and the README's ports 8000 and
7860 become free ones, so that a server another test left on them cannot answer for this one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- tour(?:: (\w+))? -->$")
SETUP = ["bash scripts/setup.sh tour", ". .venv/bin/activate"]
REAL_MODEL = "assay zoo real smollm2/"
PORTS = ("8000", "7860")


@dataclass
class Block:
    kind: str  # run, server, stop or setup
    language: str
    text: str


def tour_blocks(readme: str) -> list[Block]:
    """The marked blocks, in README order."""
    lines = readme.splitlines()
    blocks = []
    for number, line in enumerate(lines):
        mark = MARK.match(line.strip())
        if mark is None:
            continue
        kind = mark.group(1) or "run"
        if kind == "stop":
            blocks.append(Block(kind, "", ""))
            continue
        fence = next(i for i in range(number + 1, len(lines)) if lines[i].strip())
        assert lines[fence].startswith("```"), f"README.md:{number + 1}: the tour mark is not followed by a fenced block"
        end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
        blocks.append(Block(kind, lines[fence].strip("`").strip(), "\n".join(lines[fence + 1:end])))
    return blocks


def bash_commands(text: str) -> list[str]:
    """One entry per command: continuation lines joined."""
    return [command.strip() for command in re.sub(r"\\\n\s*", " ", text).splitlines() if command.strip()]


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _hard_link_tree(source: Path, target: Path) -> None:
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(source, target, copy_function=link)


def test_the_tour_is_marked_in_the_readme():
    blocks = tour_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert [block.kind for block in blocks] == ["setup", "run", "server", "run", "run", "stop", "run", "server", "run"]
    assert bash_commands(blocks[0].text) == SETUP
    assert bash_commands(blocks[1].text) == [REAL_MODEL]
    # One real model folder throughout: every command that names a model names smollm2/.
    commands = [command for block in blocks if block.language == "bash" for command in bash_commands(block.text)]
    named = [folder for command in commands if command.startswith("assay ")
             for folder in re.findall(r"--model (\S+)|^assay probe (\S+)|^assay zoo real (\S+)", command)]
    named += [(folder,) for command in commands for folder in re.findall(r"tokenizer=([^,\s]+)", command)]
    assert len(named) >= 6 and {folder for found in named for folder in found if folder} == {"smollm2/"}


class Tour:
    """The tour's folder, environment and background servers."""

    def __init__(self, folder: Path, ports: dict[str, str]):
        self.folder, self.ports, self.servers = folder, ports, []
        venv_bin = str(Path(sys.executable).parent)  # where `assay` and `lm_eval` are installed
        self.env = os.environ | {"PATH": venv_bin + os.pathsep + os.environ["PATH"],
                                 "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                                 "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def ported(self, text: str) -> str:
        for readme_port, port in self.ports.items():
            text = text.replace(readme_port, port)
        return text

    def run(self, command: list[str], timeout: float) -> subprocess.CompletedProcess:
        completed = subprocess.run(command, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert completed.returncode == 0, f"{command[-1]}\nexit {completed.returncode}\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
        return completed

    def start(self, command: str, timeout: float = 600) -> str:
        port = next((port for readme_port, port in self.ports.items() if readme_port in command), None)
        if command.startswith("assay serve") and "--port" not in command:  # the README relies on the default, 8000
            command, port = f"{command} --port {self.ports['8000']}", self.ports["8000"]
        log = (self.folder / f"server-{len(self.servers)}.log").open("w")
        process = subprocess.Popen(["bash", "-c", f"exec {self.ported(command)}"], cwd=self.folder, env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.servers.append(process)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert process.poll() is None, f"{command} exited {process.returncode}:\n{Path(log.name).read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
                    pass
                return Path(log.name).read_text()
            except urllib.error.HTTPError:  # answering (a 404 at / is an answer)
                return Path(log.name).read_text()
            except OSError:
                time.sleep(1)
        raise AssertionError(f"{command} did not answer on port {port} in {timeout} s:\n{Path(log.name).read_text()[-3000:]}")

    def stop(self) -> None:
        for process in self.servers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.servers.clear()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the real model's probe scores 20 items twice (device and reference)
def test_the_readme_tour_runs_top_to_bottom(real_model_dir, tmp_path):
    tour = Tour(tmp_path, {readme_port: _free_port() for readme_port in PORTS})
    # The tour runs from the clone's root: the embedded lm-eval tasks are named by their path there.
    (tmp_path / "assay").symlink_to(REPO / "assay", target_is_directory=True)
    outputs: dict[str, str] = {}
    try:
        for block in tour_blocks((REPO / "README.md").read_text(encoding="utf-8")):
            if block.kind == "setup":
                continue  # the suite's environment (scripts/test.sh) holds every extra the tour's set-up installs
            if block.kind == "stop":
                tour.stop()
                continue
            if block.language == "python":
                outputs["python"] = tour.run([sys.executable, "-c", tour.ported(block.text)], timeout=300).stdout
                continue
            for command in bash_commands(block.text):
                if command == REAL_MODEL:
                    _hard_link_tree(real_model_dir, tmp_path / "smollm2")
                elif block.kind == "server":
                    outputs[command.split()[1]] = tour.start(command)
                else:
                    completed = tour.run(["bash", "-c", tour.ported(command)], timeout=1800)
                    outputs[" ".join(command.split()[:2]) + f" {len(outputs)}"] = completed.stdout + completed.stderr
    finally:
        tour.stop()

    # What the README says each step shows.
    assert outputs["python"] == "The capital of France is Paris.\n"
    assert "http://" in outputs["serve"] and "http://" in outputs["app"]
    said = "\n".join(outputs.values())
    assert re.search(r"assay_next_sentence\s*\|.*\|\s*acc\s*\|", said), "lm-eval printed no accuracy for the task"
    probe = next(text for key, text in outputs.items() if key.startswith("assay probe"))
    assert "PASS" in probe and "AGREE" in probe, probe[-3000:]
    resumed = [text for key, text in outputs.items() if key.startswith("assay train")][-1]
    assert "resumed from step 2 (runs/step-000002); training steps 3-3" in resumed, resumed[-3000:]
