"""Decoding under a grammar with a real Transformers model: a plain loop (forward, mask, sample, accept) on the
tiny zoo's Qwen3 (greedy, a batch of different schemas beside an unconstrained row): every finished output
parses and validates. The real SmolLM2-135M-Instruct's sampled answers (temperature 1, seeds 0-19) are checked
the same way through the server, in test_structured_real.py."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from assay.serve.guided import GrammarCompiler, TokenMasks

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "role", "tags", "address"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "address": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "zip"],
            "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}},
        },
    },
}
SCORE = {"type": "object", "additionalProperties": False, "required": ["score", "ok"],
         "properties": {"score": {"type": "integer", "minimum": -5, "maximum": 5}, "ok": {"type": "boolean"}}}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "unit", "days"],
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}


def decode(model, prompt: list[int], matchers: list, masks: TokenMasks | None, stop_id: int, max_tokens: int,
           generators: list[torch.Generator | None]) -> tuple[list[list[int]], list[bool]]:
    """Rows share one prompt; row i is guided by matchers[i] (None: free) and sampled with generators[i]
    (None: greedy). Returns each row's tokens (without the stop token) and whether it stopped."""
    rows = len(matchers)
    tokens: list[list[int]] = [[] for _ in range(rows)]
    stopped = [False] * rows
    inputs, cache = torch.tensor([prompt] * rows), None
    with torch.inference_mode():
        for _ in range(max_tokens):
            live = {i: m for i, m in enumerate(matchers) if m is not None and not stopped[i]}
            pending = masks.start_fill(live) if masks is not None else None  # runs while the forward runs
            out = model(input_ids=inputs, cache=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1, :].float()
            if pending is not None:
                masks.apply(logits, pending.result())
            step = []
            for i in range(rows):
                if generators[i] is None:
                    token = int(logits[i].argmax())
                else:
                    token = int(torch.multinomial(torch.softmax(logits[i], -1), 1, generator=generators[i]))
                step.append(token)
                if stopped[i]:
                    continue
                if matchers[i] is not None:
                    assert matchers[i].accept(token), matchers[i].error
                if token == stop_id:
                    stopped[i] = True
                else:
                    tokens[i].append(token)
            if all(stopped):
                break
            inputs = torch.tensor(step).unsqueeze(1)
    return tokens, stopped


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.fixture(scope="module")
def tiny(zoo_dir):
    folder = zoo_dir / "qwen3"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return tokenizer, model, GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


def test_greedy_tiny_model_output_validates_against_nested_schema(tiny):
    tokenizer, model, compiler = tiny
    prompt = tokenizer.encode("A person as JSON:", add_special_tokens=False)
    masks = TokenMasks(compiler.vocab_size)
    tokens, stopped = decode(model, prompt, [compiler.json_schema(PERSON, strict=True).matcher()], masks,
                             tokenizer.eos_token_id, 200, [None])
    text = tokenizer.decode(tokens[0])
    assert stopped == [True], text
    assert valid(text, PERSON), text


def test_batch_of_schemas_beside_a_free_row(tiny):
    """Rows 0 and 2 under different schemas, row 1 free: the guided rows validate and the free row's tokens
    equal the same batch decoded with no masks at all."""
    tokenizer, model, compiler = tiny
    prompt = tokenizer.encode("Answer in JSON:", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    masks = TokenMasks(compiler.vocab_size, rows=3)
    matchers = [compiler.json_schema(PERSON, strict=True).matcher(), None, compiler.json_schema(SCORE, strict=True).matcher()]
    tokens, stopped = decode(model, prompt, matchers, masks, eos, 120, [None] * 3)
    free, _ = decode(model, prompt, [None] * 3, None, eos, 120, [None] * 3)
    assert stopped[0] and stopped[2]
    assert valid(tokenizer.decode(tokens[0]), PERSON) and valid(tokenizer.decode(tokens[2]), SCORE)
    assert tokens[1] == free[1]
