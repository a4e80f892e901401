"""The Gradio app over a results folder: views, search and filters, a model's page, compare, failures, charts.

Every callback is a thin adapter over assay.app.results. Safety: every text that comes from a result or
the Hub (model names, errors, run.py, versions) reaches the page through a component that shows text
(Textbox, Code, Dropdown, Dataframe with datatype "str"), never through HTML or Markdown; the one
Markdown line per view is built from our own words and escaped anyway; the two links ("link to this
view", "link to this page") put result text only into a percent-encoded query string. The app is
read-only: no upload component, uploads refused by middleware, events kept out of the API listing.

Every filter listens to `.change`, which follows the value itself: typed, pasted, cleared, or set by
a handler (the link's query parameters, read by the page's load event). Gradio's `.input` on a
Textbox follows key presses only, so a paste or a cut never reached it.
"""

from __future__ import annotations

import atexit
import html
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry or version check calls from a server
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402

from assay.app import charts  # noqa: E402
from assay.app.catalog import Catalog  # noqa: E402
from assay.app.results.accuracy import DRIFT_COLUMNS, EVAL_COLUMNS  # noqa: E402
from assay.app.results.analysis import (  # noqa: E402
    DIFF_COLUMNS, GROUP_COLUMNS, compare_stacks, failure_groups, model_drift, pass_rates, per_model_costs, per_model_drift,
)
from assay.app.results.listing import LIST_COLUMNS, SELECTED, VIEWS, Filters, filter_choices, list_view  # noqa: E402
from assay.app.results.model_page import (  # noqa: E402
    MODEL_COLUMNS, model_names, model_page, repro_py_filename, result_detail, run_py_filename,
)
from assay.app.results.query import view_from_query, view_query  # noqa: E402
from assay.app.results.snapshot import ResultsSource  # noqa: E402
from assay.app.results.status import ANY, STATUS_COLOURS, status_style, status_summary  # noqa: E402
from assay.core.errors import AssayError  # noqa: E402
from assay.core.files import atomic_write_text  # noqa: E402

PRIVATE = "private"  # api_visibility of every event: served to this page, not listed as an API
UPLOAD_PATHS = ("/gradio_api/upload", "/upload")
# System fonts: the default theme pulls Google Fonts, which an offline Space or machine cannot reach.
THEME = gr.themes.Default(
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
)
CSS = ".assay-note p { margin: 0; } .assay-link { font-size: 0.9em; }"
STATUS_COLUMNS = {"listing": ["result", "eval"], "model": ["result", "eval"], "diff": ["base", "new", "base eval", "new eval"]}


def _coloured(frame, columns: list[str]):
    """The table with its status cells coloured: Gradio's value dict with per-cell CSS in its metadata.

    The same thing a pandas Styler gives Gradio, built directly: the Styler renders the whole table to
    HTML first, which cost 15x the plain table's time for 500 rows.
    """
    if frame is None or len(frame) == 0:
        return frame
    coloured = {i for i, name in enumerate(frame.columns) if name in columns}
    data = frame.to_numpy(dtype=object).tolist()
    styling = [[status_style(cell) if i in coloured else "" for i, cell in enumerate(row)] for row in data]
    return {"headers": list(frame.columns), "data": data, "metadata": {"styling": styling, "display_value": None}}


def _link(query: str, words: str, elem_id: str) -> str:
    # `query` comes from view_query: every value percent-encoded, so result text cannot leave the href.
    return f'<a class="assay-link" id="{elem_id}" href="{html.escape(query)}">{html.escape(words)}</a>'


def _legend() -> str:
    swatches = {"pass": "PASS", "failure": "FAIL_*", "abnormal": "TIMEOUT / OOM / CRASH", "neutral": "skipped / not tested"}
    return " ".join(f'<span class="assay-status" style="{STATUS_COLOURS[kind]}; padding: 1px 6px; border-radius: 4px">'
                    f"{html.escape(words)}</span>" for kind, words in swatches.items())


class RefuseUploads:
    """ASGI middleware: the app only reads; Gradio's generic upload route answers 403."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path", "").rstrip("/").endswith(UPLOAD_PATHS):
            await send({"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"this app is read-only"})
            return
        await self.app(scope, receive, send)


def launch_options(host: str | None = None, port: int | None = None) -> dict:
    """Keyword arguments for Blocks.launch shared by `assay app` and an exported Space's app.py."""
    from starlette.middleware import Middleware

    return dict(
        server_name=host, server_port=port, theme=THEME, css=CSS, footer_links=[], show_error=False, quiet=True,
        ssr_mode=False, mcp_server=False, pwa=False, enable_monitoring=False, max_file_size=1,
        app_kwargs={"middleware": [Middleware(RefuseUploads)]},
    )


def _note(text: str) -> str:
    return html.escape(text, quote=False)


def _table(headers: list[str], label: str | None = None, wrap: bool = False, **kwargs) -> gr.Dataframe:
    # datatype "str": a cell is text; "markdown" or "html" would render what a result's text holds.
    return gr.Dataframe(
        headers=headers, datatype="str", interactive=False, wrap=wrap, label=label, show_label=label is not None,
        max_chars=120, buttons=["copy", "fullscreen"], **kwargs,
    )


@dataclass
class _Controls:
    view: gr.Radio
    search: gr.Textbox
    compiler: gr.Dropdown
    transformers: gr.Dropdown
    device: gr.Dropdown
    status: gr.Dropdown
    task: gr.Dropdown
    stack: gr.Dropdown

    def inputs(self) -> list:
        return [self.view, self.search, self.compiler, self.transformers, self.device, self.status, self.task, self.stack]


def build_app(folder: str | Path, catalog: Catalog) -> gr.Blocks:
    source = ResultsSource(folder)
    made: list[Path] = []  # the download folder, made when a page first offers a file: an app that never does leaves none

    def download_path(name: str) -> Path:
        if not made:
            made.append(Path(tempfile.mkdtemp(prefix="assay-app-")))
            atexit.register(shutil.rmtree, made[0], True)
        return made[0] / name

    snapshot = source.snapshot()
    choices = filter_choices(snapshot, catalog)
    stacks = list(snapshot.stacks)

    def listing(view, text, compiler, transformers, device, status, task, stack):
        filters = Filters(text or "", compiler or ANY, transformers or ANY, device or ANY, status or ANY, task or ANY, stack or ANY)
        result = list_view(source.snapshot(), catalog, view or SELECTED, filters)
        return (_coloured(result.table, STATUS_COLUMNS["listing"]), _note(result.note),
                _link(view_query(view or SELECTED, filters), "link to this view", "view-link-a"))

    def load_view(request: gr.Request):
        """Fresh choices for every dropdown, then the view the URL's query parameters ask for."""
        current = filter_choices(source.snapshot(), catalog)
        names = model_names(source.snapshot(), catalog)
        stack_ids = list(source.snapshot().stacks)
        asked = view_from_query(dict(request.query_params) if request else {}, current, names)
        wanted = asked.filters
        controls_update = [
            gr.Radio(value=asked.view), gr.Textbox(value=wanted.text),
            gr.Dropdown(choices=current.compilers, value=wanted.compiler),
            gr.Dropdown(choices=current.transformers, value=wanted.transformers),
            gr.Dropdown(choices=current.devices, value=wanted.device), gr.Dropdown(value=wanted.status),
            gr.Dropdown(choices=current.tasks, value=wanted.task), gr.Dropdown(choices=current.stacks, value=wanted.stack),
        ]
        others = [gr.Dropdown(choices=stack_ids), gr.Dropdown(choices=stack_ids), gr.Dropdown(choices=current.stacks),
                  gr.Dropdown(choices=stack_ids)]
        if asked.model is None:
            page = [gr.Dropdown(choices=names), gr.skip(), *[gr.skip()] * len(model_components)]
        else:
            preferred = wanted.stack if wanted.stack != ANY else None
            page = [gr.Dropdown(choices=names, value=asked.model), gr.Tabs(selected="model"), *open_model(asked.model, stack=preferred)]
        ignored = (f"The link's {', '.join(asked.ignored)} {'is' if len(asked.ignored) == 1 else 'are'} not offered here and "
                   "was left out." if asked.ignored else "")
        return [*controls_update, *others, *page, _note(ignored)]

    def detail_outputs(page, label):
        rows = {lbl: row for lbl, row in zip(page.labels, page.results)}
        row = rows.get(label) if label in rows else (page.results[0] if page.results else None)
        if row is None:
            return ("not tested on any stack", "", "", "", "", gr.Dataframe(value=None), "", "",
                    gr.DownloadButton(value=None, interactive=False), _link(view_query(model=page.key), "link to this page", "model-link-a"),
                    "", "", gr.DownloadButton(value=None, interactive=False), None, gr.Dataframe(value=None), gr.Dataframe(value=None), "")
        detail = result_detail(row)
        path = download_path(run_py_filename(row))
        atomic_write_text(path, detail.run_py)
        repro_button = gr.DownloadButton(value=None, interactive=False)
        if detail.repro_py:
            repro_path = download_path(repro_py_filename(row))
            atomic_write_text(repro_path, detail.repro_py)
            repro_button = gr.DownloadButton(value=str(repro_path), interactive=True)
        result_line = detail.result + (f": {detail.reason}" if detail.reason else "")
        link = _link(view_query(model=page.key, filters=Filters(stack=row["stack_id"])), "link to this page", "model-link-a")
        return (result_line, detail.error_line, detail.error, detail.stack_label, detail.command, detail.facts,
                detail.versions, detail.run_py, gr.DownloadButton(value=str(path), interactive=bool(detail.run_py)), link,
                detail.repro_note, detail.repro_py, repro_button, charts.model_drift_figure(model_drift(page.results), page.key),
                detail.drift, detail.eval, detail.eval_note)

    def open_model(key, preferred=None, stack=None):
        if not key:
            return ["", gr.Dataframe(value=None), gr.Dropdown(choices=[], value=None), "", "", "", "", "", gr.Dataframe(value=None),
                    "", "", gr.DownloadButton(value=None, interactive=False), "", "", "", gr.DownloadButton(value=None, interactive=False), None,
                    gr.Dataframe(value=None), gr.Dataframe(value=None), ""]
        page = model_page(source.snapshot(), catalog, key)
        if stack and preferred is None:  # a link's stack: the first result recorded on it
            preferred = next((label for label, row in zip(page.labels, page.results) if row["stack_id"] == stack), None)
        entry = page.catalog_entry
        count = lambda n: "?" if n is None else f"{n:,}"  # noqa: E731
        about = (f"{key}: task {entry.task or '?'}, downloads {count(entry.downloads)}, likes {count(entry.likes)}, "
                 f"trending score {count(entry.trending_score)}") if entry else f"{key}: not in the catalog"
        label = preferred if preferred in page.labels else (page.labels[0] if page.labels else None)
        return [about, _coloured(page.table, STATUS_COLUMNS["model"]), gr.Dropdown(choices=page.labels, value=label),
                *detail_outputs(page, label)]

    def show_detail(key, label):
        if not key:
            return open_model(None)[3:]
        return detail_outputs(model_page(source.snapshot(), catalog, key), label)

    def pick_row(evt: gr.SelectData):
        row = evt.row_value or []
        values = dict(zip(LIST_COLUMNS, row))
        key = values.get("model") or values.get("tested as")
        preferred = f"{values.get('stack')} · {values.get('tested as')} · {values.get('dtype') or '-'}"
        return [gr.Tabs(selected="model"), gr.Dropdown(value=key), *open_model(key, preferred)]

    def compare(base, new):
        if not base or not new:
            return "Choose a base stack and a new stack.", None
        try:
            result = compare_stacks(source.folder, base, new)
        except AssayError as exc:
            return str(exc), None
        return result.summary, _coloured(result.table, STATUS_COLUMNS["diff"])

    def groups(stack, text):
        result = failure_groups(source.snapshot(), Filters(text=text or "", stack=stack or ANY))
        return result.table

    def group_members(stack, text, evt: gr.SelectData):
        values = dict(zip(GROUP_COLUMNS, evt.row_value or []))
        result = failure_groups(source.snapshot(), Filters(text=text or "", stack=stack or ANY))
        members = result.models.get(values.get("signature"), [])
        return f"{values.get('signature', '')}\n\n" + "\n".join(members)

    def stack_charts(stack):
        costs = per_model_costs(source.snapshot(), stack)
        return (charts.compile_time_figure(costs, stack), charts.peak_memory_figure(costs, stack),
                charts.drift_per_model_figure(per_model_drift(source.snapshot(), stack), stack))

    def all_charts(stack):
        return (charts.pass_rate_figure(pass_rates(source.snapshot())), *stack_charts(stack))

    legend = "; ".join(f"**{name}**: {html.escape(text)}" for name, text in status_summary().items())
    initial = list_view(snapshot, catalog, SELECTED, Filters())

    with gr.Blocks(title="assay results", analytics_enabled=False, fill_width=True) as demo:
        gr.Markdown("## assay: which models run on which stack\nA result holds only for the stack that produced it. "
                    "*Not tested* and *skipped* are not failures.")
        with gr.Accordion("What the results mean", open=False):
            gr.HTML(_legend(), elem_id="status-legend")
            gr.Markdown(legend)
        with gr.Tabs() as tabs:
            with gr.Tab("Models", id="models"):
                with gr.Row():
                    view = gr.Radio(list(VIEWS), value=SELECTED, label="view", scale=2, elem_id="view")
                    search = gr.Textbox(label="search model name", placeholder="part of a model name", scale=2, elem_id="search")
                with gr.Row():
                    controls = _Controls(
                        view, search,
                        gr.Dropdown(choices.compilers, value=ANY, label="compiler", elem_id="filter-compiler"),
                        gr.Dropdown(choices.transformers, value=ANY, label="transformers", elem_id="filter-transformers"),
                        gr.Dropdown(choices.devices, value=ANY, label="device", elem_id="filter-device"),
                        gr.Dropdown(choices.statuses, value=ANY, label="status", elem_id="filter-status"),
                        gr.Dropdown(choices.tasks, value=ANY, label="task", elem_id="filter-task"),
                        gr.Dropdown(choices.stacks, value=ANY, label="stack", elem_id="filter-stack"),
                    )
                with gr.Row():
                    note = gr.Markdown(_note(initial.note), elem_id="listing-note", elem_classes="assay-note")
                    view_link = gr.HTML(_link("?", "link to this view", "view-link-a"), elem_id="view-link", scale=0, min_width=160)
                link_note = gr.Markdown("", elem_id="link-note", elem_classes="assay-note")
                table = _table(LIST_COLUMNS, value=_coloured(initial.table, STATUS_COLUMNS["listing"]), elem_id="listing",
                               max_height=620, pinned_columns=2)
            with gr.Tab("Model", id="model"):
                model_choice = gr.Dropdown(model_names(snapshot, catalog), value=None, label="model", filterable=True,
                                           elem_id="model-choice")
                about = gr.Textbox(label="catalog", interactive=False, elem_id="model-about")
                model_link = gr.HTML("", elem_id="model-link")
                per_stack = _table(MODEL_COLUMNS, label="result on each stack", elem_id="model-stacks")
                result_choice = gr.Dropdown([], label="result to show", elem_id="result-choice")
                with gr.Row():
                    result_line = gr.Textbox(label="result", interactive=False, elem_id="result-line")
                    error_line = gr.Textbox(label="error", interactive=False, elem_id="error-line")
                with gr.Accordion("full traceback", open=False, elem_id="traceback-fold"):
                    error_full = gr.Code(language=None, label="traceback", interactive=False, elem_id="traceback", buttons=["copy"])
                stack_label = gr.Textbox(label="stack", interactive=False, elem_id="stack-label")
                command = gr.Textbox(label="reproduce with", interactive=False, buttons=["copy"], elem_id="command")
                with gr.Row():
                    facts = _table(["what", "value"], label="timings, memory, devices", elem_id="facts", scale=1, wrap=True,
                                   column_widths=["55%", "45%"])
                    with gr.Column(scale=1):
                        with gr.Accordion("versions of the whole stack", open=False):
                            versions = gr.Code(language="json", label="versions", interactive=False, elem_id="versions")
                run_py = gr.Code(language="python", label="run.py", interactive=False, buttons=["copy", "download"], elem_id="run-py")
                download = gr.DownloadButton("Download run.py", interactive=False, elem_id="download-run-py")
                eval_line = gr.Textbox(label="task accuracy: the eval's verdict (assay probe --eval; docs/dataset.md)", interactive=False,
                                       elem_id="eval-note")
                with gr.Row():
                    drift_detail = _table(DRIFT_COLUMNS, label="logit drift per compared step", elem_id="drift-table", scale=1,
                                          max_height=320)
                    eval_detail = _table(EVAL_COLUMNS, label="task accuracy: device next to the CPU eager reference", elem_id="eval-table",
                                         scale=2)
                model_drift_plot = gr.Plot(label="logit drift per step, per stack", format="png", elem_id="model-drift")
                repro_note = gr.Textbox(label="minified repro (assay triage; docs/triage.md)", interactive=False, elem_id="repro-note")
                repro_code = gr.Code(language="python", label="repro.py", interactive=False, buttons=["copy", "download"], elem_id="repro-py")
                download_repro = gr.DownloadButton("Download repro.py", interactive=False, elem_id="download-repro-py")
            with gr.Tab("Compare stacks", id="compare"):
                with gr.Row():
                    base = gr.Dropdown(stacks, value=stacks[0] if len(stacks) > 1 else None, label="base stack", elem_id="base")
                    new = gr.Dropdown(stacks, value=stacks[1] if len(stacks) > 1 else None, label="new stack", elem_id="new")
                    compare_button = gr.Button("Compare", elem_id="compare-button", scale=0)
                first_summary, first_table = compare(*stacks[:2]) if len(stacks) > 1 else ("Two stacks are needed to compare.", None)
                summary = gr.Textbox(first_summary, label="summary", interactive=False, elem_id="compare-summary")
                diff_table = _table(DIFF_COLUMNS, label="per model, regressions first", elem_id="diff", max_height=560, value=first_table)
            with gr.Tab("Failures", id="failures"):
                with gr.Row():
                    group_stack = gr.Dropdown(choices.stacks, value=ANY, label="stack", elem_id="group-stack")
                    group_search = gr.Textbox(label="search model name", elem_id="group-search")
                group_table = _table(GROUP_COLUMNS, label="failures grouped by error signature", elem_id="groups",
                                     value=failure_groups(snapshot, Filters()).table, max_height=520)
                members = gr.Textbox(label="models in the chosen group", lines=6, interactive=False, elem_id="group-members")
            with gr.Tab("Charts", id="charts"):
                pass_plot = gr.Plot(label="pass rate per stack", format="png")
                chart_stack = gr.Dropdown(stacks, value=stacks[0] if stacks else None, label="stack for the per-model charts")
                with gr.Row():
                    compile_plot = gr.Plot(label="compile time per model", format="png")
                    memory_plot = gr.Plot(label="peak memory per model", format="png")
                drift_plot = gr.Plot(label="logit drift per model", format="png", elem_id="drift-plot")

        detail_components = [result_line, error_line, error_full, stack_label, command, facts, versions, run_py, download, model_link,
                             repro_note, repro_code, download_repro, model_drift_plot, drift_detail, eval_detail, eval_line]
        model_components = [about, per_stack, result_choice, *detail_components]
        events = dict(api_visibility=PRIVATE, trigger_mode="always_last", show_progress="hidden")
        # One listener for every control: its runs queue one after another and the last one wins. A listener
        # per control would run side by side, and an older request finishing last would show a stale table.
        gr.on([control.change for control in controls.inputs()], listing, controls.inputs(), [table, note, view_link], **events)
        table.select(pick_row, None, [tabs, model_choice, *model_components], api_visibility=PRIVATE)
        model_choice.input(open_model, [model_choice], model_components, **events)
        result_choice.input(show_detail, [model_choice, result_choice], detail_components, **events)
        gr.on([compare_button.click, base.input, new.input], compare, [base, new], [summary, diff_table], **events)
        gr.on([group_stack.change, group_search.change], groups, [group_stack, group_search], [group_table], **events)
        group_table.select(group_members, [group_stack, group_search], [members], api_visibility=PRIVATE)
        chart_stack.change(stack_charts, [chart_stack], [compile_plot, memory_plot, drift_plot], **events)
        demo.load(load_view, None, [*controls.inputs(), base, new, group_stack, chart_stack, model_choice, tabs, *model_components,
                                    link_note], api_visibility=PRIVATE)
        demo.load(all_charts, [chart_stack], [pass_plot, compile_plot, memory_plot, drift_plot], api_visibility=PRIVATE)
    return demo
