"""What the server says when it, not the request, fails: an engine step that raises is
a 500 (or an error event inside a stream that already began), a closing engine a 503,
and a server without an embedding model answers /v1/embeddings with a 404."""

from __future__ import annotations

import threading
from typing import Any, Callable

import httpx
import pytest

from braze.serve.app import create_app
from braze.serve.engine import Engine, Event, Metrics, Request

from .conftest import ServerThread
from .test_errors import assert_error

BODY = {"prompt": "Hi", "max_tokens": 4}


class FailingEngine:
    """The engine's interface, answering every request with one last event whose
    ``finish_reason`` is ``reason`` (what a failed step, or a shutdown, sends)."""

    embedder = None
    embedder_name = None
    context_length = 64

    def __init__(self, tokenizer: Any, reason: str) -> None:
        self.tokenizer, self.reason = tokenizer, reason
        self.model_name = "failing"
        self.cancelled: list[int] = []

    def start(self) -> "FailingEngine":
        return self

    def check(self, req: Request) -> None:
        pass

    def submit(self, req: Request, on_event: Callable[[Event], None]) -> int:
        ev = Event(0, text="partial", token_id=5, finish_reason=None, prompt_tokens=len(req.prompt_ids))
        last = Event(0, finish_reason=self.reason, error=RuntimeError("a kernel failed"))
        def send() -> None:  # on another thread, as the engine's
            on_event(ev)
            on_event(last)
        threading.Timer(0.05, send).start()
        return 0

    def cancel(self, seq_id: int) -> None:
        self.cancelled.append(seq_id)

    def metrics(self) -> Metrics:
        return Metrics()


@pytest.mark.parametrize("reason,status", [("error", 500), ("abort", 503)])
def test_engine_failures_are_5xx_with_openai_errors(smollm: Any, reason: str, status: int) -> None:
    engine = FailingEngine(smollm.tokenizer, reason)
    with ServerThread(create_app(engine)) as s:  # type: ignore[arg-type]
        assert_error(httpx.post(s.url + "/v1/completions", json=BODY, timeout=30), status)
        r = httpx.post(s.url + "/v1/completions", json={**BODY, "stream": True}, timeout=30)
        events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200  # the stream had begun: the failure is its last event, before [DONE] (as vLLM)
    assert '"partial"' in events[0] and '"error"' in events[-2] and events[-1] == "data: [DONE]"


def test_no_embedding_model_is_404(smollm: Any) -> None:
    engine = Engine(smollm)  # its thread starts with the app and is given no work
    try:
        with ServerThread(create_app(engine)) as s:
            assert_error(httpx.post(s.url + "/v1/embeddings", json={"input": "a"}, timeout=30), 404,
                         code="model_not_found")
            assert [m["id"] for m in httpx.get(s.url + "/v1/models").json()["data"]] == [engine.model_name]
    finally:
        engine.close()
