"""Build the embedded eval tasks from the corpus every CPython ships (pydoc_data.topics' prose).

`python -m assay.compat.eval.tasks.build [FOLDER]` writes the two tasks' JSONL files (default: beside this
module, where they ship). Deterministic: items are chosen by SHA-256 ranks of their text, never by a
random generator, so the same corpus always gives the same files. The shipped files are the tasks'
definition; the corpus itself changes between Python releases (topics.py is regenerated each release),
so each file's first line records the SHA-256 of the corpus it was built from (docs/dataset.md).

- assay_cloze (LAMBADA's form, output_type loglikelihood): a passage of whole sentences, the last word
  left out; the model must give it as its greedy continuation. As in LAMBADA, the word is one the
  passage already used, so the context makes it predictable for a model that reads the passage.
- assay_next_sentence (HellaSwag's form, output_type multiple_choice): a sentence, then four candidate
  next sentences: the real one and three of similar length from other paragraphs.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

ITEMS = 100
HERE = Path(__file__).resolve().parent
# Sentence ends inside prose: a lower-case letter, its stop, then a capital (keeps "e.g. This" together
# only when the abbreviation ends in a capital, which the corpus's prose rarely does).
SENTENCE_END = re.compile(r"(?<=[a-z][.!?])\s+(?=[A-Z])")
MAX_CLOZE_WORDS = 80
CHOICES = 4


def _rank(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def corpus_sha256() -> str:
    from assay.zoo.corpus import corpus_text

    return hashlib.sha256(corpus_text().encode()).hexdigest()


def prose_paragraphs() -> list[str]:
    """Paragraphs of plain prose: not indented (code, signatures, tables), at least 12 words, at least
    85% of them words of letters; whitespace normalised to single spaces."""
    from assay.zoo.corpus import corpus_documents

    paragraphs = []
    for document in corpus_documents():
        for block in re.split(r"\n\s*\n", document):
            if not block.strip() or block[0].isspace():
                continue
            text = " ".join(block.split())
            words = text.split()
            if len(words) >= 12 and sum(w.strip(".,;:()").isalpha() for w in words) >= 0.85 * len(words):
                paragraphs.append(text)
    return paragraphs


def cloze_items(paragraphs: list[str]) -> list[dict]:
    """One item per paragraph that has one: the longest run of its first sentences (at most
    MAX_CLOZE_WORDS words, at least two sentences) whose last word is a lower-case word of 4+ letters
    that the passage used before."""
    items = []
    for paragraph in paragraphs:
        sentences = SENTENCE_END.split(paragraph)
        best = None
        for end in range(2, len(sentences) + 1):
            passage = " ".join(sentences[:end])
            words = passage.split()
            if len(words) > MAX_CLOZE_WORDS:
                break
            word = words[-1].rstrip(".!?")
            before = {w.strip(".,;:()!?\"'*") for w in words[:-1]}
            if word.isalpha() and word.islower() and len(word) >= 4 and word in before:
                best = {"context": " ".join(words[:-1]), "target": word}
        if best is not None:
            items.append(best)
    return _choose(items, "cloze")


def next_sentence_items(paragraphs: list[str]) -> list[dict]:
    """One item per paragraph that has one: its first sentence of 8-30 words followed by one of 6-20
    words; three distractors within 20% of the real sentence's length, from other paragraphs. Short
    sentences keep the task cheap (400 scored sequences); similar lengths keep the choice from being
    decided by length alone."""
    pool = [(p, s) for p, paragraph in enumerate(paragraphs) for s in SENTENCE_END.split(paragraph) if 6 <= len(s.split()) <= 20]
    items = []
    for p, paragraph in enumerate(paragraphs):
        sentences = SENTENCE_END.split(paragraph)
        for first, second in zip(sentences, sentences[1:]):
            if 8 <= len(first.split()) <= 30 and 6 <= len(second.split()) <= 20:
                length = len(second.split())
                similar = [s for q, s in pool if q != p and s != second and abs(len(s.split()) - length) <= 0.2 * length]
                distractors = sorted(set(similar), key=lambda s: _rank("distractor", first, s))[: CHOICES - 1]
                if len(distractors) < CHOICES - 1:
                    continue
                label = int(_rank("label", first), 16) % CHOICES
                choices = distractors[:label] + [second] + distractors[label:]
                items.append({"context": first, "choices": choices, "label": label})
                break
    return _choose(items, "next_sentence")


def _choose(items: list[dict], kind: str) -> list[dict]:
    chosen = sorted(items, key=lambda item: _rank(kind, json.dumps(item, sort_keys=True)))[:ITEMS]
    if len(chosen) < ITEMS:
        raise RuntimeError(f"the corpus gives only {len(chosen)} {kind} items, {ITEMS} are needed")
    return [{"id": i, **item} for i, item in enumerate(chosen)]


CLOZE_YAML = """\
# LAMBADA's form: the passage's last word, scored as the greedy continuation (acc = is_greedy).
task: assay_cloze
output_type: loglikelihood
doc_to_text: "{{context}}"
doc_to_target: "{{' ' + target}}"
"""
NEXT_SENTENCE_YAML = """\
# HellaSwag's form: the real next sentence among four (acc: the highest log-likelihood; acc_norm: per byte).
task: assay_next_sentence
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: choices
doc_to_target: label
"""
COMMON_YAML = """\
# Offline: the items ship beside this file and data.py reads them (no Hub access, no datasets cache).
dataset_path: json
custom_dataset: !function data.load
dataset_kwargs:
  data_file: {data_file}
test_split: test
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
{extra_metrics}metadata:
  version: 1.0
  items: {items}
  corpus_sha256: {corpus}
"""
ACC_NORM = """\
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder: Path, name: str, head: str, items: list[dict], corpus: str, extra_metrics: str = "") -> list[Path]:
    """<name>.jsonl (one item a line) and <name>.yaml (the lm-eval task), each written atomically."""
    from assay.core.files import atomic_write_text

    data, config = Path(folder) / f"{name}.jsonl", Path(folder) / f"{name}.yaml"
    atomic_write_text(data, "".join(json.dumps(item, sort_keys=True, ensure_ascii=False) + "\n" for item in items))
    header = "# Built by `python -m assay.compat.eval.tasks.build` from CPython's pydoc_data.topics (docs/dataset.md).\n"
    atomic_write_text(config, header + head + COMMON_YAML.format(data_file=data.name, items=len(items), corpus=corpus,
                                                                 extra_metrics=extra_metrics))
    return [config, data]


def build(folder: Path = HERE) -> list[Path]:
    paragraphs = prose_paragraphs()
    corpus = corpus_sha256()
    return (write_task(folder, "assay_cloze", CLOZE_YAML, cloze_items(paragraphs), corpus)
            + write_task(folder, "assay_next_sentence", NEXT_SENTENCE_YAML, next_sentence_items(paragraphs), corpus, ACC_NORM))


if __name__ == "__main__":
    for written in build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(written)
