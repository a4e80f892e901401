"""The benchmark scripts, one folder per system (serve, train, gla, compat, core); each runs as `python bench/<system>/<name>.py`."""
