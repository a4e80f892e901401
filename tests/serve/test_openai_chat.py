"""POST /v1/chat/completions through the official openai client, over real HTTP on loopback.

The tiny zoo's tokenizers have no chat template, so the chat tests serve a copy of the tiny Qwen3 with a
ChatML template added (chat_template.jinja, which Transformers reads from the folder); the zoo model as it
is must get a 400 that says it has no template. The prompt must be the model's own template with the
assistant's turn opened, and the answer the engine's greedy continuation of exactly those tokens. The
real SmolLM2-135M-Instruct (its own template) answers in English, streamed equal to plain.
"""

from __future__ import annotations

import httpx
import pytest
from serve.test_http import reference_engine, start_server

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "The quick brown fox"},
    {"role": "assistant", "content": "jumps over"},
    {"role": "user", "content": "the lazy dog?"},
]


@pytest.fixture(scope="module")
def chat_server(zoo_dir, chat_model):
    handle, engine = start_server(zoo_dir, chat_model, max_seqs=4, max_len=256)
    yield handle, engine
    handle.stop()


@pytest.fixture(scope="module")
def client(chat_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{chat_server[0].url}/v1", api_key="unused", max_retries=0, timeout=60)


def template_ids(engine, messages) -> list[int]:
    text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    return engine.tokenizer.encode(text, add_special_tokens=False)


def test_chat_answer_is_the_greedy_continuation_of_the_models_own_template(zoo_dir, chat_server, client):
    _, engine = chat_server
    expected = reference_engine(zoo_dir, "qwen3-pretrained", max_len=256)  # the same weights as the copy
    ids = template_ids(engine, MESSAGES)
    want = expected(ids, 10)
    plain = client.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=10, temperature=0)
    choice = plain.choices[0]
    assert plain.object == "chat.completion" and plain.id.startswith("chatcmpl-") and plain.model == "qwen3-chat"
    assert choice.message.role == "assistant" and choice.message.content == want.text
    assert choice.finish_reason == ("length" if len(want.tokens) == 10 else "stop")
    assert plain.usage.prompt_tokens == len(ids) and plain.usage.completion_tokens == len(want.tokens)

    chunks = list(client.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_completion_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1


def test_chat_stop_strings_seed_n_and_logprobs(chat_server, client):
    _, engine = chat_server
    base = client.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=12, temperature=0)
    text = base.choices[0].message.content
    assert len(text) >= 4, text
    stop = text[2:4]
    stopped = client.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=12, temperature=0, stop=[stop])
    assert stopped.choices[0].message.content == text[: text.find(stop)] and stopped.choices[0].finish_reason == "stop"

    sampled = [client.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=7, n=3)
               for _ in range(2)]
    assert [c.index for c in sampled[0].choices] == [0, 1, 2]
    assert [c.message.content for c in sampled[0].choices] == [c.message.content for c in sampled[1].choices]

    with_logprobs = client.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=5, temperature=0,
                                                   logprobs=True, top_logprobs=3)
    content = with_logprobs.choices[0].logprobs.content
    assert len(content) == with_logprobs.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy: the chosen token is the most likely
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"messages": []}, 422, "messages: List should have at least 1 item"),
        ({"messages": [{"role": "function", "content": "x"}]}, 422,
         "the role must be system, developer, user, assistant or tool, got 'function'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
         "messages.0.content.0: a part of type 'image_url' is not supported"),
        ({"messages": [{"role": "user", "content": 5}]}, 422, "messages.0.content: expected a string or a list of"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "top_logprobs needs logprobs: true"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, 422, "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o"}, 404, "the model 'gpt-4o' does not exist"),
    ],
    ids=["no-messages", "function-role", "image-part", "number-content", "top-logprobs-alone", "zero-tokens", "unknown-model"],
)
def test_bad_chat_requests_get_a_clear_error(chat_server, body, status, message):
    response = httpx.post(f"{chat_server[0].url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_a_model_without_a_chat_template_gets_a_400_that_says_so(zoo_dir):
    from openai import BadRequestError, OpenAI

    handle, _ = start_server(zoo_dir, "gla")
    try:
        client = OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(BadRequestError, match="has no chat template"):
            client.chat.completions.create(model="gla", messages=[{"role": "user", "content": "hi"}])
        assert client.completions.create(model="gla", prompt="hi", max_tokens=2).choices  # completions still serve
    finally:
        handle.stop()


@pytest.mark.slow
def test_the_real_instruct_model_chats_through_the_openai_client_streamed_or_not(real_model_dir):
    from openai import OpenAI

    handle, engine = start_server(real_model_dir.parent, real_model_dir, max_seqs=2, max_len=512)
    try:
        client = OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        plain = client.chat.completions.create(model=real_model_dir.name, messages=messages, max_tokens=16, temperature=0)
        text = plain.choices[0].message.content
        assert "Paris" in text, text
        assert plain.choices[0].finish_reason == "stop"  # the model ended its turn with <|im_end|>
        assert plain.usage.prompt_tokens == len(template_ids(engine, messages))
        stream = client.chat.completions.create(model=real_model_dir.name, messages=messages, max_tokens=16, temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    finally:
        handle.stop()
