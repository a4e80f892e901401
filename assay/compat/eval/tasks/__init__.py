"""The embedded eval tasks (`assay probe --eval`): lm-eval task files that run offline.

Each task is a YAML file (lm-eval's task format) and its items in a JSONL file beside it, built from
the prose CPython ships by build.py; data.py is the loader the YAML files name. The folder works as
lm-eval's `--include_path` as it is."""
