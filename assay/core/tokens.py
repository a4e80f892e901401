"""The special tokens every checkpoint assay builds shares, and their ids: one definition.

The zoo's tokenizer, its configs and generation configs, the native checkpoints the trainer writes
and the recall task's configs all number special tokens this way (the tokenizer trainer puts them
first, in this order), so a pad or end-of-text id read anywhere means the same token.
"""

from __future__ import annotations

BOS = "<|bos|>"
EOS = "<|endoftext|>"
PAD = "<|pad|>"
UNK = "<|unk|>"
# Tokens the image-text-to-text processors look for (LLaVA's `<image>`; Gemma 3's markers: begin/end
# of image and the soft token each image patch-group becomes).
IMAGE_TOKENS = ["<image>", "<start_of_image>", "<image_soft_token>", "<end_of_image>"]
SPECIAL_TOKENS = [BOS, EOS, PAD, UNK, *IMAGE_TOKENS]
TOKEN_IDS = {"bos_token_id": SPECIAL_TOKENS.index(BOS), "eos_token_id": SPECIAL_TOKENS.index(EOS), "pad_token_id": SPECIAL_TOKENS.index(PAD)}
