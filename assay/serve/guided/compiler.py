"""Grammars for structured outputs and forced tool calls, compiled by llguidance once per (grammar text, tokenizer).

    compiler = GrammarCompiler(tokenizer, stop_token_ids=[2])     # one per served model
    grammar = compiler.json_schema(schema, strict=True)            # GrammarError (an AssayError) if refused
    grammar = compiler.json_object()
    grammar = compiler.tool_calls(tools, parallel=True)            # required: any of them; named: a list of one
    matcher = grammar.matcher()                                    # one per request (matcher.py)

llguidance builds a grammar's lexer lazily and computes each token mask on demand, so "compiling" is parsing
and checking the grammar against the tokenizer (about a millisecond); the cache keeps the checked grammar and
a matcher whose warm lexer each request's matcher is copied from.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf

from assay.core.errors import AssayError
from assay.serve.guided.matcher import GuidedMatcher
from assay.serve.guided.tools import CALL_CLOSE, CALL_OPEN, FunctionTool, json_grammar_schema, tool_call_lark

CACHE_ENTRIES = 256  # distinct grammars kept per model; a grammar is a few kB plus its lexer's states


class GrammarError(AssayError):
    """A schema or tool the grammar library refuses; `param` is the request field it came from (for a 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Grammar:
    """A checked grammar for one tokenizer; `matcher()` starts a request's matcher in its initial state.

    Pickled (a request sent to an engine in another process, e.g. a Ray Serve replica), it travels as its
    source and key and is compiled again there, by that process's compiler for the same tokenizer folder.
    """

    key: tuple[str, str]
    text: str  # llguidance's grammar (JSON), as LLMatcher takes it
    template: llguidance.LLMatcher
    vocab_size: int  # the tokenizer's: the width of the masks its matchers fill (masks.TokenMasks)
    source: tuple[str, tuple[int, ...]] = ("", ())  # the tokenizer's folder and the stop token ids

    def matcher(self) -> GuidedMatcher:
        return GuidedMatcher(self.template.deep_copy())

    def __reduce__(self):
        return _rebuild, (self.source, self.key)


_COMPILERS: dict[tuple[str, tuple[int, ...]], GrammarCompiler] = {}  # this process's, by source
_COMPILERS_LOCK = threading.Lock()


def _rebuild(source: tuple[str, tuple[int, ...]], key: tuple[str, str]) -> Grammar:
    """A pickled Grammar in this process: its compiler for the same tokenizer (loaded from the folder the first
    time), then the grammar from its cache or compiled again."""
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get(source)
    if compiler is None:
        if not source[0]:
            raise AssayError("a grammar from a tokenizer without a folder cannot be sent to another process")
        from transformers import AutoTokenizer

        compiler = GrammarCompiler(AutoTokenizer.from_pretrained(source[0]), source[1])
    return compiler._compile(*key, param="response_format")


class GrammarCompiler:
    """Compiles grammars for one tokenizer and keeps the last CACHE_ENTRIES of them.

    stop_token_ids: the tokens the engine ends a sequence on; a matcher allows them once the grammar is
    complete, and only then. vocab_size: the tokenizer's own count (len(tokenizer)), not the model's logits
    width, which may be padded beyond it (masks.py handles the difference).
    """

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int]):
        if not stop_token_ids:
            raise AssayError("a grammar needs at least one stop token id (the model's end-of-sequence token)")
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=list(stop_token_ids))
        self.source = (str(getattr(tokenizer, "name_or_path", "") or ""), tuple(int(t) for t in stop_token_ids))
        with _COMPILERS_LOCK:
            _COMPILERS.setdefault(self.source, self)
        self.vocab_size = self.tokenizer.vocab_size
        self.special_tags = _special_tags(tokenizer, self.tokenizer)
        self.compiles = 0  # cache misses: grammars parsed and checked
        self.hits = 0
        self._cache: OrderedDict[tuple[str, str], Grammar] = OrderedDict()
        self._lock = threading.Lock()  # HTTP handlers may compile from several threads

    def json_object(self) -> Grammar:
        """response_format {"type": "json_object"}: any JSON object."""
        return self._compile("json_schema", json_grammar_schema({"type": "object"}, strict=True), "response_format")

    def json_schema(self, schema: Any, strict: bool = False) -> Grammar:
        """response_format {"type": "json_schema", "json_schema": {"schema": ..., "strict": ...}}."""
        if not isinstance(schema, dict):
            raise GrammarError("response_format.json_schema.schema must be a JSON Schema object", "response_format")
        return self._compile("json_schema", json_grammar_schema(schema, strict), "response_format",
                             where=lambda: "response_format.json_schema.schema", schema=schema)

    def tool_calls(self, tools: Sequence[FunctionTool], parallel: bool = True) -> Grammar:
        """tool_choice required (all of `tools`) or a named function (a list of one): the output is one call,
        or with `parallel` one or more, in the <tool_call> format, arguments valid against `parameters`."""
        if not tools:
            raise GrammarError("tool_choice needs at least one tool", "tool_choice")
        for tool in tools:  # name the function whose parameters are refused, rather than the whole grammar
            failed, messages = self._validate(llguidance.LLMatcher.grammar_from_json_schema(
                json_grammar_schema(tool.parameters, tool.strict)))
            if failed:
                raise GrammarError(_refusal(f"tools: function {tool.name!r} parameters", messages[0], tool.parameters), "tools")
        return self._compile("lark", tool_call_lark(tools, parallel, self.special_tags), "tools")

    def _validate(self, grammar_text: str) -> tuple[bool, list[str]]:
        return llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text, self.tokenizer)

    def _compile(self, kind: str, text: str, param: str, where=lambda: "", schema: Any = None) -> Grammar:
        key = (kind, text)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
        grammar_text = (llguidance.LLMatcher.grammar_from_json_schema(text) if kind == "json_schema"
                        else llguidance.LLMatcher.grammar_from_lark(text))
        failed, messages = self._validate(grammar_text)
        template = None if failed else llguidance.LLMatcher(self.tokenizer, grammar_text)
        if template is None or template.is_error():
            raise GrammarError(_refusal(where() or param, messages[0] if failed else template.get_error(), schema), param)
        grammar = Grammar(key, grammar_text, template, self.vocab_size, self.source)
        with self._lock:
            self.compiles += 1
            self._cache[key] = grammar
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return grammar


def _special_tags(hf_tokenizer: Any, tokenizer: llguidance.LLTokenizer) -> frozenset[str]:
    """The tool-call tags this tokenizer holds as single special tokens (they never match text)."""
    vocab = hf_tokenizer.get_vocab()
    return frozenset(tag for tag in (CALL_OPEN, CALL_CLOSE) if tag in vocab and tokenizer.is_special_token(vocab[tag]))


def _refusal(where: str, message: str, schema: Any) -> str:
    """One line: where the refused part is (a JSON pointer into the schema when the message names keywords)."""
    keys = re.match(r"Unimplemented keys: (\[.*?\])", message)
    path = _find_key(schema, json.loads(keys.group(1))) if keys and schema is not None else None
    location = f"{where}{path}" if path else where
    return f"{location}: the grammar library refused the schema: {_one_line(message)}"


def _find_key(node: Any, keys: list[str], path: str = "") -> str | None:
    """The pointer (/properties/a) of the first object in `node` holding one of `keys`."""
    if isinstance(node, dict):
        if any(key in node for key in keys):
            return path or "/"
        children = node.items()
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        return None
    for name, child in children:
        found = _find_key(child, keys, f"{path}/{name}")
        if found:
            return found
    return None


def _one_line(message: str) -> str:
    """llguidance's messages can span lines (a regex error draws a caret under the pattern): one line of them."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())[:400] or "unknown error"
