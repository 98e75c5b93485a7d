"""Many clients at once (``httpx``): concurrent greedy requests get the single-client
answer, a client that disconnects has its sequence cancelled and its memory freed, and
a burst past the queue limit gets 429s, never a 5xx."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from .conftest import MAX_BATCH, QUEUE_LIMIT, metric

BODY = {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}
#: how long a test waits for the engine to settle (a bound against hanging, not a timing check)
SETTLE_S = 120.0


def settled(url: str, aborted_before: float) -> str:
    """/metrics once no sequence runs or waits and an abort beyond ``aborted_before`` is counted."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        text = httpx.get(url + "/metrics", timeout=30).text
        idle = metric(text, "braze_running_sequences") == 0 and metric(text, "braze_queue_depth") == 0
        if idle and metric(text, "braze_sequences_aborted_total") > aborted_before:
            return text
        assert time.monotonic() < deadline, "the engine did not settle:\n" + text
        time.sleep(0.1)


def test_concurrent_clients_get_the_single_client_answer(server: Any) -> None:
    single = httpx.post(server.url + "/v1/completions", json=BODY, timeout=120).json()["choices"][0]["text"]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=BODY) for _ in range(8)))
    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 8
    assert [r.json()["choices"][0]["text"] for r in responses] == [single] * 8
    assert len({r.json()["id"] for r in responses}) == 8


def test_a_client_that_disconnects_mid_stream_frees_its_sequence(server: Any) -> None:
    before = httpx.get(server.url + "/metrics").text
    aborted, generated = metric(before, "braze_sequences_aborted_total"), metric(before, "braze_generated_tokens_total")
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: {")).startswith("data: ")
    after = settled(server.url, aborted)  # the stream closed after its first token
    assert metric(after, "braze_kv_blocks_used") == 0
    assert metric(after, "braze_generated_tokens_total") - generated < 400


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_sequence(server: Any) -> None:
    aborted = metric(httpx.get(server.url + "/metrics").text, "braze_sequences_aborted_total")
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
    try:
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
    except httpx.ReadTimeout:
        pass
    else:
        raise AssertionError("400 tokens came back within a second; the test needs a slower answer")
    after = settled(server.url, aborted)
    assert metric(after, "braze_kv_blocks_used") == 0
    assert 'endpoint="/v1/completions",status="499"' in after


def test_a_burst_past_the_queue_limit_gets_429s_and_no_5xx(server: Any) -> None:
    n = 3 * (MAX_BATCH + QUEUE_LIMIT)
    body = {**BODY, "max_tokens": 2}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120,
                                     limits=httpx.Limits(max_connections=n)) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(n)))
    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200, 429}, statuses
    assert statuses.count(200) >= MAX_BATCH
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.headers["retry-after"]
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "braze_running_sequences") == 0 and metric(text, "braze_kv_blocks_used") == 0
