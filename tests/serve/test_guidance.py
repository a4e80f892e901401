"""The engine's grammar step (engine/guidance.py) on the tiny Qwen3's tokenizer: the bias made beside the
forward masks exactly what each matcher disallows and leaves free rows bit-identical; a logits width other
than the one announced is learnt; a matcher in error neither crashes the draw nor passes as "stop"."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from assay.serve.engine.guidance import Guidance
from assay.serve.engine.sampling import Sampling, SamplingParams, sample_tokens
from assay.serve.guided import GrammarCompiler

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def setup(zoo_dir):
    tokenizer = AutoTokenizer.from_pretrained(zoo_dir / "qwen3")
    return tokenizer, GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


def rows(compiler, guided: list[bool]) -> list[Sampling]:
    grammar = compiler.json_schema(SCHEMA, strict=True)
    return [Sampling.for_choice(SamplingParams(grammar=grammar if g else None), 0) for g in guided]


@pytest.mark.parametrize("extra", [0, 64], ids=["same-width", "padded-logits"])
def test_bias_masks_exactly_the_disallowed_tokens_and_leaves_free_rows_alone(setup, extra):
    tokenizer, compiler = setup
    samplings = rows(compiler, [True, False, True])
    for token in tokenizer.encode('{"ok": ', add_special_tokens=False):
        assert samplings[2].matcher.accept(token)
    width = compiler.vocab_size + extra
    guidance = Guidance(max_rows=3, width=width)
    logits = torch.randn(3, width, generator=torch.Generator().manual_seed(0))
    masked = guidance.constrain(logits, samplings, guidance.start(samplings))
    assert torch.equal(masked, guidance.constrain(logits, samplings))  # started beside a forward or not: the same
    assert torch.equal(masked[1], logits[1])
    for row in (0, 2):
        allowed = samplings[row].matcher.allowed_mask(compiler.vocab_size)
        assert torch.equal(masked[row, :compiler.vocab_size][allowed], logits[row, :compiler.vocab_size][allowed])
        assert bool(torch.isneginf(masked[row, :compiler.vocab_size][~allowed]).all()) and bool(torch.isneginf(masked[row, compiler.vocab_size:]).all())
    after_colon = {tokenizer.decode([t]) for t in torch.isfinite(masked[2]).nonzero().flatten().tolist()}
    assert after_colon and all("true".startswith(s) or "false".startswith(s) for s in after_colon)


def test_a_logits_width_other_than_announced_is_learnt(setup):
    _, compiler = setup
    samplings = rows(compiler, [True])
    guidance = Guidance(max_rows=1, width=compiler.vocab_size + 128)
    logits = torch.randn(1, compiler.vocab_size)
    masked = guidance.constrain(logits, samplings, guidance.start(samplings))
    assert masked.shape == logits.shape and guidance.width == compiler.vocab_size


def test_a_matcher_in_error_draws_freely_and_ends_as_error_not_stop(setup):
    tokenizer, compiler = setup
    samplings = rows(compiler, [True])
    guidance = Guidance(max_rows=1, width=compiler.vocab_size)
    wrong = tokenizer.encode("]", add_special_tokens=False)[0]  # a JSON object cannot start with ]
    guidance.advance(samplings, [wrong])
    assert guidance.finished(samplings[0]) == "error"
    # llguidance's mask for a matcher in error allows only the stop token: the row draws it and ends, and the
    # engine reports "error" for it (Engine._emit asks finished() before it looks at the stop tokens).
    masked = guidance.constrain(torch.randn(1, compiler.vocab_size), samplings)
    assert sample_tokens(masked, samplings) == [tokenizer.eos_token_id]
    assert guidance.finished(samplings[0]) == "error"
