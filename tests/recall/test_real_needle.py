"""`recall needle` on a real pretrained checkpoint (SmolLM2-135M-Instruct, the session's `real_model_dir`):
the text needle, answered through the native Llama's KV-cache slot, as the server would.

One short cell: the full grid (256 to 2K tokens, bench/core/real_model.py) takes minutes on two cores.
"""

from __future__ import annotations

import pytest

from assay.recall.needle import NeedleRequest, run_needle

pytestmark = pytest.mark.slow


def test_the_real_model_reads_back_a_secret_number_from_the_middle_of_a_prompt(real_model_dir):
    result = run_needle(NeedleRequest(model=str(real_model_dir), lengths=(256,), depths=(0.5,), trials=2))
    assert result.kind == "llama" and result.format == "text" and result.max_positions == 8192
    (cell,) = result.cells
    # Measured: every trial right at 256 tokens (chance 1e-4 for four digits).
    assert cell["status"] == "ok" and cell["accuracy"] == 1.0, cell["examples"]
