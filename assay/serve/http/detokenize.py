"""Token ids in, text out, for answers streamed or not: the incremental detokenizer with stop strings, and
the text of single tokens as the logprobs formats show them."""

from __future__ import annotations


class IncrementalText:
    """Token ids in, text deltas out; stop strings cut the text (and are not part of it), as in vLLM.

    The whole text is re-decoded each token (byte-level BPE: a character may span tokens), a trailing
    incomplete character is held back, and so are the last len(longest stop) - 1 characters, which
    could still turn into a stop string. With min_tokens, as vLLM: no stop string ends the text within the
    first min_tokens tokens, and only one that ends after their text counts.
    """

    def __init__(self, tokenizer, stop: list[str], min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.min_tokens = min_tokens
        self.search_from = 0  # a stop string must end past this many characters
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.text = ""

    def add(self, token_id: int) -> tuple[str, bool]:
        """(new text to send, whether a stop string ended the text)."""
        self.ids.append(token_id)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = -1
        if len(self.ids) <= self.min_tokens:
            self.search_from = len(self.text)
        else:
            found = (self.text.find(s, max(0, self.search_from - len(s) + 1)) for s in self.stop)
            cut = min((i for i in found if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            return self._take(max(cut, self.sent)), True
        stable = len(self.text.rstrip("\ufffd"))
        return self._take(max(self.sent, stable - self.hold)), False

    def flush(self) -> str:
        """The held-back rest, once the request finished without a stop string."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        delta = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return delta

