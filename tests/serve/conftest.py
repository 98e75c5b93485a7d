"""A braze server on 127.0.0.1 for the tests: uvicorn in a thread of the test process,
on a port the OS picked, over one engine shared by the session (the model is loaded
once). Every server is stopped, and the engine closed, in the fixtures' teardown."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator

import pytest

#: an engine small enough for this machine: tests ask for a few tokens each
MAX_BATCH, CTX, QUEUE_LIMIT = 4, 512, 8
API_KEY = "sk-test-0123456789"
START_TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def fused(monkeypatch: Any) -> None:
    """These tests are about the HTTP layer: the engine runs fused even in the suite's
    reference pass (``BRAZE_FUSION=0``, where four tokens take ~45 s here); the model's
    reference path is tested by the model tests. Read at each flush, so set per test."""
    monkeypatch.setenv("BRAZE_FUSION", "1")


class ServerThread:
    """``app`` served by uvicorn in a daemon thread; ``url`` once started."""

    def __init__(self, app: Any) -> None:
        import uvicorn
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


@pytest.fixture(scope="session")
def engine(smollm: Any, minilm: Any) -> Iterator[Any]:
    from braze.serve.engine import Engine
    with Engine(smollm, embedder=minilm, max_batch=MAX_BATCH, ctx=CTX, queue_limit=QUEUE_LIMIT) as e:
        yield e


@pytest.fixture(scope="session")
def server(engine: Any) -> Iterator[ServerThread]:
    from braze.serve.app import create_app
    with ServerThread(create_app(engine)) as s:
        yield s


@pytest.fixture(scope="session")
def keyed_server(engine: Any) -> Iterator[ServerThread]:
    """A second app over the same engine, requiring ``API_KEY``."""
    from braze.serve.app import create_app
    with ServerThread(create_app(engine, api_key=API_KEY, max_body_bytes=4096)) as s:
        yield s


@pytest.fixture
def client(server: ServerThread) -> Any:
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def metric(text: str, name: str) -> float:
    """One unlabelled sample of a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
