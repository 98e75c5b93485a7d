"""``bench.serve`` measures what it says: run against a fake OpenAI-compatible server
(the standard library's HTTP server, in a thread, on 127.0.0.1) whose tokens come at
a known pace, the report has the tokens/s, the inter-token latency, the requests and
the KV gauge that the fake produced. The fake refuses ``ignore_eos`` (as a strict
server would), so the fallback is exercised too. About 6 seconds; no speed of a real
server is asserted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx", reason="bench.serve's client is httpx (braze's dev extra)")

from bench import serve as bench_serve  # noqa: E402

TOKENS = 6        # tokens per request
GAP = 0.02        # seconds between tokens


class _Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    active = 0
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b'{"status":"ok"}')
        elif self.path == "/metrics":
            with _Fake.lock:
                used = _Fake.active * 4
            text = ("# HELP braze_kv_blocks_total blocks\n# TYPE braze_kv_blocks_total gauge\n"
                    "braze_kv_blocks_total 64\n"
                    f'braze_kv_blocks_used{{model="fake"}} {used}\nbraze_queue_depth 0\n')
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("ignore_eos") is not None:
            self._send(400, b'{"error":{"message":"unknown field ignore_eos","type":"invalid_request_error"}}')
            return
        assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["temperature"] == 0
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(obj: Any) -> None:
            data = f"data: {json.dumps(obj) if not isinstance(obj, str) else obj}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        with _Fake.lock:
            _Fake.active += 1
        try:
            for i in range(TOKENS):
                time.sleep(GAP)
                event({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})
            event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
            event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 9}})
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the benchmark cuts the requests still streaming at the end
        finally:
            with _Fake.lock:
                _Fake.active -= 1


@pytest.fixture
def fake() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_parse_metrics_prefers_used() -> None:
    text = "# TYPE x gauge\nbraze_kv_blocks_total 64\nbraze_kv_blocks_used{a=\"b\"} 12\nother 1\n"
    assert bench_serve.parse_metrics(text, "kv_blocks") == ("braze_kv_blocks_used", 12.0)
    assert bench_serve.parse_metrics(text, "nothing") is None


def test_against_a_fake_server(fake: str, tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    rc = bench_serve.main(["--servers", "", "--url", f"fake={fake}", "--clients", "1,2", "--threads", "1",
                           "--duration", "2", "--warmup", "0.2", "--drain", "0.3", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["server"] == "fake"
    assert row["notes"] == ["ignore_eos refused: lengths are what the model streamed"]
    one, two = row["levels"]
    assert (one["clients"], two["clients"]) == (1, 2)
    for lv in (one, two):
        assert lv["errors"] == 0 and lv["requests_done"] >= 3 and lv["requests_stopped"] == 0, lv
        assert lv["ignore_eos"] is False
        # one request is TOKENS tokens GAP apart (+ the fake's and the client's overheads)
        assert GAP * 0.9 <= lv["itl_ms"]["p50"] / 1000 <= GAP * 5, lv["itl_ms"]
        assert lv["ttft_ms"]["p50"] / 1000 >= GAP * 0.9
        per_client = lv["tokens_per_s"] / lv["clients"]
        assert 0.2 / GAP <= per_client <= 1.1 / GAP, lv
        assert lv["kv_metric"] == "braze_kv_blocks_used"
        assert 4 <= lv["kv_peak"] <= 4 * lv["clients"], lv  # 4 blocks per streaming request
        assert lv["kv_after"] == 0.0  # the cut requests' streams have ended
    assert two["tokens_per_s"] > 1.3 * one["tokens_per_s"]  # the fake serves clients in parallel
    assert "| fake | 1 | 2 |" in res["markdown"]
