"""The results dataset: its schema, the Parquet files and their queries, stack diffs and error signatures (torch-free: the app reads it)."""
