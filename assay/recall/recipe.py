"""The MQAR recipe that converges on this machine's budget: the defaults of `assay recall train` and
`assay recall sweep`, defined once (docs/recall.md, "Why the defaults are what they are", gives the
measurement behind each).

- 4 and 16 pairs at 64 tokens, 64 keys, 64 filler ids (a 256-id vocabulary: the output head stays a
  small part of a step), batch 64: Zoology's task at a size a 2-core CPU trains in minutes.
- short first (16-token sequences until they reach the target): attention's lookup circuit forms within
  hundreds of steps on short sequences and not within 7,000 at 64 tokens (the plateau grows with length).
- one head: 64 keys need a 64-wide head to be told apart (four heads of 16 stayed on the copy plateau).
- init std 0.05: from Transformers' 0.02 the two-layer lookup forms thousands of steps later.
- GLA with fla's short convolutions: the previous-token step of the lookup, which a GLA layer without them
  did not find within 10 CPU minutes (27% / 12%, the copy plateau).
- 10 CPU minutes per model, stop at 95% on validation: the runs above stop within 1-6 minutes.
"""

from __future__ import annotations

from assay.recall.shapes import ModelSize, MQARLayout, layout_for

PAIRS = (4, 16)
SEQ_LEN = 64
KEYS = 64
FILLER = 64
BATCH = 64
SHORT_FIRST = 16
BUDGET_MIN = 10.0
UNTIL_ACCURACY = 0.95
SIZE = ModelSize(n_heads=1, init_std=0.05, gla_short_conv=True)


def layout() -> MQARLayout:
    return layout_for(KEYS, FILLER)
