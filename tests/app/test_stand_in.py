"""The Selected view says plainly when a tiny stand-in was tested rather than the named checkpoint."""

from __future__ import annotations

from app.builders import OLD, zoo
from compat.test_dataset import make_row

from assay.app.catalog import catalog_from_stand_ins
from assay.app.results.listing import ALL_RESULTS, SELECTED, STAND_IN, THE_CHECKPOINT, Filters, list_view
from assay.app.results.snapshot import load_snapshot
from assay.compat.results.dataset import write_rows

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _tested_on(listing) -> dict[str, str]:
    return {row["model"]: row["tested on"] for _, row in listing.table.iterrows()}


def test_each_selected_row_says_whether_a_stand_in_or_the_checkpoint_itself_was_tested(tmp_path):
    write_rows(tmp_path, [zoo("qwen3", "Qwen/Qwen3-0.6B", OLD), make_row(SMOLLM2, stack=OLD, task="text-generation")])
    catalog = catalog_from_stand_ins([("Qwen/Qwen3-0.6B", "text-generation"), (SMOLLM2, "text-generation"),
                                      ("meta-llama/Llama-3.2-1B", "text-generation")])
    listing = list_view(load_snapshot(tmp_path), catalog, SELECTED, Filters())
    assert _tested_on(listing) == {"Qwen/Qwen3-0.6B": STAND_IN, SMOLLM2: THE_CHECKPOINT, "meta-llama/Llama-3.2-1B": ""}
    # The line above the table, in words: which rows are about a stand-in and what such a result means.
    assert listing.note == (f"Selected: 3 rows; 1 of them tested a {STAND_IN} (a small model of the same architecture), not the "
                            "named checkpoint: such a result says the architecture runs on that stack, not that the "
                            "checkpoint itself was loaded.")


def test_the_note_says_all_when_every_row_is_a_stand_in_and_nothing_when_none_is(tmp_path):
    write_rows(tmp_path / "zoo", [zoo("qwen3", "Qwen/Qwen3-0.6B", OLD), zoo("llama", "meta-llama/Llama-3.2-1B", OLD)])
    everything = list_view(load_snapshot(tmp_path / "zoo"), catalog_from_stand_ins([]), ALL_RESULTS, Filters())
    assert "; all of them tested a tiny stand-in" in everything.note
    assert set(everything.table["tested on"]) == {STAND_IN}
    write_rows(tmp_path / "real", [make_row(SMOLLM2, stack=OLD, task="text-generation")])
    real = list_view(load_snapshot(tmp_path / "real"), catalog_from_stand_ins([]), ALL_RESULTS, Filters())
    assert real.note == "All results: 1 rows." and list(real.table["tested on"]) == [THE_CHECKPOINT]
