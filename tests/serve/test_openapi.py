"""/openapi.json describes both generating routes' request and response bodies, and a property-based test
(schemathesis, from that same document) sends generated requests to a running server on loopback: no 5xx,
no hang, and every answer matches the response it is documented as.

The server is the tiny Qwen3 with a chat template, eager, with at most 16 new tokens a request, so each
generated request that is accepted is answered in well under a second. The budget is small (a few dozen
examples per route, derandomized): a regression check that runs in every suite, not a fuzzing campaign.
"""

from __future__ import annotations

import httpx
import pytest
from serve.test_http import start_server

EXAMPLES = 30  # per route


@pytest.fixture(scope="module")
def server(chat_model):
    handle, _ = start_server(chat_model.parent, chat_model, max_seqs=4, max_len=1024, max_new_tokens=16, max_prompt_tokens=512)
    yield handle.url
    handle.stop()


def test_openapi_describes_the_request_and_response_bodies(server):
    document = httpx.get(f"{server}/openapi.json", timeout=30).json()
    components = document["components"]["schemas"]
    for path, request, answer in [("/v1/completions", "CompletionRequest", "Completion"),
                                  ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletion")]:
        post = document["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{request}"}
        assert post["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{answer}"}
        assert post["responses"]["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    chat = components["ChatCompletionRequest"]["properties"]
    assert {"messages", "response_format", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens"} <= set(chat)
    assert components["ChatCompletionRequest"]["additionalProperties"] is False  # what the server refuses, the schema does too
    assert set(components["ChatMessage"]["properties"]["role"]["enum"]) == {"system", "developer", "user", "assistant", "tool"}
    assert "prompt" in components["CompletionRequest"]["required"]
    assert "ChatCompletionChunk" in components
    docs = httpx.get(f"{server}/docs", timeout=30)
    assert docs.status_code == 200 and "/openapi.json" in docs.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_generated_requests_get_no_server_error_and_documented_answers(server, path):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

    operation = schemathesis.openapi.from_url(f"{server}/openapi.json")[path]["POST"]
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    statuses: list[int] = []

    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(base_url=server, timeout=60)  # a hang fails here (requests' timeout), not in CI's clock
        statuses.append(response.status_code)
        case.validate_response(response, checks=checks)

    check()
    assert statuses and max(statuses) < 500
    assert 200 in statuses, statuses  # some generated requests were answered, not only refused
