"""A soak of ``braze serve``: many requests against a server this script starts, 10%
of them disconnecting mid-stream and 10% malformed; afterwards, no 5xx, no KV blocks
held (/metrics) and the server's resident memory back near its idle level.

  normal      chat or completions, streamed or not, greedy or sampled, a few tokens
  disconnect  a streamed completion asking for many tokens, closed after its first token
  malformed   one of ``MALFORMED`` (bad JSON, wrong types, unknown roles, a prompt past
              the context, a body over the size limit...): each must be a 4xx

Reports the counts by kind and status, /metrics' KV blocks and running sequences
afterwards, and the server's RSS idle before (after a warm-up) and idle after.
Exit 1 on any 5xx or transport error, or KV blocks still held.
Run: ``python -m bench.soak [--requests 1000] [--concurrency 16] [--max-tokens 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

CTX = 512
MESSAGES = [{"role": "user", "content": "Name a colour."}]
#: malformed requests, each a (path, raw body) the server must refuse with a 4xx
MALFORMED: list[tuple[str, bytes]] = [
    ("/v1/chat/completions", b"{not json"),
    ("/v1/chat/completions", b"[1, 2, 3]"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": MESSAGES, "max_tokens": "ten"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": MESSAGES, "max_tokens": -1}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": MESSAGES, "n": 3}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": MESSAGES, "temperature": float("nan")}).encode()),
    ("/v1/completions", json.dumps({"prompt": "word " * (2 * CTX), "max_tokens": 1}).encode()),
    ("/v1/completions", json.dumps({"prompt": [10**9]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 10 * CTX}).encode()),
    ("/v1/embeddings", json.dumps({"input": [1, 2]}).encode()),
    ("/v1/chat/completions", b'{"messages": "' + b"x" * (5 << 20) + b'"}'),  # past the 4 MiB limit
    ("/v1/chat/completions", b"\xff\xfe\x00"),
    ("/v1/chat/completions", b"[" * 50_000),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


async def wait_idle(c: httpx.AsyncClient, timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = (await c.get("/metrics")).text
        if metric(text, "braze_running_sequences") == 0 and metric(text, "braze_queue_depth") == 0:
            return text
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not go idle")
        await asyncio.sleep(0.2)


async def normal(c: httpx.AsyncClient, i: int, max_tokens: int) -> int:
    chat, stream = i % 2 == 0, i % 3 == 0
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0 if i % 4 else 0.8, "seed": i, "stream": stream}
    body.update({"messages": MESSAGES} if chat else {"prompt": f"Item {i}: the"})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not stream:
        return (await c.post(path, json=body)).status_code
    async with c.stream("POST", path, json=body) as r:
        lines = [line async for line in r.aiter_lines() if line]
        if r.status_code == 200 and lines[-1] != "data: [DONE]":
            raise RuntimeError(f"a stream ended without [DONE]: {lines[-1]!r}")
        return r.status_code


async def disconnect(c: httpx.AsyncClient, i: int) -> int:
    body = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0.8, "seed": i, "stream": True}
    async with c.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                break  # leaving the block closes the connection mid-stream
        return r.status_code


async def malformed(c: httpx.AsyncClient, i: int) -> int:
    path, raw = MALFORMED[i % len(MALFORMED)]
    return (await c.post(path, content=raw, headers={"Content-Type": "application/json"})).status_code


async def soak(url: str, pid: int, n: int, concurrency: int, max_tokens: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    kinds = ["disconnect"] * (n // 10) + ["malformed"] * (n // 10)
    kinds += ["normal"] * (n - len(kinds))
    rng.shuffle(kinds)
    seen: Counter[str] = Counter()
    jobs = []  # (kind, its ordinal among its kind: every malformed body is sent in turn)
    for kind in kinds:
        jobs.append((kind, seen[kind]))
        seen[kind] += 1
    rss_trail: list[float] = []
    counts: Counter[tuple[str, str]] = Counter()
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        # warm-up: every kind of request, one at a time and then as many at once as the
        # soak sends, so the engine's step buckets (batch sizes, table widths) are compiled
        # and captured before the idle RSS is taken: a capture per bucket is not growth
        for i in range(4):
            await normal(c, i, max_tokens)
        for _ in range(3):
            await asyncio.gather(*(normal(c, i, max_tokens) for i in range(concurrency)))
        await c.post("/v1/embeddings", json={"input": "warm"})
        await wait_idle(c)
        rss_before = rss_bytes(pid)
        sem = asyncio.Semaphore(concurrency)
        done = 0
        t0 = time.monotonic()

        async def one(i: int, kind: str) -> None:
            nonlocal done
            async with sem:
                try:
                    fn = {"normal": lambda: normal(c, i, max_tokens), "disconnect": lambda: disconnect(c, i),
                          "malformed": lambda: malformed(c, i)}[kind]
                    status = str(await fn())
                except (httpx.HTTPError, RuntimeError) as e:
                    status = f"error: {type(e).__name__}"
                counts[(kind, status)] += 1
                done += 1
                if done % 100 == 0:
                    rss_trail.append(round(rss_bytes(pid) / 2**20, 1))
                    print(f"  {done}/{n} requests, {time.monotonic() - t0:.0f} s, RSS {rss_trail[-1]} MiB",
                          file=sys.stderr)
        await asyncio.gather(*(one(i, k) for k, i in jobs))
        seconds = time.monotonic() - t0
        text = await wait_idle(c)
        await asyncio.sleep(2)
        rss_after = rss_bytes(pid)
    return {"requests": n, "seconds": round(seconds, 1), "by_kind_status": {f"{k} {s}": v for (k, s), v in
                                                                         sorted(counts.items())},
            "server_errors": sum(v for (k, s), v in counts.items() if s.startswith("5") or s.startswith("error")),
            "kv_blocks_used_after": metric(text, "braze_kv_blocks_used"),
            "running_after": metric(text, "braze_running_sequences"),
            "aborted_total": metric(text, "braze_sequences_aborted_total"),
            "rss_idle_before_mib": round(rss_before / 2**20, 1), "rss_idle_after_mib": round(rss_after / 2**20, 1),
            "rss_every_100_mib": rss_trail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=3)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", help="GGUF file (default: the default model)")
    args = ap.parse_args(argv)
    port = free_port()
    cmd = [sys.executable, "-m", "braze.cli", "serve", "--port", str(port), "--ctx", str(CTX),
           "--max-batch", str(args.max_batch), "--queue-limit", str(4 * args.concurrency)]
    cmd += ["--model", args.model] if args.model else []
    log = tempfile.NamedTemporaryFile("w+", prefix="braze-soak-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (log: {log.name})")
            time.sleep(0.2)
        report = asyncio.run(soak(url, proc.pid, args.requests, args.concurrency, args.max_tokens, args.seed))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(report, indent=2))
    ok = report["server_errors"] == 0 and report["kv_blocks_used_after"] == 0
    print(f"soak: {'ok' if ok else 'FAILED'} (server log: {log.name})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
