"""What a user watching `assay probe` and `assay sweep` in a log sees: each probe stage named as it starts, the
eval's items counted, one whole line per finished model of a sweep; and the probe's tokens decoded beside the ids.

The commands run as real processes with stderr a pipe (not a terminal), as under `| tee log`."""

from __future__ import annotations

import json
import re

import pytest

STAGE_LINE = re.compile(r"^probe (\S+): (.+?)(?: \((.*)\))? \[\d+ s\]$")


def _stages(stderr: str) -> list[str]:
    return [match.group(2) for match in map(STAGE_LINE.match, stderr.splitlines()) if match]


def _probe(assay_cli, zoo_dir, tmp_path, *extra: str):
    result = assay_cli("probe", str(zoo_dir / "qwen3"), "--backend", "eager", "--new-tokens", "4", "--out", str(tmp_path / "results"), *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("isolation", [[], ["--timeout", "600"]], ids=["in-process", "own-process"])
def test_probe_names_each_stage_as_it_starts_in_whole_lines(zoo_dir, tmp_path, assay_cli, isolation):
    result = _probe(assay_cli, zoo_dir, tmp_path, *isolation)
    assert _stages(result.stderr) == ["load", "compile", "generate", "reference", "done: PASS"]
    assert all(match.group(1) == "assay-zoo/qwen3" for match in map(STAGE_LINE.match, result.stderr.splitlines()) if match)
    assert "\r" not in result.stderr  # not a terminal: nothing redrawn in place


@pytest.mark.slow
def test_probe_json_and_row_carry_the_decoded_text_beside_the_token_ids(zoo_dir, tmp_path, assay_cli):
    from transformers import AutoTokenizer

    from assay.compat.results.dataset import query

    printed = json.loads(_probe(assay_cli, zoo_dir, tmp_path, "--json").stdout)
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "qwen3")
    assert len(printed["generated_tokens"]) == 4 and printed["generated_text"] == tokenizer.decode(printed["generated_tokens"])
    assert printed["reference_text"] == tokenizer.decode(printed["reference_tokens"])
    [stored] = query(tmp_path / "results")
    assert (stored["generated_text"], stored["reference_text"]) == (printed["generated_text"], printed["reference_text"])


@pytest.mark.slow
def test_probe_eval_counts_its_items_on_the_device_and_on_the_reference(zoo_dir, tmp_path, assay_cli):
    result = _probe(assay_cli, zoo_dir, tmp_path, "--eval", "assay_cloze", "--no-reference-cache")
    assert _stages(result.stderr) == ["load", "compile", "generate", "reference", "eval", "done: PASS"]
    for side in ("device", "reference"):
        counts = [tuple(map(int, m.groups())) for m in re.finditer(rf"^eval assay_cloze \({side}\): (\d+)/(\d+) items$", result.stderr, re.M)]
        assert counts and counts[-1] == (100, 100), result.stderr[-2000:]
        assert [done for done, _ in counts] == sorted(done for done, _ in counts)  # a count never goes back
    assert "\r" not in result.stderr and "it/s" not in result.stderr  # no bar of lm-eval's own redrawn between the counts


@pytest.mark.slow
def test_sweep_in_a_log_prints_one_whole_line_per_finished_model(zoo_dir, tmp_path, assay_cli):
    models = [str(zoo_dir / name) for name in ("qwen3", "llama")]
    result = assay_cli("sweep", *models, "--backend", "eager", "--new-tokens", "2", "--out", str(tmp_path / "results"), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("sweep:")]
    pattern = re.compile(r"^sweep: ([12])/2 (PASS) assay-zoo/(qwen3|llama) in \d+ s \(0 failed, elapsed \d+ s, ETA (\d+ s|-)\)$")
    assert len(lines) == 2 and all(pattern.match(line) for line in lines), result.stderr[-2000:]
    assert sorted(pattern.match(line).group(3) for line in lines) == ["llama", "qwen3"]
    assert "\r" not in result.stderr and "PASS" in result.stdout  # the table on stdout, no redrawn status glued to it
