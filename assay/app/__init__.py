"""System 1's web app over the results dataset: data (pure functions), catalog, charts, ui (Gradio), space (export).

Gradio is imported only by assay.app.ui, so the data functions and the CLI's bad-input checks load fast.
"""
