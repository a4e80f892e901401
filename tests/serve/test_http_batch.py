"""/v1/completions as clients send it, over real HTTP on loopback: a batch of prompts in OpenAI's four
shapes, n choices per prompt (one prefill, the state copied into n slots), sampling with temperature,
top_p, top_k and seed, and log-probabilities (logprobs: k, echo) equal to a Transformers forward on the
same tokens.

Log-probabilities are compared with the float32 model-logits tolerance of assay/core/numerics.py: the
server's are log_softmax in float32 of its native model's logits, Transformers' of its own implementation
of the same function, both float32 (relative error of the vector, as everywhere in the project).
"""

from __future__ import annotations

import threading

import pytest
import torch
from serve.test_http import PROMPT_IDS, PROMPT_TEXT, post, reference_engine, start_server, stream

from assay.core.numerics import tolerance
from assay.serve import Engine, EngineConfig, run_to_completion

TOL = tolerance("model_logits", torch.float32)


@pytest.fixture(scope="module")
def served(zoo_dir):
    handle, engine = start_server(zoo_dir, max_seqs=8, max_waiting=32)
    yield handle, engine
    handle.stop()


@pytest.fixture(scope="module")
def reference(zoo_dir):
    return reference_engine(zoo_dir)


def choices(response) -> list[dict]:
    assert response.status_code == 200, response.text
    return response.json()["choices"]


# ---------------------------------------------------------------- batches and n


@pytest.mark.parametrize(
    "prompts",
    [[PROMPT_TEXT, "Once upon a time", "1, 2, 3,"], [PROMPT_IDS, [100, 200, 300], [7]]],
    ids=["list-of-strings", "list-of-token-id-lists"],
)
def test_a_batch_of_prompts_gets_one_choice_per_prompt_each_its_alone_answer(served, reference, prompts):
    handle, _ = served
    response = post(handle.url, {"prompt": prompts, "max_tokens": 8, "temperature": 0})
    got = choices(response)
    assert [c["index"] for c in got] == [0, 1, 2]
    for choice, prompt in zip(got, prompts):
        assert choice["text"] == reference(prompt, 8).text
    expected_prompt_tokens = sum(len(reference(p, 8).prompt_ids) for p in prompts)
    assert response.json()["usage"]["prompt_tokens"] == expected_prompt_tokens
    assert response.json()["usage"]["completion_tokens"] == sum(len(reference(p, 8).tokens) for p in prompts)

    streamed = stream(handle.url, {"prompt": prompts, "max_tokens": 8, "temperature": 0})
    assert streamed.done_count == 1 and len(streamed.finish_reasons) == 3
    for index, prompt in enumerate(prompts):
        text = "".join(c["choices"][0]["text"] for c in streamed.chunks if c["choices"] and c["choices"][0]["index"] == index)
        assert text == reference(prompt, 8).text


@pytest.mark.parametrize("model", ["gla", "qwen3-pretrained"], ids=["fixed-state", "kv-cache"])
def test_n_choices_of_a_batch_are_indexed_prompt_times_n_plus_choice(zoo_dir, model):
    handle, _ = start_server(zoo_dir, model, max_seqs=6, max_len=128)
    reference = reference_engine(zoo_dir, model, max_len=128)
    try:
        prompts = [PROMPT_IDS, [100, 200, 300]]
        got = choices(post(handle.url, {"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 3}))
        assert [c["index"] for c in got] == list(range(6))
        for choice in got:  # greedy: every copy of a prompt's state continues as the prompt alone does
            assert choice["text"] == reference(prompts[choice["index"] // 3], 6).text
    finally:
        handle.stop()


def test_n_sampled_choices_are_seeded_each_with_its_own_generator(served):
    handle, _ = served
    body = {"prompt": PROMPT_IDS, "max_tokens": 12, "temperature": 1.5, "seed": 4321, "n": 4, "ignore_eos": True}
    first, second = choices(post(handle.url, body)), choices(post(handle.url, body))
    assert [c["text"] for c in first] == [c["text"] for c in second]  # reproducible
    assert len({c["text"] for c in first}) > 1  # the copies draw differently
    # Choice j uses seed + j: choice 0 is what n = 1 gets, choice 2 what n = 1 with seed + 2 gets.
    alone = choices(post(handle.url, body | {"n": 1}))
    assert alone[0]["text"] == first[0]["text"]
    assert choices(post(handle.url, body | {"n": 1, "seed": 4323}))[0]["text"] == first[2]["text"]


def test_a_seeded_request_gives_the_same_text_whatever_shares_the_batch(served):
    handle, _ = served
    body = {"prompt": PROMPT_TEXT, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 99, "ignore_eos": True}
    alone = choices(post(handle.url, body))[0]["text"]
    results: dict[int, str] = {}

    def other(i: int) -> None:
        results[i] = choices(post(handle.url, {"prompt": [5 + i, 6, 7], "max_tokens": 24, "temperature": 0.8, "ignore_eos": True}))[0]["text"]

    threads = [threading.Thread(target=other, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    shared = choices(post(handle.url, body))[0]["text"]
    for thread in threads:
        thread.join(60)
    assert len(results) == 5
    assert shared == alone


def test_top_k_1_and_a_tiny_top_p_are_greedy_at_any_temperature(served, reference):
    handle, _ = served
    greedy = reference(PROMPT_IDS, 10).text
    for extra in ({"top_k": 1}, {"top_p": 1e-6}):
        got = choices(post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 10, "temperature": 2.0, "seed": 1} | extra))
        assert got[0]["text"] == greedy, extra


# ---------------------------------------------------------------- log-probabilities against Transformers


def greedy_tokens(model_dir, prompt: list[int], max_tokens: int) -> list[int]:
    """The engine's greedy tokens for a prompt decoded alone, past any end-of-text token."""
    engine = Engine.from_checkpoint(model_dir, EngineConfig(max_seqs=1, eager=True, max_len=256))
    engine.add_request("alone", prompt, max_tokens=max_tokens)
    return run_to_completion(engine)["alone"]


def transformers_logprobs(model_dir, ids: list[int]) -> torch.Tensor:
    """log_softmax (float32) of a Transformers forward over ids: [len(ids), vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("model", ["gla", "qwen3-pretrained"], ids=["fixed-state", "kv-cache"])
def test_logprobs_and_echo_equal_a_transformers_forward_on_the_same_tokens(zoo_dir, model):
    handle, engine = start_server(zoo_dir, model, max_seqs=2, max_len=256)
    try:
        body = {"prompt": PROMPT_IDS, "max_tokens": 6, "temperature": 0, "logprobs": 3, "echo": True, "ignore_eos": True}
        choice = choices(post(handle.url, body))[0]
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(PROMPT_IDS) + 6
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None  # nothing precedes the first token
        ids = PROMPT_IDS + greedy_tokens(zoo_dir / model, PROMPT_IDS, 6)
        assert logprobs["tokens"] == [engine.tokenizer.decode([t]) for t in ids]
        reference = transformers_logprobs(zoo_dir / model, ids)
        want = torch.stack([reference[i - 1, ids[i]] for i in range(1, len(ids))]).double()
        got = torch.tensor(logprobs["token_logprobs"][1:], dtype=torch.float64)
        assert ((got - want).norm() / want.norm()).item() <= TOL
        for i in range(1, len(ids)):  # the top 3 alternatives and their values
            top = torch.topk(reference[i - 1], 3)
            want_top = {engine.tokenizer.decode([t]): v for t, v in zip(top.indices.tolist(), top.values.tolist())}
            got_top = logprobs["top_logprobs"][i]
            assert set(want_top) <= set(got_top) and len(got_top) <= 4
            assert all(abs(got_top[t] - v) <= TOL * abs(v) + 1e-6 for t, v in want_top.items())
        # The text starts with the prompt's, and text_offset walks the tokens' texts.
        assert choice["text"].startswith(engine.tokenizer.decode(PROMPT_IDS))
        offsets = logprobs["text_offset"]
        assert offsets[0] == 0 and all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], logprobs["tokens"]))
    finally:
        handle.stop()


def test_lm_eval_style_scoring_request_and_streamed_logprobs_match_plain(served):
    handle, _ = served
    # What lm-eval's local-completions sends for a log-likelihood: token ids, echo, logprobs 1, max_tokens 1.
    batch = [PROMPT_IDS, [100, 200, 300, 400]]
    body = {"prompt": batch, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True, "seed": 1234}
    got = choices(post(handle.url, body))
    for choice, prompt in zip(got, batch):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt) + 1
        # is_greedy as lm-eval reads it: the chosen token's value is the top value (the generated one is greedy).
        assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())
    plain = choices(post(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 5, "temperature": 0, "logprobs": 2}))[0]["logprobs"]
    assert len(plain["tokens"]) == 5 and plain["text_offset"][0] == 0
    streamed = stream(handle.url, {"prompt": PROMPT_IDS, "max_tokens": 5, "temperature": 0, "logprobs": 2})
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in streamed.chunks:
        for choice in chunk["choices"]:
            for key in merged:
                merged[key] += choice["logprobs"][key]
    assert merged == plain
