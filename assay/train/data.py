"""Training data: text from the embedded corpus, a local file or a `datasets` name, tokenised with
the checkpoint's tokenizer, packed into fixed windows and split across data-parallel ranks.

Packing: documents are concatenated with the end-of-text token between them, then cut into windows
of seq_len + 1 tokens with stride seq_len (inputs are the first seq_len tokens, labels the last
seq_len). Each epoch visits every window once in an order drawn from the seed.

Global batch `batch` rows per step; data-parallel rank r of n takes rows [r*batch/n, (r+1)*batch/n).
Which windows a step reads is a function of (seed, step) only, so the ranks' rows are disjoint,
together they are the single-process batch, and resuming at step s reads what step s would have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from assay.core.errors import AssayError

TEXT_SUFFIXES = (".txt", ".md", ".text")
# Labels equal to this are not scored (the Transformers convention, and F.cross_entropy's default):
# a synthetic task (assay.recall's associative recall) trains only on its answer positions.
IGNORE_INDEX = -100
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class DataSource:
    """source: None for the embedded corpus, a local file, or a `datasets` name (Hub or local script)."""

    source: str | None = None
    text_field: str = "text"
    split: str = "train"

    def describe(self) -> str:
        return self.source or "embedded corpus (train split)"


def load_texts(data: DataSource) -> list[str]:
    """The documents of a data source, in a fixed order."""
    if data.source is None:
        from assay.zoo.corpus import corpus_split

        return [corpus_split()[0]]
    path = Path(data.source)
    if path.is_file():
        return _read_file(path, data.text_field)
    if path.exists():
        raise AssayError(f"--data {data.source}: a folder; pass one .txt, .json, .jsonl or .parquet file")
    if path.suffix.lower() in (*TEXT_SUFFIXES, *JSON_SUFFIXES, *PARQUET_SUFFIXES) or data.source.startswith((".", "/", "~")):
        raise AssayError(f"--data {data.source}: no such file")
    return _load_dataset(data)


def _read_file(path: Path, text_field: str) -> list[str]:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as error:  # pyarrow raises several types for a file that is not Parquet
            raise AssayError(f"cannot read {path} as Parquet: {error}") from None
        if text_field not in schema.names:
            raise AssayError(f"{path} has no column {text_field!r} (columns: {', '.join(schema.names)}); pass --text-field")
        return [str(text) for text in pq.read_table(path, columns=[text_field]).column(text_field).to_pylist() if text]
    if suffix in JSON_SUFFIXES:
        return _json_texts(path, text_field)
    try:
        return [path.read_text(encoding="utf-8")]
    except UnicodeDecodeError:
        raise AssayError(f"{path} is not UTF-8 text (expected .txt, .json, .jsonl or .parquet)") from None


def _json_texts(path: Path, text_field: str) -> list[str]:
    raw = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json" and raw.lstrip().startswith("["):
            records = json.loads(raw)
        else:
            records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise AssayError(f"{path} is not JSON or JSON Lines: {error}") from None
    texts = []
    for number, record in enumerate(records):
        if isinstance(record, str):
            texts.append(record)
        elif isinstance(record, dict) and text_field in record:
            texts.append(str(record[text_field]))
        else:
            keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise AssayError(f"{path} record {number} has no field {text_field!r} ({keys}); pass --text-field")
    return [text for text in texts if text]


def _load_dataset(data: DataSource) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise AssayError(f"--data {data.source} is not a file, and the `datasets` package to load it by name is not installed") from None
    try:
        dataset = datasets.load_dataset(data.source, split=data.split)
    except Exception as error:  # offline, unknown name, bad split: datasets raises many types
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise AssayError(f"cannot load dataset {data.source!r} (split {data.split}) with datasets.load_dataset: {first_line}") from None
    if data.text_field not in dataset.column_names:
        raise AssayError(f"dataset {data.source!r} has no column {data.text_field!r} (columns: {', '.join(dataset.column_names)}); pass --text-field")
    return [str(text) for text in dataset[data.text_field] if text]


def load_tokenizer(checkpoint: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(checkpoint))
    except (OSError, ValueError) as error:
        raise AssayError(f"cannot load the tokenizer of {checkpoint}: {str(error).splitlines()[0]}") from None


def tokenize(texts: list[str], tokenizer, vocab_size: int) -> torch.Tensor:
    """One stream of token ids: each document followed by the end-of-text token (when the tokenizer has one)."""
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in encoded:
        stream.extend(ids)
        if eos is not None:
            stream.append(eos)
    tokens = torch.tensor(stream, dtype=torch.long)
    if len(tokens) and int(tokens.max()) >= vocab_size:
        raise AssayError(f"the tokenizer produced id {int(tokens.max())}, outside the model's vocabulary of {vocab_size}")
    return tokens


class PackedBatches:
    """Step -> (inputs, labels) for this data-parallel rank; stateless apart from a per-epoch order cache."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch: int, seed: int = 0, dp_rank: int = 0, dp_size: int = 1):
        if seq_len < 1 or batch < 1:
            raise AssayError(f"--seq-len and --batch must be >= 1 (got {seq_len}, {batch})")
        if batch % dp_size:
            raise AssayError(f"--batch {batch} does not split over {dp_size} data-parallel ranks")
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch = batch
        self.seed = seed
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.n_windows = (len(tokens) - 1) // seq_len if len(tokens) > 1 else 0
        if self.n_windows < batch:
            raise AssayError(
                f"the data has {len(tokens)} tokens: {self.n_windows} windows of {seq_len + 1}, fewer than one batch of {batch}"
            )
        self._orders: dict[int, torch.Tensor] = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders = {epoch: torch.randperm(self.n_windows, generator=generator)}  # keep one epoch
        return self._orders[epoch]

    def window_ids(self, step: int) -> list[int]:
        """The windows of the whole (global) batch of a step, in row order."""
        ids = []
        for row in range(self.batch):
            position = step * self.batch + row
            ids.append(int(self._order(position // self.n_windows)[position % self.n_windows]))
        return ids

    def local_rows(self) -> slice:
        rows = self.batch // self.dp_size
        return slice(self.dp_rank * rows, (self.dp_rank + 1) * rows)

    def batch_for(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels), each [batch / dp_size, seq_len], for this rank at this step."""
        ids = self.window_ids(step)[self.local_rows()]
        windows = torch.stack([self.tokens[w * self.seq_len : w * self.seq_len + self.seq_len + 1] for w in ids])
        return windows[:, :-1], windows[:, 1:]

    def tokens_consumed(self, step: int) -> int:
        """Global tokens read before `step` (the data position a checkpoint records)."""
        return step * self.batch * self.seq_len


@runtime_checkable
class BatchSource(Protocol):
    """What the trainer reads batches from: PackedBatches (text) or a synthetic task's generator.

    batch_for(step) -> (inputs, labels), each [rows of this rank, seq_len]; labels IGNORE_INDEX where
    no loss is taken. A pure function of step, so resuming at step s reads what step s would have.
    """

    def batch_for(self, step: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def tokens_consumed(self, step: int) -> int: ...
