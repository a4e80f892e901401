"""What the app shows, as pure functions over the results dataset, by concern (no Gradio here):
status.py (statuses, colours, versions), cells.py (values as table cells), snapshot.py (the index
read from the folder), listing.py (views, filters, search), query.py (links to a view),
model_page.py (a model's page), analysis.py (compare, failure groups, chart numbers).
Callers import each name from its module."""
