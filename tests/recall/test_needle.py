"""The needle probe on a native GLA, a native Qwen3 and a Transformers model from the zoo, and on
checkpoints trained by `recall train` (token format)."""

from __future__ import annotations

import pytest
import torch

from assay.core.errors import AssayError
from assay.recall.shapes import MQARLayout
from assay.recall.needle import NeedleRequest, first_digits, run_needle, text_prompt, token_prompt
from assay.recall.report import plot_needle


def _assert_grid(result, lengths, depths, trials):
    assert [(c["length"], c["depth"]) for c in result.cells] == [(n, d) for n in lengths for d in depths]
    for cell in result.cells:
        if cell["status"] == "ok":
            assert cell["correct"] is not None and 0 <= cell["correct"] <= trials
            assert cell["accuracy"] == cell["correct"] / trials


@pytest.mark.slow
@pytest.mark.parametrize("entry, kind", [("gla", "gla"), ("qwen3-pretrained", "qwen3"), ("llama", "llama"), ("mistral", "hf")])
def test_text_needle_runs_on_each_kind_of_model_and_draws_a_heat_map(zoo_dir, tmp_path, entry, kind):
    lengths, depths = [64, 3000], [0.0, 1.0]
    result = run_needle(NeedleRequest(model=str(zoo_dir / entry), lengths=tuple(lengths), depths=tuple(depths), trials=2))
    assert result.kind == kind and result.format == "text"
    _assert_grid(result, lengths, depths, 2)
    long_cells = [c for c in result.cells if c["length"] == 3000]
    if kind == "gla":  # no positional table: every length runs
        assert result.max_positions is None and all(c["status"] == "ok" for c in long_cells)
    else:  # the zoo's 2048 positions: the 3000-token cells are skipped and say why, the run goes on
        assert all(c["status"] == "skipped" and "2048 positions" in c["reason"] for c in long_cells)
        assert all(c["status"] == "ok" for c in result.cells if c["length"] == 64)
    png = plot_needle(result.as_dict(), tmp_path / "needle.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = result.grid(lengths, depths)
    assert len(grid) == 2 and len(grid[0]) == 2


def test_text_prompt_has_the_length_and_holds_the_fact(zoo_dir):
    from transformers import AutoTokenizer

    folder = str(zoo_dir / "llama")
    prompt, digits = text_prompt(folder, 200, 0.5, torch.Generator().manual_seed(0))
    assert len(prompt) == 200
    text = AutoTokenizer.from_pretrained(folder).decode(prompt)
    assert f"is {digits}." in text and text.rstrip().endswith("is")


def test_token_prompt_places_the_pair_at_the_depth():
    layout = MQARLayout(n_keys=32, n_values=32)
    for depth, expected_at in ((0.0, 0), (1.0, 97)):
        prompt, value = token_prompt(layout, 100, depth, torch.Generator().manual_seed(1))
        assert len(prompt) == 100
        key = int(prompt[-1])
        assert layout.is_key(key) and int(prompt[expected_at]) == key and int(prompt[expected_at + 1]) == value


@pytest.mark.slow
def test_token_needle_on_trained_checkpoints(recall_run):
    for name, kind in (("gla-L32", "gla"), ("qwen3-L32", "qwen3")):
        result = run_needle(NeedleRequest(model=str(recall_run / "models" / name), lengths=(32, 128), depths=(0.0, 0.5, 1.0), trials=3))
        assert result.kind == kind and result.format == "tokens"
        assert result.chance == pytest.approx(1 / 32)
        _assert_grid(result, [32, 128], [0.0, 0.5, 1.0], 3)
        assert all(c["status"] == "ok" for c in result.cells)


def test_token_format_needs_a_recall_checkpoint(zoo_dir):
    with pytest.raises(AssayError, match="recall.json"):
        run_needle(NeedleRequest(model=str(zoo_dir / "gla"), lengths=(64,), depths=(0.5,), format="tokens"))


def test_first_digits_reads_the_answer():
    assert first_digits(" 4821. And") == "4821"
    assert first_digits(" no number") is None
