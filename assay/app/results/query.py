"""Links to a view: the query parameters a link carries, read into a view and written from one."""

from __future__ import annotations

from dataclasses import dataclass

from assay.app.results.listing import SELECTED, VIEWS, Choices, Filters
from assay.app.results.status import ANY

# The query parameters a link may carry, in the order a link writes them.
QUERY_KEYS = ("model", "stack", "view", "q", "status", "compiler", "transformers", "device", "task")


@dataclass(frozen=True)
class View:
    """What a URL asks the app to show: the Models tab's controls, and a model page when `model` is set."""

    view: str = SELECTED
    filters: Filters = Filters()
    model: str | None = None  # open this model's page
    ignored: tuple[str, ...] = ()  # parameters whose value is not one the app offers


def view_from_query(params: dict[str, str], choices: Choices, names: list[str]) -> View:
    """The view a link's query parameters ask for; values the app does not offer are ignored (and listed)."""
    ignored: list[str] = []

    def pick(key: str, offered: list[str] | tuple[str, ...]) -> str | None:
        wanted = (params.get(key) or "").strip()
        if not wanted:
            return None
        by_lower = {o.lower(): o for o in offered}
        if wanted.lower() in by_lower:
            return by_lower[wanted.lower()]
        ignored.append(key)
        return None

    model = (params.get("model") or "").strip() or None
    if model is not None and model not in names:
        ignored.append("model")
        model = None
    filters = Filters(
        text=(params.get("q") or "").strip(), compiler=pick("compiler", choices.compilers) or ANY,
        transformers=pick("transformers", choices.transformers) or ANY, device=pick("device", choices.devices) or ANY,
        status=pick("status", choices.statuses) or ANY, task=pick("task", choices.tasks) or ANY,
        stack=pick("stack", choices.stacks) or ANY,
    )
    return View(pick("view", VIEWS) or SELECTED, filters, model, tuple(ignored))


def view_query(view: str = SELECTED, filters: Filters = Filters(), model: str | None = None) -> str:
    """The query string (with its "?") of a link that opens the app on this view; every value percent-encoded."""
    from urllib.parse import urlencode

    values = {"model": model, "stack": filters.stack, "view": view, "q": filters.text.strip(), "status": filters.status,
              "compiler": filters.compiler, "transformers": filters.transformers, "device": filters.device, "task": filters.task}
    defaults = {"view": SELECTED}
    kept = {k: values[k] for k in QUERY_KEYS if values[k] and values[k] != ANY and values[k] != defaults.get(k)}
    return "?" + urlencode(kept, quote_via=_quote_all) if kept else "?"


def _quote_all(text, safe="", encoding=None, errors=None) -> str:
    from urllib.parse import quote

    # Nothing but [A-Za-z0-9_.~-] and %XX: a model name cannot close the href or start markup.
    return quote(text, safe="", encoding=encoding, errors=errors)
