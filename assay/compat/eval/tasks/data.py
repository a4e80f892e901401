"""The embedded tasks' dataset loader, named by their YAML (`custom_dataset: !function data.load`).

lm-eval loads this file by path, so the tasks work from any working folder, through assay or through
lm-eval's own `--include_path`: the JSONL beside this file becomes the test split, read with the json
module and handed to datasets in memory (no Hub, no datasets cache written)."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(data_file, **_):
    """{"test": the items of HERE/data_file}; lm-eval passes the YAML's metadata too, which is not needed."""
    import datasets

    lines = (HERE / data_file).read_text(encoding="utf-8").splitlines()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([json.loads(line) for line in lines if line.strip()])})
