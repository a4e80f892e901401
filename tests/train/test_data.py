"""Training data: sources (corpus, text, JSON(L), Parquet, datasets name), packing, and the split across ranks."""

from __future__ import annotations

import json

import pytest
import torch

from assay.core.errors import AssayError
from assay.train.data import DataSource, PackedBatches, load_texts, load_tokenizer, tokenize

DOCUMENTS = [f"Document number {i} talks about functions, classes and modules in Python." * 3 for i in range(40)]


@pytest.fixture(scope="module")
def tokenizer(train_zoo):
    return load_tokenizer(train_zoo / "qwen3")


def test_two_ranks_batches_are_disjoint_and_together_equal_the_single_process_batch():
    tokens = torch.arange(10_000)  # every window is distinct: its first token says which one it is
    single = PackedBatches(tokens, seq_len=16, batch=8, seed=3)
    ranks = [PackedBatches(tokens, seq_len=16, batch=8, seed=3, dp_rank=r, dp_size=2) for r in range(2)]
    for step in (0, 1, 7, 700):  # 700: past the first epoch (624 windows), into a reshuffled one
        whole_inputs, whole_labels = single.batch_for(step)
        parts = [rank.batch_for(step) for rank in ranks]
        starts = [set(part[0][:, 0].tolist()) for part in parts]
        assert starts[0].isdisjoint(starts[1])
        assert torch.equal(torch.cat([part[0] for part in parts]), whole_inputs)
        assert torch.equal(torch.cat([part[1] for part in parts]), whole_labels)
        assert parts[0][0].shape == (4, 16)


def test_labels_are_the_inputs_shifted_by_one_token():
    batches = PackedBatches(torch.arange(1_000), seq_len=10, batch=2)
    inputs, labels = batches.batch_for(0)
    assert torch.equal(labels[:, :-1], inputs[:, 1:])
    assert torch.equal(labels[:, -1], inputs[:, -1] + 1)


def test_a_step_reads_the_same_windows_in_a_fresh_process_state():
    """Resuming at step s reads what step s would have read: the order depends on (seed, step) only."""
    tokens = torch.arange(5_000)
    first = PackedBatches(tokens, seq_len=8, batch=4, seed=1)
    for step in range(5):
        first.batch_for(step)
    assert torch.equal(first.batch_for(5)[0], PackedBatches(tokens, seq_len=8, batch=4, seed=1).batch_for(5)[0])
    assert not torch.equal(first.batch_for(5)[0], PackedBatches(tokens, seq_len=8, batch=4, seed=2).batch_for(5)[0])


def test_an_epoch_visits_every_window_once():
    batches = PackedBatches(torch.arange(801), seq_len=8, batch=4)  # 100 windows, 25 steps per epoch
    seen = [w for step in range(25) for w in batches.window_ids(step)]
    assert sorted(seen) == list(range(100))


def test_batch_that_does_not_split_over_ranks_is_rejected():
    with pytest.raises(AssayError, match="does not split over 2"):
        PackedBatches(torch.arange(1_000), seq_len=8, batch=3, dp_rank=0, dp_size=2)


def test_too_little_data_for_one_batch_is_rejected():
    with pytest.raises(AssayError, match="fewer than one batch"):
        PackedBatches(torch.arange(30), seq_len=8, batch=4)


def test_embedded_corpus_is_the_default(tokenizer):
    texts = load_texts(DataSource())
    tokens = tokenize(texts, tokenizer, vocab_size=1024)
    assert len(tokens) > 50_000 and int(tokens.max()) < 1024
    assert tokens[-1] == tokenizer.eos_token_id


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".json", ".parquet"])
def test_local_files_give_the_same_documents(tmp_path, tokenizer, suffix):
    path = tmp_path / f"data{suffix}"
    if suffix == ".txt":
        path.write_text(DOCUMENTS[0])
        expected = DOCUMENTS[:1]
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(DOCUMENTS)))
        expected = DOCUMENTS
    elif suffix == ".json":
        path.write_text(json.dumps([{"body": d} for d in DOCUMENTS]))
        expected = DOCUMENTS
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": DOCUMENTS, "id": list(range(len(DOCUMENTS)))}), path)
        expected = DOCUMENTS
    texts = load_texts(DataSource(str(path), text_field="body"))
    assert texts == expected
    tokens = tokenize(texts, tokenizer, vocab_size=1024)
    # each document, then the end-of-text token
    assert (tokens == tokenizer.eos_token_id).sum() == len(expected)


def test_missing_text_field_names_the_fields_there(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"content": "hello"}) + "\n")
    with pytest.raises(AssayError, match=r"no field 'text' \(content\); pass --text-field"):
        load_texts(DataSource(str(path)))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(AssayError, match="no such file"):
        load_texts(DataSource(str(tmp_path / "absent.jsonl")))


def test_datasets_name_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(AssayError) as error:
        load_texts(DataSource("assay-test/no-such-dataset"))
    message = str(error.value)
    assert message.startswith("cannot load dataset 'assay-test/no-such-dataset'") and "\n" not in message
