"""One program at many shapes (issue 15): what a new shape costs, and how fast it runs.

    .venv/bin/python -m bench.shapes                       # GELU on 10 shapes, then prefill at 50 lengths
    .venv/bin/python -m bench.shapes --threads 1,2 --reps 10 --no-prefill

Everything runs in a fresh cache directory (nothing compiled before), in one process:

- The custom-erf GELU (``bench.fusion.gelu_custom``: erf from ``where``, ``abs``,
  ``exp`` and arithmetic) on 10 shapes one after another: per shape, the first call
  (scheduling, and compiling where it must), the C modules compiled for it, and the
  median of ``--reps`` calls after warm-up beside the hand-written C loop
  (``bench/baselines/gelu.c``, -O3 -ffast-math, OpenMP), in interleaved rounds, eager
  (the ~25 ops recorded at every call) and under ``@braze.jit`` (replayed: what a
  small shape needs, whose kernel takes less than its recording). Any call on the
  reference executor is counted and reported.
- The default model's prefill (``generate.PrefillStep``, as ``braze generate`` runs a
  prompt) of 50 prompts of distinct lengths from 1 to 512: the C modules compiled, and
  how many shapes of the prompt's program were planned.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .fusion import gelu_custom
from .harness import build_baselines, machine

# the three, then seven more: other ranks, odd sizes, square, a broadcastless 4-d
SHAPES = [(64, 256), (256, 1024), (32, 512, 2048), (1000, 300), (7, 9, 13, 1001), (4000, 777), (3, 4096),
          (1024, 1024), (16, 16, 64, 64), (2000, 1000)]


def _count(name: str) -> int:
    from braze.stats import COUNTERS
    return COUNTERS[name]


def gelu_shapes(threads: list[int], reps: int) -> list[dict[str, Any]]:
    import ctypes

    import braze

    lib = build_baselines(Path(tempfile.mkdtemp(prefix="braze-shapes-c-")))
    jitted = braze.jit(lambda x: gelu_custom(braze, x))
    c_gelu = lib.gelu_erf_custom
    c_gelu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    rows = []
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        a = rng.standard_normal(shape).astype(np.float32)
        x = braze.from_numpy(a)
        out = np.empty_like(a)
        before, unfused = _count("kernels_compiled"), _count("unfused_flushes")
        t = time.perf_counter()
        y = gelu_custom(braze, x).numpy()
        first = time.perf_counter() - t
        row: dict[str, Any] = {"shape": list(shape), "first_ms": first * 1e3,
                               "compiled": _count("kernels_compiled") - before}
        for nt in threads:
            braze.set_num_threads(nt)
            c_gelu(a.ctypes.data, out.ctypes.data, a.size, nt)
            err = float(np.abs(out - y).max())
            for _ in range(2):
                gelu_custom(braze, x).numpy()
                jitted(x).numpy()
            tb: list[float] = []
            tj: list[float] = []
            tc: list[float] = []
            for _ in range(reps):
                t = time.perf_counter()
                gelu_custom(braze, x).numpy()
                tb.append(time.perf_counter() - t)
                t = time.perf_counter()
                jitted(x).numpy()
                tj.append(time.perf_counter() - t)
                t = time.perf_counter()
                c_gelu(a.ctypes.data, out.ctypes.data, a.size, nt)
                tc.append(time.perf_counter() - t)
            b, j, c = statistics.median(tb), statistics.median(tj), statistics.median(tc)
            row[f"t{nt}"] = {"braze_ms": b * 1e3, "jit_ms": j * 1e3, "c_ms": c * 1e3, "ratio": b / c,
                             "jit_ratio": j / c, "max_abs_diff_vs_c": err}
        row["unfused_flushes"] = _count("unfused_flushes") - unfused
        rows.append(row)
    return rows


def prefill_lengths(n_prompts: int = 50) -> dict[str, Any]:
    from braze.generate import PrefillStep
    from braze.models import load_llm

    loaded = load_llm(None)
    model = loaded.model
    lengths = sorted({int(v) for v in np.linspace(1, 512, n_prompts)})
    caches = model.new_cache(576)
    step = PrefillStep(model, caches)
    before, unfused, t0 = _count("kernels_compiled"), _count("unfused_flushes"), time.perf_counter()
    first_ms = []
    for n in lengths:
        for c in caches:
            c.length = 0
        t = time.perf_counter()
        step([(i * 7919) % model.config.vocab_size for i in range(n)])
        first_ms.append((time.perf_counter() - t) * 1e3)
    return {"prompts": len(lengths), "lengths": lengths, "compiled": _count("kernels_compiled") - before,
            "seconds": time.perf_counter() - t0, "buckets": sorted(step.buckets), "call_ms": first_ms,
            "unfused_flushes": _count("unfused_flushes") - unfused}


def markdown(res: dict[str, Any]) -> str:
    threads = res["threads"]
    head = "| shape | first call ms | compiled | " + " | ".join(
        f"C ms ({t}t) | braze / C ({t}t) | jit / C ({t}t)" for t in threads) + " | unfused flushes |"
    lines = [f"CPU: {res['machine']['cpu']}", "", head, "|" + "---|" * (4 + 3 * len(threads))]
    for r in res["gelu"]:
        cells = [f"{r[f't{t}']['c_ms']:.3f} | {r[f't{t}']['ratio']:.2f}x | {r[f't{t}']['jit_ratio']:.2f}x"
                 for t in threads]
        lines.append(f"| {tuple(r['shape'])} | {r['first_ms']:.1f} | {r['compiled']} | " + " | ".join(cells)
                     + f" | {r['unfused_flushes']} |")
    total = sum(r["compiled"] for r in res["gelu"])
    lines.append(f"\nGELU: {total} C modules compiled over {len(res['gelu'])} shapes.")
    p = res.get("prefill")
    if p:
        lines.append(f"Prefill of {p['prompts']} prompt lengths 1..512: {p['compiled']} C modules compiled "
                     f"(buckets {p['buckets']}), {p['seconds']:.1f} s in all, flushes on the reference "
                     f"executor: {p['unfused_flushes']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out"))
    args = ap.parse_args(argv)
    os.environ["BRAZE_CACHE_DIR"] = tempfile.mkdtemp(prefix="braze-shapes-cache-")  # nothing compiled before
    threads = [int(t) for t in args.threads.split(",")]
    res: dict[str, Any] = {"machine": machine(), "threads": threads, "reps": args.reps,
                           "gelu": gelu_shapes(threads, args.reps)}
    if not args.no_prefill:
        res["prefill"] = prefill_lengths()
    res["markdown"] = markdown(res)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"shapes-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1))
    print(res["markdown"])
    print(f"\nwrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
