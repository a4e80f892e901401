"""What the app shows, as pure functions over the results dataset: no Gradio here.

The folder's stack files are read once into a light index (no run.py, no token lists; errors kept
only as their signature) and read again when a file changes. Searching and filtering run over that
index in memory; a model's page reads its full rows with DuckDB. Nothing here writes to the folder.

Statuses as shown: a recorded status (PASS, FAIL_*, OOM, TIMEOUT, CRASH), "skipped" for a
deliberate SKIPPED, and "not tested" for a catalog model with no row: the last two never count as
failures.

The code lives in assay.app.results, one module per concern; this module keeps every public name
importable from where it always was.
"""

from assay.app.results.analysis import (  # noqa: F401
    DIFF_COLUMNS, GROUP_COLUMNS, PASS_RATE_COLUMNS, Comparison, FailureGroups, compare_stacks, failure_groups, group_reasons,
    model_drift, pass_rates, per_model_costs, per_model_drift,
)
from assay.app.results.listing import (  # noqa: F401
    ALL_RESULTS, DEFAULT_LIMIT, DOWNLOADS, LIST_COLUMNS, SELECTED, TRENDING, VIEWS, Choices, Filters, Listing, filter_choices,
    filter_results, list_view,
)
from assay.app.results.model_page import (  # noqa: F401
    MODEL_COLUMNS, ModelPage, ResultDetail, model_names, model_page, repro_note, repro_py_filename, result_detail,
    run_py_filename,
)
from assay.app.results.query import QUERY_KEYS, View, view_from_query, view_query  # noqa: F401
from assay.app.results.snapshot import ResultsSource, Snapshot, load_snapshot  # noqa: F401
from assay.app.results.status import (  # noqa: F401
    ANY, ANY_FAILURE, NOT_TESTED, SKIPPED, STATUS_COLOURS, compiler_version, result_label, status_kind, status_style,
    status_summary, transformers_version,
)
