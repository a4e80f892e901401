"""The embedded English corpus: the prose of CPython's own documentation topics (pydoc_data).

It ships with every CPython, so the tokenizer, the "pretrained" tiny models, the judge and the
training data need no network. About 465 kB of English with some code.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def corpus_text() -> str:
    from pydoc_data.topics import topics

    # Sorted keys: the text, and so the tokenizer and every model trained on it, is deterministic.
    return "\n\n".join(topics[name].strip() for name in sorted(topics))


def corpus_documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name].strip() for name in sorted(topics)]


def corpus_split(validation_fraction: float = 0.05) -> tuple[str, str]:
    """(train, validation) text, split at a document boundary near the end."""
    documents = corpus_documents()
    n_validation = max(1, int(len(documents) * validation_fraction))
    return "\n\n".join(documents[:-n_validation]), "\n\n".join(documents[-n_validation:])


# A fixed English prompt for probes: plain text the corpus' tokenizer covers well.
PROBE_PROMPT = "The Python language reference describes the syntax and the core semantics of the language. A function"
