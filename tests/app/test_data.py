"""The app's data functions over real Parquet files: search, filters, views, pages, groups, diff, scale."""

from __future__ import annotations

import json
import time

from app.builders import GPU, NEW, OLD, REPRO_PY, SETATTR_BREAK, XSS_MODEL, recorded_catalog, versions
from compat.test_dataset import make_row

from assay.app import charts
from assay.app.catalog import zoo_catalog
from assay.app.results.analysis import compare_stacks, failure_groups, model_drift, pass_rates, per_model_costs, per_model_drift
from assay.app.results.listing import (
    ALL_RESULTS, DOWNLOADS, LIST_COLUMNS, SELECTED, TRENDING, VIEWS, Filters, filter_choices, list_view,
)
from assay.app.results.model_page import model_names, model_page, repro_py_filename, result_detail, run_py_filename
from assay.app.results.snapshot import ResultsSource, load_snapshot
from assay.app.results.status import ANY, ANY_FAILURE, NOT_TESTED, SKIPPED
from assay.compat.results.dataset import init_results, write_row, write_rows


def _rows(listing, *columns):
    return [tuple(row[c] for c in columns) for _, row in listing.table.iterrows()]


def test_search_matches_part_of_the_tested_name_or_public_id_in_any_case(mixed_results):
    snapshot = load_snapshot(mixed_results)
    by_tested = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(text="ZOO/QWEN"))
    assert {r for r in _rows(by_tested, "tested as", "stack")} == {("assay-zoo/qwen3", s) for s in (OLD, NEW, GPU)}
    by_public = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(text="llama-3.2"))
    assert {r[0] for r in _rows(by_public, "tested as")} == {"assay-zoo/llama"}
    assert list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(text="no-such-model")).total == 0


def test_compiler_and_transformers_versions_come_from_the_versions_column(mixed_results):
    snapshot = load_snapshot(mixed_results)
    choices = filter_choices(snapshot, zoo_catalog())
    assert choices.compilers == [ANY, "torch 2.13.0, triton 3.9.0", "torch 2.14.0, triton 3.10.0", "torch 2.14.0, triton 3.9.0"]
    assert choices.transformers == [ANY, "5.24.0", "5.25.0"]
    gpu_compiler = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(compiler="torch 2.14.0, triton 3.10.0"))
    assert _rows(gpu_compiler, "tested as", "stack") == [("assay-zoo/qwen3", GPU)]
    old_transformers = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(transformers="5.24.0"))
    assert {r[0] for r in _rows(old_transformers, "stack")} == {OLD} and old_transformers.total == 5


def test_device_status_and_task_filters(mixed_results):
    snapshot = load_snapshot(mixed_results)
    cuda = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(device="cuda:0"))
    assert _rows(cuda, "stack") == [(GPU,)]
    failed_run = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(status="FAIL_RUN"))
    assert sorted(_rows(failed_run, "tested as")) == [("assay-zoo/llama",), ("assay-zoo/qwen3",)]
    assert list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(task="image-text-to-text")).total == 0
    assert list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(task="text-generation")).total == 11


def test_an_untested_model_shows_not_tested_and_a_skipped_one_skipped_never_as_failures(mixed_results):
    snapshot = load_snapshot(mixed_results)
    selected = list_view(snapshot, zoo_catalog(), SELECTED, Filters())
    results = {}
    for model, tested_as, stack, result in _rows(selected, "model", "tested as", "stack", "result"):
        results.setdefault(model, []).append((tested_as, stack, result))
    assert results["Qwen/Qwen2.5-0.5B"] == [("", "", NOT_TESTED)]
    assert ("assay-zoo/gpt2", OLD, SKIPPED) in results["openai-community/gpt2"]
    failures = list_view(snapshot, zoo_catalog(), SELECTED, Filters(status=ANY_FAILURE))
    assert {r[0] for r in _rows(failures, "result")} == {"FAIL_RUN", "FAIL_COMPILE"}
    assert not any(row[1] in ("SKIPPED", SKIPPED) for row in failure_groups(snapshot, Filters()).table.itertuples())
    not_tested = list_view(snapshot, zoo_catalog(), SELECTED, Filters(status=NOT_TESTED))
    assert "Qwen/Qwen2.5-0.5B" in {r[0] for r in _rows(not_tested, "model")} and "Qwen/Qwen3-0.6B" not in {r[0] for r in _rows(not_tested, "model")}
    rates = pass_rates(snapshot).set_index("stack")
    assert rates.loc[OLD, "tested"] == 4 and rates.loc[OLD, "skipped"] == 1 and rates.loc[OLD, "failed"] == 1


def test_a_version_filter_leaves_a_model_not_tested_on_the_other_stacks(mixed_results):
    snapshot = load_snapshot(mixed_results)
    listing = list_view(snapshot, zoo_catalog(), SELECTED, Filters(transformers="5.24.0", text="qwen3-0.6b"))
    assert _rows(listing, "model", "result", "stack") == [("Qwen/Qwen3-0.6B", "PASS", OLD)]
    listing = list_view(snapshot, zoo_catalog(), SELECTED, Filters(compiler="torch 2.14.0, triton 3.10.0", text="llama-3.2"))
    assert _rows(listing, "model", "result") == [("meta-llama/Llama-3.2-1B", NOT_TESTED)]


def test_trending_and_downloads_rank_the_catalog_and_show_untested_models(mixed_results):
    snapshot = load_snapshot(mixed_results)
    catalog = recorded_catalog()
    downloads = list_view(snapshot, catalog, DOWNLOADS, Filters())
    ranked = list(dict.fromkeys(r[0] for r in _rows(downloads, "model")))
    assert ranked == ["openai-community/gpt2", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B",
                      "example-org/never-tested-7b", "example-org/hot-new-model"]
    assert ("example-org/never-tested-7b", NOT_TESTED, "5,200,000") in _rows(downloads, "model", "result", "downloads")
    trending = list_view(snapshot, catalog, TRENDING, Filters())
    assert _rows(trending, "#", "model", "result", "trending")[0] == ("1", "example-org/hot-new-model", NOT_TESTED, "310")
    assert "no trending ranking" in list_view(snapshot, zoo_catalog(), TRENDING, Filters()).note


def test_failures_group_by_normalised_signature_with_counts_and_models(mixed_results):
    groups = failure_groups(load_snapshot(mixed_results), Filters())
    table = {row["signature"]: row for _, row in groups.table.iterrows()}
    shape = "RuntimeError: shape '…' is invalid for input of size N at <addr>"
    assert table[shape]["count"] == "2" and groups.models[shape] == ["assay-zoo/llama", "assay-zoo/qwen3"]
    unsupported = "torch._dynamo.exc.Unsupported: call_function '…' in <path> line N"
    assert table[unsupported]["count"] == "2" and table[unsupported]["stacks"] == f"{OLD}, {NEW}"
    assert len(groups.table) == 3 and groups.table.iloc[-1]["count"] == "1"  # the planted FAIL_LOAD, alone
    only_new = failure_groups(load_snapshot(mixed_results), Filters(stack=NEW, text="qwen"))
    assert list(only_new.table["signature"]) == [shape]


def test_compare_puts_regressions_first(mixed_results):
    comparison = compare_stacks(mixed_results, OLD, NEW)
    kinds = list(comparison.table["change"])
    assert kinds == ["regressed", "regressed", "both fail", "only base", "only new", "skipped"]
    assert comparison.table.iloc[-1]["base"] == SKIPPED and "regressed 2" in comparison.summary
    assert "pass rate over the 3 models tested on both 67% → 0%" in comparison.summary


def test_a_model_page_shows_each_stack_and_not_tested_where_it_has_no_row(mixed_results):
    snapshot = load_snapshot(mixed_results)
    page = model_page(snapshot, zoo_catalog(), "org/plain-model")
    assert list(zip(page.table["stack"], page.table["result"])) == [(OLD, "PASS"), (NEW, NOT_TESTED), (GPU, NOT_TESTED)]
    public = model_page(snapshot, zoo_catalog(), "Qwen/Qwen3-0.6B")
    assert list(public.table["result"]) == ["PASS", "FAIL_RUN", "PASS"] and len(public.results) == 3
    assert XSS_MODEL in model_names(snapshot, zoo_catalog()) and "Qwen/Qwen2.5-0.5B" in model_names(snapshot, zoo_catalog())


def test_a_result_detail_has_the_error_versions_run_py_command_timings_memory_and_devices(mixed_results):
    snapshot = load_snapshot(mixed_results)
    rows = {r["stack_id"]: r for r in model_page(snapshot, zoo_catalog(), "Qwen/Qwen3-0.6B").results}
    failed = result_detail(rows[NEW])
    assert failed.result == "FAIL_RUN" and failed.error.startswith("Traceback") and failed.error_line.startswith("RuntimeError: shape")
    assert json.loads(failed.versions)["libraries"]["transformers"] == "5.25.0"
    assert "print('probe qwen3')" in failed.run_py and failed.command.startswith("assay probe zoo/qwen3")
    gpu = dict(result_detail(rows[GPU]).facts.itertuples(index=False))
    assert gpu["devices"] == "cuda:0 ×2 (NVIDIA H200), tensor" and gpu["peak memory MB"] == "400.0"
    assert gpu["load s"] == "0.5" and gpu["total s (compilation included)"] == "6"
    assert run_py_filename(rows[GPU]) == f"run_assay-zoo_qwen3_{GPU}_float32.py"
    assert run_py_filename({"model": XSS_MODEL, "stack_id": NEW}).count("/") == 0


def test_an_empty_results_folder_shows_the_catalog_as_not_tested(tmp_path):
    folder = init_results(tmp_path / "results")
    snapshot = load_snapshot(folder)
    selected = list_view(snapshot, zoo_catalog(), SELECTED, Filters())
    assert selected.total == len(zoo_catalog().selected) and set(selected.table["result"]) == {NOT_TESTED}
    assert list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters()).note == "No results recorded yet."
    assert failure_groups(snapshot, Filters()).table.empty and pass_rates(snapshot).empty
    assert filter_choices(snapshot, zoo_catalog()).compilers == [ANY]
    assert model_page(snapshot, zoo_catalog(), "Qwen/Qwen3-0.6B").results == []
    for figure in (charts.pass_rate_figure(pass_rates(snapshot)), charts.compile_time_figure(per_model_costs(snapshot, ANY), None)):
        figure.canvas.draw()  # an empty chart says so instead of failing


def test_many_stacks_each_keep_their_own_result(tmp_path):
    folder = tmp_path / "results"
    stacks = [f"cpu-inductor-torch2.{i}.0-tf5.0.0-{i:08x}" for i in range(40)]
    write_rows(folder, [make_row(f"org/m{j}", stack=s, status="PASS" if (i + j) % 3 else "FAIL_RUN", compile_s=float(j + 1),
                                 versions=versions(f"2.{i}.0", "5.0.0")) for i, s in enumerate(stacks) for j in range(3)])
    snapshot = load_snapshot(folder)
    assert snapshot.stacks == tuple(sorted(stacks))
    assert len(filter_choices(snapshot, zoo_catalog()).compilers) == 41
    rates = pass_rates(snapshot)
    assert len(rates) == 40 and (rates["tested"] == 3).all() and rates["passed"].sum() == 80
    one = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(compiler="torch 2.7.0, triton 3.9.0"))
    assert _rows(one, "tested as", "stack") == [(f"org/m{j}", stacks[7]) for j in range(3)]
    assert len(model_page(snapshot, zoo_catalog(), "org/m1").table) == 40
    costs = per_model_costs(snapshot, stacks[0])
    assert list(costs["model"]) == ["org/m2", "org/m1", "org/m0"]
    charts.pass_rate_figure(rates).canvas.draw()
    charts.peak_memory_figure(costs, stacks[0]).canvas.draw()


def test_the_source_reads_the_folder_again_when_a_stack_file_changes(mixed_results):
    source = ResultsSource(mixed_results)
    first = source.snapshot()
    assert source.snapshot() is first  # unchanged files: no second read
    write_row(mixed_results, make_row("org/late-arrival", stack=NEW))
    assert "org/late-arrival" in set(source.snapshot().rows["model"])


def test_ten_thousand_rows_search_and_filter_correctly_and_fast(tmp_path):
    folder = tmp_path / "results"
    stacks = [f"cpu-inductor-torch2.1{i}.0-tf5.2{i}.0-{i:08x}" for i in range(5)]
    statuses = ["PASS", "PASS", "FAIL_RUN", "SKIPPED", "OOM"]
    rows = [make_row(f"org/model-{j:05d}", stack=s, status=statuses[(i + j) % 5], task="text-generation",
                     versions=versions(f"2.1{i}.0", f"5.2{i}.0"), error="RuntimeError: x at 0x1" if (i + j) % 5 == 2 else None)
            for i, s in enumerate(stacks) for j in range(2000)]
    write_rows(folder, rows)
    started = time.perf_counter()
    snapshot = load_snapshot(folder)
    load_s = time.perf_counter() - started
    assert len(snapshot.rows) == 10_000

    started = time.perf_counter()
    everything = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters())
    searched = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(text="MODEL-0123"))
    filtered = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(transformers="5.22.0", status="FAIL_RUN"))
    combined = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(text="model-01", compiler="torch 2.13.0, triton 3.9.0",
                                                                        device="cpu", status=SKIPPED, task="text-generation"))
    elapsed = time.perf_counter() - started
    assert everything.total == 10_000 and len(everything.table) == 500 and "first 500 of 10,000" in everything.note
    assert list(everything.table.columns) == LIST_COLUMNS
    assert searched.total == 50  # model-01230 .. model-01239 on 5 stacks
    expected = sum(1 for r in rows if r["stack_id"] == stacks[2] and r["status"] == "FAIL_RUN")
    assert filtered.total == expected == 400
    expected = sum(1 for r in rows if r["model"].startswith("org/model-01") and r["stack_id"] == stacks[3] and r["status"] == "SKIPPED")
    assert combined.total == expected and set(combined.table["result"]) == {SKIPPED}
    groups = failure_groups(snapshot, Filters())
    assert list(groups.table["count"]) == ["2000", "2000"]  # FAIL_RUN's one signature, OOM's reason-less status
    # The bench (bench/compat/app.py) measures properly; this only guards against an order-of-magnitude slip.
    assert elapsed / 4 < 1.0 and load_s < 10, (elapsed, load_s)
    assert all(view in VIEWS for view in (SELECTED, TRENDING, DOWNLOADS, ALL_RESULTS))


def test_every_status_has_its_colour_kind_and_other_text_has_none():
    from assay.app.results.status import STATUS_COLOURS, status_kind, status_style
    from assay.compat.results.schema import STATUSES

    kinds = {result_label: status_kind(result_label) for result_label in [*STATUSES, SKIPPED, NOT_TESTED]}
    assert kinds == {"PASS": "pass", "FAIL_ACCURACY": "failure", "FAIL_LOAD": "failure", "FAIL_COMPILE": "failure",
                     "FAIL_RUN": "failure", "OOM": "abnormal", "TIMEOUT": "abnormal", "CRASH": "abnormal", "SKIPPED": "neutral",
                     SKIPPED: "neutral", NOT_TESTED: "neutral"}
    assert status_style("PASS") == STATUS_COLOURS["pass"] and status_style("assay-zoo/qwen3") == "" and status_style(None) == ""


def test_a_links_query_names_a_view_and_unknown_values_are_left_out(mixed_results):
    from assay.app.results.query import View, view_from_query, view_query

    snapshot, catalog = load_snapshot(mixed_results), recorded_catalog()
    choices, names = filter_choices(snapshot, catalog), model_names(snapshot, catalog)
    asked = view_from_query({"model": "Qwen/Qwen3-0.6B", "stack": NEW, "status": "fail_run", "view": "all results", "q": " qwen ",
                             "device": "tpu", "task": "text-generation"}, choices, names)
    assert asked == View(ALL_RESULTS, Filters(text="qwen", status="FAIL_RUN", task="text-generation", stack=NEW), "Qwen/Qwen3-0.6B",
                         ("device",))
    assert view_from_query({"model": "nobody/nothing"}, choices, names) == View(model=None, ignored=("model",))
    # A link back: values percent-encoded (a name cannot end the href), defaults left out, and it reads back the same.
    query = view_query(ALL_RESULTS, asked.filters, XSS_MODEL)
    assert not set(query) & set('<>"\' ') and "view=All%20results" in query and "device" not in query
    from urllib.parse import parse_qsl

    back = view_from_query(dict(parse_qsl(query[1:])), choices, names + [XSS_MODEL])
    assert back == View(ALL_RESULTS, asked.filters, XSS_MODEL)
    assert view_query() == "?"


def test_failure_groups_list_dynamos_reasons_with_their_counts(mixed_results):
    groups = failure_groups(load_snapshot(mixed_results), Filters())
    table = {row["signature"]: row for _, row in groups.table.iterrows()}
    reasons = table["torch._dynamo.exc.Unsupported: call_function '…' in <path> line N"]["graph breaks and recompiles"]
    assert reasons.startswith(f"{SETATTR_BREAK} (2); recompile: tensor 'x' size mismatch")  # most frequent first
    assert table["RuntimeError: shape '…' is invalid for input of size N at <addr>"]["graph breaks and recompiles"] == ""


def test_drift_per_model_on_a_stack_and_per_stack_for_a_model(mixed_results):
    snapshot = load_snapshot(mixed_results)
    on_gpu = per_model_drift(snapshot, GPU)
    assert list(on_gpu["model"]) == ["assay-zoo/qwen3"] and on_gpu["max_rel"].iloc[0] == 5e-2
    assert per_model_drift(snapshot, NEW).empty  # no row of that stack has drift
    page = model_page(snapshot, zoo_catalog(), "Qwen/Qwen3-0.6B")
    curves = model_drift(page.results)
    assert sorted(label.split(" · ")[0] for label in curves) == sorted([GPU, OLD])
    assert curves[f"{GPU} · assay-zoo/qwen3 · float32"] == [1e-3, 2e-2, 5e-2]
    charts.model_drift_figure(curves, "Qwen/Qwen3-0.6B").savefig(mixed_results.parent / "drift.png")
    charts.drift_per_model_figure(on_gpu, GPU).savefig(mixed_results.parent / "drift_stack.png")
    assert (mixed_results.parent / "drift.png").stat().st_size > 5000


def test_a_triaged_result_detail_has_its_repro_and_says_whether_it_reproduces(mixed_results):
    page = model_page(load_snapshot(mixed_results), zoo_catalog(), "assay-zoo/mistral")
    rows = {row["stack_id"]: row for row in page.results}
    detail = result_detail(rows[NEW])
    assert detail.repro_py == REPRO_PY and "5 lines" in detail.repro_note and "reproduces the failure on its own" in detail.repro_note
    assert repro_py_filename(rows[NEW]) == f"repro_assay-zoo_mistral_{NEW}_float32.py"
    untriaged = result_detail(rows[OLD])
    assert untriaged.repro_py == "" and untriaged.repro_note.startswith("not triaged: assay triage RESULTS --model assay-zoo/mistral")
    facts = dict(zip(detail.facts["what"], detail.facts["value"]))
    assert SETATTR_BREAK in facts["graph breaks and recompiles (dynamo's reasons)"]


def test_a_model_page_shows_the_eval_table_next_to_the_drift_table(mixed_results):
    snapshot = load_snapshot(mixed_results)
    page = model_page(snapshot, zoo_catalog(), "Qwen/Qwen3-0.6B")
    assert list(page.table["eval"]) == ["AGREE 1.00", "", "DISAGREE 0.90"]  # OLD, NEW (no eval), GPU
    rows = {row["stack_id"]: row for row in page.results}
    gpu = result_detail(rows[GPU])
    assert list(gpu.eval["task"]) == ["assay_cloze", "assay_next_sentence"]
    cloze, sentence = (dict(zip(gpu.eval.columns, line)) for line in gpu.eval.itertuples(index=False))
    assert (sentence["device acc"], sentence["reference acc"], sentence["difference"], sentence["agreement"]) == ("0.52", "0.59", "-0.07", "0.90")
    assert cloze["items"] == "100" and cloze["device s"] == "12" and cloze["reference s"] == "30"
    assert gpu.eval_note.startswith("DISAGREE: assay_next_sentence: agreement 0.90 < 0.95") and "answers changed on 13 items: assay_cloze#0" in gpu.eval_note
    assert list(gpu.drift["step"]) == ["0", "1", "2"] and list(gpu.drift["max rel"]) == ["0.001", "0.02", "0.05"]
    plain = result_detail(rows[NEW])
    assert plain.eval.empty and plain.eval_note.startswith("no eval recorded") and plain.drift.empty
    listing = list_view(snapshot, zoo_catalog(), ALL_RESULTS, Filters(stack=GPU))
    assert list(listing.table["eval"]) == ["DISAGREE 0.90"]
    from assay.app.results.status import status_kind

    assert status_kind("DISAGREE 0.90") == "failure" and status_kind("AGREE 1.00") == "pass"


def test_building_the_app_makes_no_download_folder_until_a_page_offers_a_file(mixed_results, tmp_path, monkeypatch):
    # A process that builds the app and is killed before it exits (so its atexit clean-up never runs) left
    # an empty assay-app-* folder in the temporary directory every time; now the folder is made on the first
    # download a model page offers (tests/app/test_browser.py downloads through it).
    import tempfile

    from assay.app.ui import build_app

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    build_app(mixed_results, recorded_catalog())
    assert list(scratch.glob("assay-app-*")) == []
