"""The app in a real browser: headless Chromium (Debian's) driven by Playwright against `assay app` on loopback.

Gradio's table cells are virtualised: rows are waited for as attached, not visible.
"""

from __future__ import annotations

import pytest

from app.builders import GPU, NEW, OLD, REPRO_PY, XSS_ERROR, XSS_MODEL, XSS_RUN_PY

TIMEOUT_MS = 20_000


def _listing_has(page, text: str) -> None:
    page.locator("#listing").get_by_text(text, exact=True).first.wait_for(state="attached", timeout=TIMEOUT_MS)


def _listing_text(page) -> str:
    return page.locator("#listing").inner_text()


def _wait_listing(page, predicate, what: str) -> str:
    for _ in range(80):
        text = _listing_text(page)
        if predicate(text):
            return text
        page.wait_for_timeout(250)
    raise AssertionError(f"the table never showed {what}; it shows:\n{_listing_text(page)[:2000]}")


def _choose(page, elem_id: str, option: str) -> None:
    """Pick an option of a Gradio dropdown the way a user does: open it, type, click the option."""
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(option)
    page.locator(f'ul[role="listbox"] li[role="option"][aria-label="{option}"]').first.click()


def _wait_value(page, box, prefix: str) -> None:
    page.wait_for_function("([el, prefix]) => el.value.startsWith(prefix)", arg=[box.element_handle(), prefix], timeout=TIMEOUT_MS)


def _type(page, elem_id: str, text: str) -> None:
    """Replace a textbox's text by typing, as a user does (Gradio's input event follows key presses)."""
    box = page.locator(f"#{elem_id} textarea, #{elem_id} input").first
    box.click()
    box.press("Control+a")
    box.press("Backspace")
    box.press_sequentially(text, delay=20)


def _open(page, url: str) -> None:
    page.goto(url)
    _listing_has(page, "Qwen/Qwen3-0.6B")


@pytest.mark.slow
def test_search_filter_open_a_model_and_compare_two_stacks(served_app, page, tmp_path):
    _open(page, served_app)
    # Selected view: the catalog's picks, an untested one as "not tested", the skipped one as "skipped".
    text = _listing_text(page)
    assert "not tested" in text and "skipped" in text and "mistralai/Mistral-7B-v0.1" in text

    _type(page, "search", "gpt2")
    text = _wait_listing(page, lambda t: "Qwen/Qwen3-0.6B" not in t, "only gpt2 rows")
    assert "openai-community/gpt2" in text

    _type(page, "search", "")
    page.locator("#view").get_by_text("All results", exact=True).click()
    _choose(page, "filter-status", "FAIL_RUN")
    text = _wait_listing(page, lambda t: "assay-zoo/mistral" not in t and "assay-zoo/llama" in t, "the FAIL_RUN rows only")
    assert "assay-zoo/qwen3" in text and OLD not in text and "PASS" not in text

    _choose(page, "filter-status", "any")
    _choose(page, "filter-compiler", "torch 2.14.0, triton 3.10.0")
    text = _wait_listing(page, lambda t: "assay-zoo/gpt2" not in t, "only the GPU stack's row")
    assert "cuda:0" in text and "assay-zoo/qwen3" in text

    # Open the model by its row: its page lists every stack and shows the run.py that reproduces it.
    page.locator("#listing").get_by_text("assay-zoo/qwen3", exact=True).filter(visible=True).first.click()
    stacks = page.locator("#model-stacks")
    stacks.get_by_text(NEW, exact=True).first.wait_for(state="attached", timeout=TIMEOUT_MS)
    run_py = page.locator("#run-py")
    run_py.get_by_text("print('probe qwen3')").wait_for(timeout=TIMEOUT_MS)
    assert "FAIL_RUN" in stacks.inner_text() and "PASS" in stacks.inner_text()
    assert "assay probe zoo/qwen3" in page.locator("#command textarea, #command input").first.input_value()
    with page.expect_download() as download:
        page.locator("#download-run-py").click()
    assert download.value.suggested_filename == f"run_assay-zoo_qwen3_{GPU}_float32.py"
    assert "print('probe qwen3')" in open(download.value.path(), encoding="utf-8").read()
    page.screenshot(path=tmp_path / "model-page.png", full_page=True)

    page.get_by_role("tab", name="Compare stacks").click()
    diff = page.locator("#diff")
    _choose(page, "base", NEW)
    _choose(page, "new", OLD)  # backwards: the two regressions read as fixes
    summary = page.locator("#compare-summary textarea, #compare-summary input").first
    _wait_value(page, summary, f"{NEW} → {OLD}")
    assert "fixed 2" in summary.input_value()
    _choose(page, "base", OLD)
    _choose(page, "new", NEW)
    page.locator("#compare-button").click()
    _wait_value(page, summary, f"{OLD} → {NEW}")
    diff.get_by_text("regressed", exact=True).first.wait_for(state="attached", timeout=TIMEOUT_MS)
    cells = [line.strip() for line in diff.inner_text().splitlines() if line.strip()]
    kinds = [c for c in cells if c in ("regressed", "fixed", "both fail", "only base", "only new", "skipped")]
    # gpt2 is "skipped" twice: its change kind and its base result.
    assert kinds == ["regressed", "regressed", "both fail", "only base", "only new", "skipped", "skipped"], kinds
    assert "pass rate" in summary.input_value() and "regressed 2" in summary.input_value()
    page.screenshot(path=tmp_path / "compare.png", full_page=True)


@pytest.mark.slow
def test_a_planted_script_in_a_result_stays_text(served_app, page):
    _open(page, served_app)
    page.locator("#view").get_by_text("All results", exact=True).click()
    _type(page, "search", "evil/")
    _wait_listing(page, lambda t: "assay-zoo" not in t, "only the planted row")
    # The model name is shown literally in its cell (its <b> is characters, not bold).
    cell = page.locator("#listing").get_by_text(XSS_MODEL, exact=True).filter(visible=True).first
    cell.click()
    error_line = page.locator("#error-line textarea, #error-line input").first
    _wait_value(page, error_line, "<script>")
    assert error_line.input_value() == XSS_ERROR
    page.locator("#traceback-fold").get_by_text("full traceback").click()
    page.locator("#traceback").get_by_text(XSS_ERROR).wait_for(timeout=TIMEOUT_MS)
    page.locator("#run-py").get_by_text(XSS_RUN_PY.splitlines()[0]).wait_for(timeout=TIMEOUT_MS)
    page.locator("#model-stacks").get_by_text('<img src=z onerror="window.__xss=5">', exact=True).first.wait_for(state="attached")
    page.wait_for_timeout(500)  # an injected onerror would fire once the bad image source fails
    assert page.evaluate("window.__xss") is None
    assert page.locator("#listing b, #model-stacks b, #model-stacks img, #listing img, #traceback script").count() == 0


def _paste(page, elem_id: str, text: str) -> None:
    """Replace a textbox's text the way a paste does: Ctrl+V from the clipboard, no key press that types a character."""
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("text => navigator.clipboard.writeText(text)", text)
    box = page.locator(f"#{elem_id} textarea, #{elem_id} input").first
    box.click()
    box.press("Control+a")
    box.press("Control+v")
    page.wait_for_function("([el, text]) => el.value === text", arg=[box.element_handle(), text], timeout=TIMEOUT_MS)


@pytest.mark.slow
def test_pasting_or_cutting_the_search_text_filters_like_typing_it(served_app, page):
    _open(page, served_app)
    _paste(page, "search", "gpt2")
    text = _wait_listing(page, lambda t: "Qwen/Qwen3-0.6B" not in t, "only gpt2 rows after a paste")
    assert "openai-community/gpt2" in text
    box = page.locator("#search textarea, #search input").first
    box.press("Control+a")
    box.press("Control+x")  # cut: the value empties without a key that types
    _wait_listing(page, lambda t: "Qwen/Qwen3-0.6B" in t and "openai-community/gpt2" in t, "every row again after a cut")


def _cell_style(page, table: str, text: str) -> str:
    # role=gridcell: the grid a user sees (Gradio also keeps a hidden <table> to measure column widths).
    cell = page.locator(f"#{table} [role=gridcell]").filter(has=page.get_by_text(text, exact=True)).first
    # Gradio re-renders the grid after a view change: a cell found just before it is swapped out is detached,
    # and a detached element's computed style is empty. Read again until the cell read is in the document.
    for _ in range(80):
        cell.wait_for(state="attached", timeout=TIMEOUT_MS)
        colour = cell.evaluate("el => el.isConnected ? getComputedStyle(el).backgroundColor : ''")
        if colour:
            return colour
        page.wait_for_timeout(250)
    raise AssertionError(f"no cell of #{table} showing {text!r} stayed in the document long enough to read its colour")


@pytest.mark.slow
def test_statuses_are_coloured_and_keep_their_text(served_app, page):
    _open(page, served_app)
    page.locator("#view").get_by_text("All results", exact=True).click()
    _listing_has(page, "FAIL_COMPILE")
    colours = {status: _cell_style(page, "listing", status) for status in ("PASS", "FAIL_COMPILE", "skipped")}
    assert colours == {"PASS": "rgb(211, 240, 217)", "FAIL_COMPILE": "rgb(251, 213, 213)", "skipped": "rgb(229, 231, 235)"}, colours
    page.locator("#view").get_by_text("Selected", exact=True).click()
    _listing_has(page, "not tested")
    assert _cell_style(page, "listing", "not tested") == "rgb(229, 231, 235)"


@pytest.mark.slow
def test_a_link_opens_the_model_page_on_the_stack_it_names(served_app, page):
    page.goto(f"{served_app}?model=Qwen/Qwen3-0.6B&stack={NEW}")
    stacks = page.locator("#model-stacks")
    stacks.get_by_text(GPU, exact=True).first.wait_for(state="attached", timeout=TIMEOUT_MS)
    assert page.get_by_role("tab", name="Model", exact=True).get_attribute("aria-selected") == "true"
    result = page.locator("#result-line textarea, #result-line input").first
    _wait_value(page, result, "FAIL_RUN")  # the NEW stack's result, not the first stack's PASS
    assert _cell_style(page, "model-stacks", "FAIL_RUN") == "rgb(251, 213, 213)"
    link = page.locator("#model-link-a")
    assert link.get_attribute("href") == f"?model=Qwen%2FQwen3-0.6B&stack={NEW}"
    # The page's own link, followed, opens the same page.
    link.click()
    page.wait_for_url(f"**?model=Qwen%2FQwen3-0.6B&stack={NEW}")
    _wait_value(page, page.locator("#result-line textarea, #result-line input").first, "FAIL_RUN")


@pytest.mark.slow
def test_a_link_sets_the_listing_filters_and_names_what_it_could_not_use(served_app, page):
    page.goto(f"{served_app}?view=All%20results&status=fail_run&q=qwen&device=tpu")
    text = _wait_listing(page, lambda t: "assay-zoo/qwen3" in t and "assay-zoo/llama" not in t and "PASS" not in t,
                         "only qwen3's FAIL_RUN row")
    assert "FAIL_RUN" in text
    assert page.locator("#search textarea, #search input").first.input_value() == "qwen"
    page.locator("#link-note").get_by_text("device").wait_for(timeout=TIMEOUT_MS)
    assert page.locator("#view-link-a").get_attribute("href") == "?view=All%20results&q=qwen&status=FAIL_RUN"


@pytest.mark.slow
def test_a_triaged_failure_shows_its_repro_with_copy_and_download_and_the_drift_is_charted(served_app, page):
    page.goto(f"{served_app}?model=assay-zoo/mistral&stack={NEW}")
    _wait_value(page, page.locator("#result-line textarea, #result-line input").first, "FAIL_COMPILE")
    repro = page.locator("#repro-py")
    repro.get_by_text("rsqrt = torch.rsqrt(add)").wait_for(timeout=TIMEOUT_MS)
    note = page.locator("#repro-note textarea, #repro-note input").first
    _wait_value(page, note, "5 lines")
    assert "reproduces the failure on its own" in note.input_value()
    assert repro.locator("button").count() >= 2  # the code view's copy and download buttons
    with page.expect_download() as download:
        page.locator("#download-repro-py").click()
    assert download.value.suggested_filename == f"repro_assay-zoo_mistral_{NEW}_float32.py"
    assert open(download.value.path(), encoding="utf-8").read() == REPRO_PY
    # The model page charts its drift per step on each stack; the Charts tab per model on a stack.
    page.goto(f"{served_app}?model=Qwen/Qwen3-0.6B&stack={GPU}")
    _wait_value(page, page.locator("#result-line textarea, #result-line input").first, "PASS")
    page.locator("#model-drift img").first.wait_for(state="attached", timeout=TIMEOUT_MS)
    page.get_by_role("tab", name="Charts").click()
    page.locator("#drift-plot img").first.wait_for(state="attached", timeout=TIMEOUT_MS)


@pytest.mark.slow
def test_a_model_page_shows_the_eval_table_next_to_the_drift_table(served_app, page, tmp_path):
    page.goto(f"{served_app}?model=Qwen/Qwen3-0.6B&stack={GPU}")
    _wait_value(page, page.locator("#result-line textarea, #result-line input").first, "PASS")
    evals = page.locator("#eval-table")
    evals.get_by_text("assay_next_sentence", exact=True).first.wait_for(state="attached", timeout=TIMEOUT_MS)
    text = evals.inner_text()
    assert "assay_cloze" in text and "0.52" in text and "0.59" in text and "-0.07" in text and "0.90" in text
    page.locator("#drift-table").get_by_text("0.05", exact=True).first.wait_for(state="attached", timeout=TIMEOUT_MS)
    # The two tables sit side by side: the drift table's left edge is left of the eval table's, their tops level.
    drift_box, eval_box = page.locator("#drift-table").bounding_box(), evals.bounding_box()
    assert drift_box["x"] + drift_box["width"] <= eval_box["x"] + 1 and abs(drift_box["y"] - eval_box["y"]) < 40
    note = page.locator("#eval-note textarea, #eval-note input").first
    _wait_value(page, note, "DISAGREE: assay_next_sentence: agreement 0.90 < 0.95")
    # The eval's verdict in the per-stack table, coloured like a status (red: it disagreed; green: it agreed).
    assert _cell_style(page, "model-stacks", "DISAGREE 0.90") == "rgb(251, 213, 213)"
    assert _cell_style(page, "model-stacks", "AGREE 1.00") == "rgb(211, 240, 217)"
    page.screenshot(path=tmp_path / "model-eval.png", full_page=True)
