#!/usr/bin/env bash
# The main job on the embedded default, set-up included: build the tiny zoo, probe every checkpoint
# (each in its own process), print the results table. BACKEND=aot_eager for a quicker run.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "main: setting up .venv (torch and assay only: no browser, no test extras)" >&2
bash scripts/setup.sh main
# shellcheck disable=SC1091
. .venv/bin/activate
BACKEND=${BACKEND:-inductor}
echo "main: building the tiny model zoo in zoo/ (20 checkpoints, offline)" >&2
assay zoo build zoo/
echo "main: probing every zoo checkpoint under $BACKEND, one process each (minutes; progress on stderr)" >&2
# The sweep's live progress is on stderr; of its stdout only the last line (the counts) is kept, so the
# table is printed once, by `assay results` (every row of the stack, also those of an earlier run).
assay sweep --zoo zoo/ --backend "$BACKEND" --out results/ --workers "${WORKERS:-1}" --timeout 900 | tail -n 1
echo "main: the results table (results/; open it in the web app with assay app results/)" >&2
assay results results/
