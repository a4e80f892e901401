"""The penalties and floors vLLM's clients send (repetition_penalty, presence_penalty, frequency_penalty, min_p,
min_tokens): on the same logits the sampler's equal Transformers' logits processors; greedy decoding through
the engine equals Transformers' generate with the same processors; the HTTP routes take them."""

from __future__ import annotations

import pytest
import torch
from serve.test_http import PROMPT_IDS, post, post_route, start_server
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from assay.core.errors import AssayError
from assay.serve import Engine, EngineConfig, run_to_completion
from assay.serve.engine.penalties import TokenHistory, penalize
from assay.serve.engine.sampling import Sampling, SamplingParams, sample_tokens, warp_logits

VOCAB = 300
PROMPT = [3, 17, 17, 250, 4, 99]
OUTPUT = [17, 5, 5, 5, 200, 3, 4]


def logits(seed: int = 0) -> torch.Tensor:
    # Positive and negative logits, so the repetition penalty's two branches are both taken.
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def history_after(params: SamplingParams, output: list[int] = OUTPUT) -> TokenHistory:
    history = TokenHistory.start(params, PROMPT, VOCAB)
    for token in output:
        history.append(token)
    return history


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_equals_transformers_processor_exactly(penalty):
    params = SamplingParams(repetition_penalty=penalty)
    raw = logits()
    ours = penalize(raw, params, history_after(params))
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([PROMPT + OUTPUT]), raw[None].clone())[0]
    assert torch.equal(ours, theirs)  # the same float32 operations on the same values: bit for bit
    assert not torch.equal(ours, raw) and torch.equal(raw, logits()), "penalize works out of place"


@pytest.mark.parametrize("generated", [0, 2, 3, 5])
def test_min_tokens_equals_transformers_min_new_tokens_processor_exactly(generated):
    stops = (5, 17, 10_000)  # an id past the vocabulary is never sampled, so nothing is masked for it
    params = SamplingParams(min_tokens=3, max_tokens=8, stop_token_ids=stops)
    raw = logits(1)
    ours = penalize(raw, params, history_after(params, OUTPUT[:generated]))
    processor = MinNewTokensLengthLogitsProcessor(len(PROMPT), 3, [5, 17])
    theirs = processor(torch.tensor([PROMPT + OUTPUT[:generated]]), raw[None].clone())[0]
    assert torch.equal(ours, theirs)
    assert (ours[[5, 17]] == float("-inf")).all() == (generated < 3)


def vllm_penalties(raw: torch.Tensor, output: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's definition, in float64: logit - frequency * count - presence * (count > 0), output tokens only."""
    counts = torch.bincount(torch.tensor(output), minlength=VOCAB).double()
    return raw.double() - frequency * counts - presence * (counts > 0).double()


@pytest.mark.parametrize("presence, frequency", [(0.7, 0.0), (0.0, 1.3), (-0.5, 2.0), (2.0, -2.0)])
def test_presence_and_frequency_penalties_are_openais_over_the_output_tokens(presence, frequency):
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    raw = logits(2)
    ours = penalize(raw, params, history_after(params))
    want = vllm_penalties(raw, OUTPUT, presence, frequency)
    # Two float32 subtractions of values below 30: an error of a few float32 ulps (2**-24 relative) at most.
    assert (ours.double() - want).abs().max().item() <= 4 * 2**-24 * want.abs().max().item()
    assert torch.equal(ours[PROMPT[0] + 1:PROMPT[0] + 2], raw[PROMPT[0] + 1:PROMPT[0] + 2]) or PROMPT[0] + 1 in OUTPUT
    assert ours[250] == raw[250], "a token only in the prompt is not penalized"


@pytest.mark.parametrize("min_p, temperature", [(0.05, 1.0), (0.3, 0.7), (1.0, 1.5)])
def test_min_p_equals_transformers_warper_exactly(min_p, temperature):
    raw = logits(3)
    ours = warp_logits(raw, SamplingParams(temperature=temperature, min_p=min_p))
    theirs = MinPLogitsWarper(min_p)(None, TemperatureLogitsWarper(temperature)(None, raw[None].clone()))[0]
    assert torch.equal(ours, theirs)
    assert torch.isinf(ours).any() and torch.isfinite(ours[raw.argmax()])


def test_min_p_draws_only_from_what_it_keeps():
    raw = logits(4)
    sampling = Sampling.create(temperature=1.0, seed=0, min_p=0.2)
    probs = torch.softmax(raw, -1)
    kept = set(torch.nonzero(probs >= 0.2 * probs.max()).flatten().tolist())
    draws = {sampling.draw(raw) for _ in range(2000)}
    assert draws <= kept and len(draws) > 1


def test_a_greedy_row_with_penalties_takes_the_argmax_of_the_penalized_logits():
    raw = torch.zeros(2, VOCAB)
    raw[:, 7], raw[:, 8] = 5.0, 4.0
    params = SamplingParams(repetition_penalty=2.0)
    penalized = Sampling.for_choice(params, 0, TokenHistory.start(params, [7], VOCAB))
    assert sample_tokens(raw, [penalized, Sampling.create(0.0)]) == [8, 7]  # 5 / 2 < 4


@pytest.mark.parametrize("settings, message", [
    ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
    ({"presence_penalty": 2.5}, "presence_penalty must be a finite number in [-2, 2]"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be a finite number in [-2, 2]"),
    ({"min_p": 1.5}, "min_p must be a finite number in [0, 1]"),
    ({"min_tokens": -1}, "min_tokens must be an integer >= 0"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens (9) must be at most max_tokens (8)"),
])
def test_out_of_range_penalties_are_refused(settings, message):
    with pytest.raises(AssayError) as error:
        SamplingParams(**settings)
    assert message in str(error.value)


# ---------------------------------------------------------------- through the engine, against generate


class OpenAIPenalties(LogitsProcessor):
    """Transformers has no presence/frequency processor: vLLM's, over the tokens after the prompt."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        output = input_ids[:, self.prompt_len:]
        counts = torch.zeros_like(scores).scatter_add_(1, output, torch.ones(output.shape, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


@pytest.fixture(scope="module", params=["llama", "qwen3-pretrained"])
def model_pair(zoo_dir, request):
    from transformers import AutoModelForCausalLM

    folder = zoo_dir / request.param
    engine = Engine.from_checkpoint(folder, EngineConfig(max_seqs=2, eager=True, max_len=128))
    return engine, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


GEN_PROMPT = [11, 12, 13, 14, 15, 11, 12, 13]
NEW = 24


def transformers_greedy(model, stop: int, min_tokens: int = 0, processors=(), **penalties) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([GEN_PROMPT]), max_new_tokens=NEW, do_sample=False, eos_token_id=[stop], pad_token_id=stop,
                             min_new_tokens=min_tokens or None, logits_processor=LogitsProcessorList(processors), **penalties)
    return out[0, len(GEN_PROMPT):].tolist()


def engine_greedy(engine, stop: int, **settings) -> list[int]:
    engine.add_request("r", GEN_PROMPT, max_tokens=NEW, temperature=0.0, stop_token_ids=(stop,), **settings)
    return run_to_completion(engine)["r"]


def test_greedy_with_each_penalty_equals_transformers_generate(model_pair):
    engine, model = model_pair
    plain = engine_greedy(engine, stop=-1)
    # min_tokens needs a likely stop token to hold back: the plain answer's second token. The penalties are
    # checked over the whole length, with a stop token the plain answer never produces.
    likely, unlikely = plain[1], max(set(range(engine.vocab_size)) - set(plain))
    cases = [
        ({"repetition_penalty": 1.8}, {"repetition_penalty": 1.8}, (), unlikely),
        ({"repetition_penalty": 0.7}, {"repetition_penalty": 0.7}, (), unlikely),
        ({"min_tokens": 6}, {}, (), likely),
        ({"presence_penalty": 1.5, "frequency_penalty": 0.8}, {}, (OpenAIPenalties(len(GEN_PROMPT), 1.5, 0.8),), unlikely),
        ({"repetition_penalty": 1.3, "frequency_penalty": 1.0, "min_tokens": 4}, {"repetition_penalty": 1.3},
         (OpenAIPenalties(len(GEN_PROMPT), 0.0, 1.0),), likely),
    ]
    for stop in (likely, unlikely):
        assert engine_greedy(engine, stop) == transformers_greedy(model, stop)
    for ours, theirs, processors, stop in cases:
        got = engine_greedy(engine, stop, **ours)
        want = transformers_greedy(model, stop, ours.get("min_tokens", 0), processors, **theirs)
        assert got == want, ours
        assert got != engine_greedy(engine, stop), f"{ours} changed nothing: the case does not test it"
    assert engine.free_slots == 2


# ---------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def server(zoo_dir):
    handle, engine = start_server(zoo_dir, max_waiting=8)
    yield handle, engine
    handle.stop()


NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0.0, "min_p": 0.0, "min_tokens": 0,
           "ignore_eos": False}


def test_both_routes_accept_the_neutral_values_and_answer_as_without_them(server):
    handle, _ = server
    plain = post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 6, "temperature": 0}).json()["choices"][0]["text"]
    response = post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 6, "temperature": 0} | NEUTRAL)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == plain
    nulls = post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 6, "temperature": 0, "presence_penalty": None, "frequency_penalty": None})
    assert nulls.status_code == 200 and nulls.json()["choices"][0]["text"] == plain


def test_a_penalized_request_answers_what_the_engine_gives(server, zoo_dir):
    handle, _ = server
    settings = {"repetition_penalty": 1.8, "frequency_penalty": 0.5, "min_tokens": 3}
    response = post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 8, "temperature": 0} | settings)
    assert response.status_code == 200, response.text
    engine = Engine.from_checkpoint(zoo_dir / "gla", EngineConfig(max_seqs=1, eager=True))
    engine.add_request("r", PROMPT_IDS, max_tokens=8, temperature=0.0, stop_token_ids=(engine.tokenizer.eos_token_id,), **settings)
    assert response.json()["choices"][0]["text"] == engine.tokenizer.decode(run_to_completion(engine)["r"], skip_special_tokens=True)


@pytest.mark.parametrize("field, value", [("repetition_penalty", 0), ("repetition_penalty", -1.0), ("presence_penalty", 2.5),
                                          ("frequency_penalty", -3), ("min_p", 1.5), ("min_tokens", -1), ("min_tokens", 1.5)])
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_an_out_of_range_value_is_refused_naming_the_field(server, route, field, value):
    handle, _ = server
    response = post_route(handle.url, route, {field: value})
    # 422: a value out of range, as for every other field (docs/serve.md, "Errors").
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["message"].startswith(field)


def test_min_tokens_over_max_tokens_is_a_400_naming_min_tokens(server):
    handle, _ = server
    response = post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 2, "min_tokens": 3})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "min_tokens" and error["message"] == "min_tokens (3) must be at most max_tokens (2)"
