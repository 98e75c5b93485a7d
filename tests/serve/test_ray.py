"""Scale-out (issue 17, item 6): two replicas of the engine behind Ray Serve's HTTP
proxy on a local Ray cluster; requests reach both, and the ``openai`` client works
through the proxy unchanged. Every wait is bounded; Ray is shut down afterwards."""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (braze's 'scale' extra: pip install -e '.[scale]')")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
httpx = pytest.importorskip("httpx", reason="httpx is not installed (braze's dev extra)")
openai = pytest.importorskip("openai", reason="the openai client is not installed (braze's dev extra)")
if importlib.util.find_spec("braze.serve.app") is None:
    pytest.skip("the HTTP layer (braze.serve.app.create_app) is not on this branch yet", allow_module_level=True)

from braze.models import default_llm_path  # noqa: E402
from braze.serve.engine import served_name  # noqa: E402
from braze.serve.ray_serve import REPLICA_HEADER, deploy, shutdown  # noqa: E402

PROMPT = "The capital of France is"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: the Ray cluster's processes inherit this process's environment when it starts: no
#: usage report over the network; the replicas' engines fused even in the suite's
#: reference pass (as tests/serve/conftest.py does for the HTTP tests)
CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "BRAZE_FUSION": "1"}


@pytest.fixture(scope="module")
def proxy() -> Iterator[str]:
    """The proxy's base URL, two replicas behind it (one kernel thread, one CPU each)."""
    old = {k: os.environ.get(k) for k in CLUSTER_ENV}
    os.environ.update(CLUSTER_ENV)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield deploy(None, replicas=2, port=_free_port(), max_batch=2, ctx=256, threads=1, cpus_per_replica=1,
                     ready_timeout=300)
    finally:
        shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_requests_reach_both_replicas(proxy: str) -> None:
    seen: dict[str, int] = {}

    def health() -> str:
        # a connection per request, as separate clients would have
        r = httpx.get(f"{proxy}/health", timeout=30)
        assert r.status_code == 200, r.text
        return r.headers[REPLICA_HEADER]

    deadline = time.monotonic() + 60
    with ThreadPoolExecutor(4) as pool:
        while len(seen) < 2 and time.monotonic() < deadline:
            for name in pool.map(lambda _: health(), range(8)):
                seen[name] = seen.get(name, 0) + 1
    assert len(seen) == 2, f"every request went to one replica: {seen}"
    pids = {name.rsplit("pid-", 1)[1] for name in seen}
    assert len(pids) == 2 and str(os.getpid()) not in pids, seen  # two processes, neither this one


def test_openai_client_through_the_proxy(proxy: str) -> None:
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", timeout=180, max_retries=0)
    model = served_name(default_llm_path())
    assert model in [m.id for m in client.models.list().data]

    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    text = whole.choices[0].text
    assert text.strip(), whole
    assert whole.usage is not None and 1 <= whole.usage.completion_tokens <= 4

    # Streamed, greedy: the same text whichever replica answers.
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, stream=True))
    assert len(chunks) >= 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
