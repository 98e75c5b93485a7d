"""Refusals: OpenAI's error JSON with a 4xx status for every bad request (never a
5xx), and the API key."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from .conftest import API_KEY, CTX

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Hi"}]


def post(url: str, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + path, content=content, headers={"Content-Type": "application/json", **(headers or {})},
                      timeout=60)


def assert_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code


BAD_CHAT = [
    ({"messages": MESSAGES, "max_tokens": "5"}, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": True}, "max_tokens"),
    ({"messages": MESSAGES, "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": MESSAGES, "max_tokens": CTX}, "max_tokens"),  # with the prompt, past the context
    ({"messages": MESSAGES, "temperature": -1}, "temperature"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"messages": MESSAGES, "top_p": 0}, "top_p"),
    ({"messages": MESSAGES, "top_k": 1.5}, "top_k"),
    ({"messages": MESSAGES, "seed": -1}, "seed"),
    ({"messages": MESSAGES, "n": 2}, "n"),
    ({"messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": MESSAGES, "stop": 7}, "stop"),
    ({"messages": MESSAGES, "stream": "yes"}, "stream"),
    ({"messages": MESSAGES, "ignore_eos": 1}, "ignore_eos"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": MESSAGES, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": MESSAGES, "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": []}, "messages"),
    ({"messages": "Hi"}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
    ({"messages": ["Hi"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),  # a lone surrogate
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "messages[0].content"),
    ({"messages": MESSAGES, "stop": ["\ud800"]}, "stop"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT, ids=[p for _, p in BAD_CHAT])
def test_bad_chat_fields_are_400_naming_the_field(server: Any, body: dict[str, Any], param: str) -> None:
    assert_error(post(server.url, CHAT, body), 400, param=param)


BAD_OTHER = [
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": [1, "x"]}, "prompt"),
    ("/v1/completions", {"prompt": [10**9]}, "prompt"),  # outside the vocabulary
    ("/v1/completions", {"prompt": "Hi", "echo": True}, "echo"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 99}, "logprobs"),
    ("/v1/completions", {"prompt": []}, "prompt"),  # an empty prompt: no token to continue
    ("/v1/completions", {"prompt": "\ud83d"}, "prompt"),
    ("/v1/embeddings", {"input": ["ok", "\ud83d"]}, "input"),
    ("/v1/embeddings", {"input": 5}, "input"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
]


@pytest.mark.parametrize("path,body,param", BAD_OTHER, ids=[f"{p}:{q}" for p, _, q in BAD_OTHER])
def test_bad_completion_and_embedding_fields_are_400(server: Any, path: str, body: dict[str, Any],
                                                     param: str) -> None:
    assert_error(post(server.url, path, body), 400, param=param)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe", b"[" * 100_000, b""])
def test_bodies_that_are_not_a_json_object_are_400(server: Any, body: bytes) -> None:
    assert_error(post(server.url, CHAT, body), 400, code="invalid_json")


def test_a_prompt_past_the_context_is_400(server: Any) -> None:
    long = " ".join(["word"] * (CTX * 2))
    assert_error(post(server.url, CHAT, {"messages": [{"role": "user", "content": long}], "max_tokens": 1}), 400,
                 code="context_length_exceeded")
    assert_error(post(server.url, "/v1/completions", {"prompt": [1] * CTX}), 400, code="context_length_exceeded")


def test_unknown_models_paths_and_methods(server: Any) -> None:
    assert_error(post(server.url, CHAT, {"model": "gpt-4o", "messages": MESSAGES}), 404, param="model",
                 code="model_not_found")
    assert_error(httpx.get(server.url + "/v1/nothing"), 404, code="not_found")
    assert_error(httpx.get(server.url + "/v1/models/gpt-4o"), 404, code="model_not_found")
    assert_error(httpx.get(server.url + CHAT), 405, code="method_not_allowed")


def test_the_openai_client_sees_typed_errors(client: Any, engine: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_name, messages=MESSAGES, n=3)
    assert info.value.status_code == 400 and "n" in str(info.value.body)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=engine.model_name, input="a")  # the LLM does not embed


def test_api_key(keyed_server: Any, engine: Any) -> None:
    url = keyed_server.url
    assert_error(httpx.get(url + "/v1/models"), 401, code="invalid_api_key")
    assert_error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer nope"}), 401)
    assert_error(httpx.get(url + "/v1/models", headers={"Authorization": API_KEY}), 401)  # no scheme
    assert_error(post(url, CHAT, {"messages": MESSAGES}), 401)  # refused before the body is read
    assert httpx.get(url + "/health").status_code == 200  # health and metrics stay open to probes
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert [m.id for m in right.models.list().data][0] == engine.model_name


def test_a_body_over_the_limit_is_413(keyed_server: Any) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}  # the keyed app's limit is 4096 bytes
    assert_error(post(keyed_server.url, CHAT, big, headers=headers), 413)

    def chunks() -> Any:  # no Content-Length: the limit holds while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'
    r = httpx.post(keyed_server.url + CHAT, content=chunks(), headers=headers, timeout=60)
    assert_error(r, 413)


def test_metrics_count_requests_by_status(server: Any) -> None:
    post(server.url, CHAT, {"messages": "not a list"})
    text = httpx.get(server.url + "/metrics").text
    assert 'braze_requests_total{endpoint="/v1/chat/completions",status="400"}' in text
    assert not any(line.startswith("braze_requests_total") and 'status="5' in line for line in text.splitlines())
