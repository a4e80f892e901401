"""Tool calls read out of a model's text in the <tool_call>{"name": ..., "arguments": {...}}</tool_call> format,
whole (parse_tool_calls) or as the text streams (ToolCallStream), in OpenAI's shapes.

    content, calls = parse_tool_calls(text)        # calls: [ToolCall(id, name, arguments)]; none: content is text
    stream = ToolCallStream()
    for piece in pieces:
        for delta in stream.feed(piece): ...        # {"content": ...} or {"tool_calls": [{index, id, type, function}]}
    for delta in stream.finish(): ...

The arguments are the JSON text as the model wrote it (not re-serialised), so the streamed fragments of a
call join to exactly the arguments the whole response carries. A block that does not parse (no name, JSON
that does not close, no closing tag) is left as content, as vLLM's Hermes parser leaves it; streamed, the
fragments of such a block may already have gone out when the text ends, and the rest comes as content.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

from assay.serve.guided.tools import CALL_CLOSE, CALL_OPEN

_ID_CHARS = string.ascii_letters + string.digits
# The fixed part of a call up to its arguments; the model may put whitespace where json.dumps puts one space.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]{1,64})"\s*,\s*"arguments"\s*:\s*')
_TAIL = re.compile(r"\s*\}\s*" + re.escape(CALL_CLOSE))


def new_call_id() -> str:
    """An id in OpenAI's form: call_ and 24 letters or digits."""
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON object as text, as OpenAI's `function.arguments`

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_calls(text: str, new_id: Callable[[], str] = new_call_id) -> tuple[str, list[ToolCall]]:
    """The text outside the calls (stripped) and the calls in order; a malformed block stays in the content."""
    content, calls, position = [], [], 0
    while (start := text.find(CALL_OPEN, position)) >= 0:
        call = _parse_block(text, start + len(CALL_OPEN))
        if call is None:
            break
        name, arguments, end = call
        # After a call, the whitespace before the next text is the format's (the newline between calls).
        content.append(text[position:start].lstrip() if calls else text[position:start])
        calls.append(ToolCall(new_id(), name, arguments))
        position = end
    content.append(text[position:].lstrip() if calls else text[position:])
    return "".join(content).strip(), calls


def _parse_block(text: str, offset: int) -> tuple[str, str, int] | None:
    """(name, arguments, end of the block) for the block whose body starts at `offset`, or None."""
    head = _HEAD.match(text, offset)
    if head is None:
        return None
    end = _json_end(text, head.end())
    tail = _TAIL.match(text, end) if end is not None else None
    if tail is None:
        return None
    arguments = text[head.end():end]
    try:
        if not isinstance(json.loads(arguments), dict):
            return None
    except ValueError:
        return None
    return head.group(1), arguments, tail.end()


def _json_end(text: str, start: int) -> int | None:
    """Where the JSON object starting at `start` closes (one past its last brace), or None if it does not."""
    scanner = _ObjectScanner()
    for i in range(start, len(text)):
        if scanner.step(text[i]):
            return i + 1
        if scanner.failed:
            return None
    return None


class _ObjectScanner:
    """Follows a JSON object's braces, brackets and strings one character at a time, to find where it ends.

    Not a validator (json.loads checks the whole); it only has to know which braces are inside strings.
    """

    def __init__(self):
        self.depth = 0  # braces and brackets open
        self.in_string = False
        self.escaped = False
        self.failed = False

    def step(self, char: str) -> bool:
        """Consume one character; True when it closed the object."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
            return False
        if self.depth == 0:
            if char != "{":
                self.failed = not char.isspace()
                return False
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


def _prefix_pattern(pieces: list[str]) -> re.Pattern:
    """Matches any start of the sequence of regex pieces: p0(p1(p2...)?)?, whole text only."""
    nested = ""
    for piece in reversed(pieces):
        nested = f"(?:{piece}{nested})?"
    return re.compile(nested + r"\Z")


_NAME = r'[^"\\]{0,64}'
# Any start of a call's head ({"name": "x", "arguments": ) and of its tail (} </tool_call>).
_HEAD_START = _prefix_pattern([r"\s*", r"\{", r"\s*", *map(re.escape, '"name"'), r"\s*", ":", r"\s*", '"', _NAME, '"', r"\s*", ",",
                               r"\s*", *map(re.escape, '"arguments"'), r"\s*", ":"])
_TAIL_START = _prefix_pattern([r"\s*", r"\}", r"\s*", *map(re.escape, CALL_CLOSE)])


class ToolCallStream:
    """Turns streamed text into OpenAI chat deltas: content, then for each call its id and name (with empty
    arguments), then argument fragments. Text that might be the start of a tag is held back until it is not."""

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        self._new_id = new_id
        self._state = "text"  # text, head (after <tool_call>), arguments, tail (after the arguments' last brace)
        self._pending = ""  # text received and not yet emitted
        self._block = ""  # the head of the block being read: content again if the head never completes
        self._scanner = _ObjectScanner()
        self.calls = 0

    def feed(self, text: str) -> list[dict]:
        self._pending += text
        deltas: list[dict] = []
        while getattr(self, f"_{self._state}")(deltas):
            pass
        return deltas

    def finish(self) -> list[dict]:
        """What was held back when the stream ends: an unfinished head, or a partial tag, comes out as content."""
        leftover = self._pending
        if self._state == "head":
            leftover = self._block + leftover
        elif self._state == "tail" and _TAIL_START.match(leftover):
            leftover = ""
        self._state, self._pending, self._block = "text", "", ""
        return [{"content": leftover}] if leftover else []

    def _text(self, deltas: list[dict]) -> bool:
        if self.calls:
            self._pending = self._pending.lstrip()  # the newline between parallel calls
        start = self._pending.find(CALL_OPEN)
        if start < 0:
            cut = len(self._pending) - _partial_suffix(self._pending, CALL_OPEN)
            self._content(deltas, self._pending[:cut])
            self._pending = self._pending[cut:]
            return False
        self._content(deltas, self._pending[:start])
        self._state, self._block, self._pending = "head", CALL_OPEN, self._pending[start + len(CALL_OPEN):]
        return True

    def _head(self, deltas: list[dict]) -> bool:
        head = _HEAD.match(self._pending)
        if head is None:
            if _HEAD_START.match(self._pending):
                return False  # the head may still arrive
            self._content(deltas, self._block)  # not a call after all
            self._state, self._block = "text", ""
            return True
        deltas.append({"tool_calls": [{"index": self.calls, "id": self._new_id(), "type": "function",
                                       "function": {"name": head.group(1), "arguments": ""}}]})
        self._state, self._block, self._pending = "arguments", "", self._pending[head.end():]
        self._scanner = _ObjectScanner()
        return True

    def _arguments(self, deltas: list[dict]) -> bool:
        if self._scanner.depth == 0:
            self._pending = self._pending.lstrip()  # the space after "arguments": is the format's
        for i, char in enumerate(self._pending):
            if self._scanner.step(char) or self._scanner.failed:
                self._fragment(deltas, self._pending[:i + 1])
                self._state, self._pending = "tail", self._pending[i + 1:]
                return True
        self._fragment(deltas, self._pending)
        self._pending = ""
        return False

    def _tail(self, deltas: list[dict]) -> bool:
        tail = _TAIL.match(self._pending)
        if tail is None and _TAIL_START.match(self._pending):
            return False
        # A call whose closing tag never comes is still the call its head named; what follows is content.
        self._pending = self._pending[tail.end():] if tail else self._pending
        self._state, self.calls = "text", self.calls + 1
        return True

    def _fragment(self, deltas: list[dict], text: str) -> None:
        if text:
            deltas.append({"tool_calls": [{"index": self.calls, "function": {"arguments": text}}]})

    @staticmethod
    def _content(deltas: list[dict], text: str) -> None:
        if text:
            deltas.append({"content": text})


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
