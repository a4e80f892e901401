"""Error signatures: one normalised line per failure, so the same bug on many models groups together.

Two failures share a signature when they raise the same exception with the same message once the
parts that vary between models and machines are taken out: paths, hex addresses and hashes, quoted
names, and numbers.
"""

from __future__ import annotations

import re

MAX_LENGTH = 240

# The final "SomeError: message" line of a traceback (dotted module paths allowed: torch._dynamo.exc.Unsupported).
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Unsupported|Failure|Warning|Fault)\b.*")
_TRACEBACK_NOISE = ("Traceback (most recent call last)", "During handling of the above exception", "The above exception was")

# Order matters: a path holds numbers and quoted paths hold quotes, so paths go first.
_SUBSTITUTIONS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-+@~]+){2,}[\\/]?"), "<path>"),  # /a/b/c.py, C:\a\b
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"), "<hash>"),  # digests, uuids' parts
    (re.compile(r"'[^'\n]*'"), "'…'"),
    (re.compile(r'"[^"\n]*"'), '"…"'),
    (re.compile(r"`[^`\n]*`"), "`…`"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:[.,_]\d+)*(?:[eE][-+]?\d+)?"), "N"),
    (re.compile(r"\s+"), " "),
)


def exception_line(text: str) -> str:
    """The line that names what went wrong: the last exception line of a traceback, else the last line."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    for line in reversed(lines):
        if not line.startswith((" ", "\t")) and _EXCEPTION_LINE.match(line):
            return line.strip()
    for line in reversed(lines):
        if not line.startswith((" ", "\t")) and not line.startswith(_TRACEBACK_NOISE):
            return line.strip()
    return lines[-1].strip()


def error_signature(text: str | None) -> str:
    """A normalised one-line signature of an error or traceback ("" for no error)."""
    if not text or not text.strip():
        return ""
    signature = exception_line(text)
    for pattern, replacement in _SUBSTITUTIONS:
        signature = pattern.sub(replacement, signature)
    signature = signature.strip()
    return signature if len(signature) <= MAX_LENGTH else signature[: MAX_LENGTH - 1] + "…"
