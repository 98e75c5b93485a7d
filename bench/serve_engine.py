"""N clients on the serving engine in this process, no HTTP: inter-token latency and
tokens/s of the engine alone (what ``bench.serve`` measures through uvicorn, SSE and
httpx, without their share of a loaded machine's noise).

    BRAZE_NUM_THREADS=1 .venv/bin/python -m bench.serve_engine --clients 1,8 --duration 15

The request mix is ``bench.serve``'s (the same prompts, max_tokens, temperature 0,
``ignore_eos``), each prompt sent once for 8 tokens first (as its warm-up does: the
prefix cache then holds the prompts, as in a serving run); the engine is
``Engine(max_batch=8, ctx=1024, warmup=True)``. Per N: N clients send back to back,
5 s of load, then a window of ``--duration`` seconds: ITL is the gap between two
token events of one request inside the window (the engine's callback, on its thread).
Prints one JSON line: per N, ITL P50/P90/P99 ms, tok/s and the number of gaps.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np

from .serve import prompts


def run(levels: list[int], duration: float) -> dict[str, dict[str, float]]:
    from braze.models import load_llm
    from braze.serve.engine import Engine, Event, Request
    m = load_llm(None)
    mix = [(list(m.tokenizer.encode(p, add_special_tokens=True)), mt) for p, mt in prompts()]
    out: dict[str, dict[str, float]] = {}
    with Engine(m, max_batch=8, ctx=1024, warmup=True) as engine:
        for ids, _ in mix:
            done = threading.Event()
            engine.submit(Request(ids, 8, ignore_eos=True),
                          lambda ev, d=done: d.set() if ev.finish_reason else None)  # type: ignore[misc]
            done.wait(600)
        for n in levels:
            times: list[list[float]] = []
            stopping = threading.Event()

            def start(k: int) -> None:  # client's next request (on the engine's thread after the first)
                if stopping.is_set():
                    return
                ids, max_tokens = mix[k % len(mix)]
                rec: list[float] = []
                times.append(rec)

                def on_event(ev: Event, rec: list[float] = rec, k: int = k) -> None:
                    if ev.token_id is not None:
                        rec.append(time.perf_counter())
                    if ev.finish_reason:
                        start(k + 1)
                engine.submit(Request(ids, max_tokens, ignore_eos=True), on_event)
            for i in range(n):
                start(i)
            time.sleep(5)
            w0 = time.perf_counter()
            time.sleep(duration)
            w1 = time.perf_counter()
            stopping.set()
            recs = list(times)
            gaps = np.array([b - a for r in recs for a, b in zip(r, r[1:]) if w0 <= b < w1]) * 1e3
            tokens = sum(1 for r in recs for t in r if w0 <= t < w1)
            out[str(n)] = {"p50": float(np.percentile(gaps, 50)), "p90": float(np.percentile(gaps, 90)),
                           "p99": float(np.percentile(gaps, 99)), "tok_s": tokens / (w1 - w0), "n": len(gaps)}
            while engine.metrics().running or engine.metrics().waiting:  # the last requests finish
                time.sleep(0.2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serve_engine", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--clients", default="1,8", help="concurrent clients N, comma-separated (default 1,8)")
    ap.add_argument("--duration", type=float, default=15, help="measured seconds per N (default 15)")
    args = ap.parse_args(argv)
    res: dict[str, Any] = run([int(v) for v in args.clients.split(",")], args.duration)
    print(json.dumps({n: {k: round(v, 1) for k, v in r.items()} for n, r in res.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
