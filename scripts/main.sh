#!/usr/bin/env bash
# The main job on the embedded default, set-up included: build the tiny zoo, probe every checkpoint
# (each in its own process), print the results table. BACKEND=aot_eager for a quicker run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
BACKEND=${BACKEND:-inductor}
assay zoo build zoo/
# The sweep's live progress is on stderr; of its stdout only the last line (the counts) is kept, so the
# table is printed once, by `assay results` (every row of the stack, also those of an earlier run).
assay sweep --zoo zoo/ --backend "$BACKEND" --out results/ --workers "${WORKERS:-1}" --timeout 900 | tail -n 1
assay results results/
