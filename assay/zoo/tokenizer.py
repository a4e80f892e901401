"""One byte-level BPE tokenizer shared by every zoo checkpoint, trained on the embedded corpus.

Byte-level: any text round-trips, so a probe never meets an unknown character. Training with
`tokenizers` is deterministic for a fixed corpus and vocabulary size.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

# The special tokens and their ids are defined once in core (configs and checkpoints outside the zoo
# use them too); the tokenizer trainer below numbers them first, in that order.
from assay.core.tokens import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

VOCAB_SIZE = 1024


@functools.lru_cache(maxsize=1)
def build_tokenizer_json() -> str:
    """The tokenizer as tokenizer.json text (cached: training takes a few seconds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from assay.zoo.corpus import corpus_text

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus_text()
    # Paragraph-sized chunks: the trainer counts pairs per item, the result does not depend on chunking.
    tokenizer.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return tokenizer.to_str()


def tokenizer_config(model_max_length: int = 2048) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "extra_special_tokens": {},
    }


def write_tokenizer(folder: str | Path, model_max_length: int = 2048, extra_config: dict | None = None) -> None:
    from assay.core.files import atomic_write_text

    folder = Path(folder)
    atomic_write_text(folder / "tokenizer.json", build_tokenizer_json())
    config = tokenizer_config(model_max_length)
    config.update(extra_config or {})
    atomic_write_text(folder / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    atomic_write_text(folder / "special_tokens_map.json", json.dumps(special, indent=2) + "\n")


def token_id(token: str) -> int:
    return json.loads(build_tokenizer_json())["added_tokens"][SPECIAL_TOKENS.index(token)]["id"]
