import json

from compat.test_dataset import make_row

from assay.compat.results.dataset import write_row
from assay.compat.results.diff import diff_stacks


def _two_stacks(folder):
    pairs = {"a": ("PASS", "FAIL_COMPILE"), "b": ("FAIL_RUN", "PASS"), "c": ("FAIL_RUN", "OOM"), "d": ("FAIL_LOAD", "FAIL_LOAD"),
             "e": ("PASS", "PASS"), "f": ("PASS", None), "g": (None, "PASS"), "h": ("SKIPPED", "PASS")}
    for model, (old, new) in pairs.items():
        if old:
            write_row(folder, make_row(model, stack="cpu-inductor-old", status=old))
        if new:
            write_row(folder, make_row(model, stack="cpu-inductor-new", status=new))


def test_diff_classifies_each_model_and_puts_regressions_first(tmp_path):
    _two_stacks(tmp_path)
    result = diff_stacks(tmp_path, "old", "new")
    kinds = {c.model: c.kind for c in result.changes}
    assert kinds == {"a": "regressed", "b": "fixed", "c": "failure_changed", "d": "both_fail", "e": "both_pass",
                     "f": "only_base", "g": "only_new", "h": "skipped"}
    assert result.changes[0].model == "a"
    # pass rate over a, b, c, d, e (tested on both, none skipped): 2/5 before, 2/5 after
    assert result.models_on_both == 5 and result.base_pass_rate == 0.4 and result.new_pass_rate == 0.4


def test_diff_cli_json_and_bad_stack(tmp_path, assay_cli):
    _two_stacks(tmp_path)
    result = assay_cli("diff", str(tmp_path), "--base", "cpu-inductor-old", "--new", "cpu-inductor-new", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["counts"]["regressed"] == 1
    bad = assay_cli("diff", str(tmp_path), "--base", "nope", "--new", "new")
    assert bad.returncode == 2 and "no stack matching 'nope'" in bad.stderr
