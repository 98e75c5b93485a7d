"""Reduction-fusion benchmarks: softmax and attention, braze against hand-written C, numpy and PyTorch.

    .venv/bin/python -m bench.attention                   # the full run, 1 and 2 threads
    .venv/bin/python -m bench.attention --smoke           # tiny shapes, 1 rep: does it still work
    .venv/bin/python -m bench.attention --threads 1 --programs softmax,prefill_N4096
    .venv/bin/python -m bench.attention --threads 1 --programs prefill_N1024,decode --dtype float16

Programs (float32, or attention in ``--dtype``; names carry the shape, so a smoke run's
names differ):
  softmax_RxC          ``e = (x - x.amax(-1, keepdim=True)).exp(); e / e.sum(-1, keepdim=True)``
                       on (4096, 4096) and (64, 65536)
  prefill_N<n>[_causal]  attention over q, k, v of (B=1, H=8, N, D=64), N in 256, 1024,
                       2048, 4096, without and with the causal mask
  decode_N<n>          one query against N_kv = 1024, 4096, 16384 keys, GQA: q (1, 8, 1, 64),
                       k and v (1, 2, N_kv, 64)

Variants, side by side in one run:
  c          softmax only: the hand-written single-pass loop (bench/baselines/softmax.c,
             -O3 -march=native -ffast-math -fopenmp), writing a preallocated output: the
             practical limit, and what softmax's ratios are to.
  braze      the whole user call, ``y = prog(...); y.realize()``, steady state (plan cached,
             kernels compiled, output from the pool); the first call (schedule + gcc into
             a fresh cache) is reported separately. For attention this is
             ``braze.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...)``
             (``enable_gqa=True`` for decode).
  user       attention written by hand: ``braze.softmax(q @ k.mT * scale + mask, -1) @ v``,
             with an explicit additive causal mask (0 / -inf, an (N, N) input built once, as
             models do) for the causal programs; for decode, GQA by grouping the query heads
             (``q.reshape(B, KV, G, D)``), no copies of k and v. Whatever braze fuses of
             user code shows here.
  unfused    ``braze`` with ``BRAZE_FUSION=0`` (braze's reference executor, op by op).
  numpy      the same formulas in numpy (matmul through numpy's BLAS).
  torch      ``torch.softmax`` / ``torch.nn.functional.scaled_dot_product_attention`` (its
             CPU flash-attention kernel) when torch is installed; attention's ratios are to it.

Threads: braze's kernels (``set_num_threads``), numpy's BLAS (which braze's matmul and its
reference executor use too: set through the library's own call), torch
(``torch.set_num_threads``) and the C baseline all get the thread count of the row.

Timing: for each program and thread count every variant is warmed up, then ``--reps``
rounds run every variant once each (interleaved, so load from other work on a shared
machine falls on all of them alike); the median per variant is reported. A variant whose
single call takes long (``unfused``, ``numpy`` at large N) runs in only
``max(3, --slow-budget / its call time)`` of the rounds (spread evenly over them), and its
cell says how many. The reference executor and numpy's element-wise softmax are
single-threaded: softmax times them at the first thread count only.

Correctness: every variant's output against numpy in float64 (max abs error).
Counters: ``braze.stats()`` over one steady-state call of each braze variant: kernel
launches (fused kernels and extern steps such as matmul), allocations, pool hits, bytes
allocated, and the peak above what braze held before the call (the inputs). The target
"nothing of size N x N at N=4096" holds when that peak is below one head's N x N float32
scores (64 MiB).

Writes ``bench/results/attention-<date>.json`` (or under ``--out``; the markdown is in it
too, under "markdown") and prints the markdown tables. ``main(argv)`` is the entry point
(for ``braze bench attention``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import gc
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .harness import (
    Variant,
    _fmt,
    _import_torch,
    _mib,
    _ptr,
    _timed,
    blas_get_num_threads,
    blas_set_num_threads,
    braze_variant_of,
    timed,
    build_baselines,
    env,
    loadavg,
    machine,
    write_results,
)

HERE = Path(__file__).resolve().parent

# Shapes per mode. Attention: batch, query heads, kv heads (decode), head dim, lengths.
CONFIG: dict[str, dict[str, Any]] = {
    "full": {"softmax": [(4096, 4096), (64, 65536)], "B": 1, "H": 8, "D": 64,
             "prefill": [256, 1024, 2048, 4096], "decode_kv_heads": 2, "decode": [1024, 4096, 16384]},
    "smoke": {"softmax": [(16, 32), (2, 256)], "B": 1, "H": 2, "D": 16,
              "prefill": [16, 64], "decode_kv_heads": 1, "decode": [64]},
}

# Targets from the issue, at 1 thread.
SOFTMAX_TARGET = ("softmax_4096x4096", 1.2)  # braze / hand-written C
ATTN_TORCH_TARGET = 1.0                      # braze / torch SDPA, for N >= 1024
ATTN_UNFUSED_TARGET = 1 / 3                  # braze / unfused, for N >= 1024
NXN_AT = 4096                                # no N x N buffer at this N


# --------------------------------------------------------------------------- programs

@dataclass
class Program:
    name: str
    kind: str  # "softmax" | "prefill" | "decode"
    dims: dict[str, int]
    causal: bool = False

    @property
    def n(self) -> int:
        return self.dims.get("N", 0)

    def desc(self) -> str:
        d = self.dims
        if self.kind == "softmax":
            return f"softmax over the last dim of ({d['rows']}, {d['cols']})"
        if self.kind == "prefill":
            return (f"attention prefill, q k v ({d['B']}, {d['H']}, {d['N']}, {d['D']})"
                    + (", causal" if self.causal else ""))
        return (f"attention decode, q ({d['B']}, {d['H']}, 1, {d['D']}), "
                f"k v ({d['B']}, {d['KV']}, {d['N']}, {d['D']}), GQA")

    def shape_str(self) -> str:
        d = self.dims
        if self.kind == "softmax":
            return f"{d['rows']}x{d['cols']}"
        if self.kind == "prefill":
            return f"{d['B']}x{d['H']}x{d['N']}x{d['D']}"
        return f"q {d['B']}x{d['H']}x1x{d['D']}, kv {d['B']}x{d['KV']}x{d['N']}x{d['D']}"


def programs_for(mode: str) -> list[Program]:
    c = CONFIG[mode]
    out = [Program(f"softmax_{r}x{k}", "softmax", {"rows": r, "cols": k}) for r, k in c["softmax"]]
    for n in c["prefill"]:
        for causal in (False, True):
            out.append(Program(f"prefill_N{n}" + ("_causal" if causal else ""), "prefill",
                               {"B": c["B"], "H": c["H"], "N": n, "D": c["D"]}, causal))
    for n in c["decode"]:
        out.append(Program(f"decode_N{n}", "decode",
                           {"B": c["B"], "H": c["H"], "KV": c["decode_kv_heads"], "N": n, "D": c["D"]}))
    return out


def make_inputs(p: Program, rng: np.random.Generator) -> dict[str, np.ndarray]:
    d = p.dims
    if p.kind == "softmax":
        return {"x": rng.standard_normal((d["rows"], d["cols"]), dtype=np.float32)}
    if p.kind == "prefill":
        shape = (d["B"], d["H"], d["N"], d["D"])
        out = {k: rng.standard_normal(shape, dtype=np.float32) for k in "qkv"}
        if p.causal:
            out["mask"] = np.triu(np.full((d["N"], d["N"]), -np.inf, dtype=np.float32), 1)
        return out
    kv = (d["B"], d["KV"], d["N"], d["D"])
    return {"q": rng.standard_normal((d["B"], d["H"], 1, d["D"]), dtype=np.float32),
            "k": rng.standard_normal(kv, dtype=np.float32), "v": rng.standard_normal(kv, dtype=np.float32)}


def softmax_prog(x: Any) -> Any:
    """The softmax every variant computes, written as a user would (braze and torch alike)."""
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def braze_fn(p: Program, user: bool) -> Callable[..., Any]:
    """The braze program: (tensors by name) -> output tensor."""
    import braze
    from braze.nn import functional as F

    if p.kind == "softmax":
        return lambda x: softmax_prog(x)
    scale = 1.0 / math.sqrt(p.dims["D"])
    if p.kind == "prefill":
        if not user:
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=p.causal)
        if p.causal:
            return lambda q, k, v, mask: braze.softmax(q @ k.mT * scale + mask, -1) @ v
        return lambda q, k, v: braze.softmax(q @ k.mT * scale, -1) @ v
    if not user:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    b, h, kvh, dd = p.dims["B"], p.dims["H"], p.dims["KV"], p.dims["D"]

    def decode_user(q: Any, k: Any, v: Any) -> Any:
        qg = q.reshape(b, kvh, h // kvh, dd)  # the query heads that share a KV head, as rows
        return (braze.softmax(qg @ k.mT * scale, -1) @ v).reshape(b, h, 1, dd)
    return decode_user


def numpy_fn(p: Program) -> Callable[..., np.ndarray]:
    if p.kind == "softmax":
        def sm(x: np.ndarray) -> np.ndarray:
            e = np.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
        return sm
    scale = np.float32(1.0 / math.sqrt(p.dims["D"]))

    def np_softmax(s: np.ndarray) -> np.ndarray:
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    if p.kind == "prefill":
        if p.causal:
            return lambda q, k, v, mask: np_softmax(q @ k.swapaxes(-1, -2) * scale + mask) @ v
        return lambda q, k, v: np_softmax(q @ k.swapaxes(-1, -2) * scale) @ v
    b, h, kvh, dd = p.dims["B"], p.dims["H"], p.dims["KV"], p.dims["D"]
    return lambda q, k, v: (np_softmax(q.reshape(b, kvh, h // kvh, dd) @ k.swapaxes(-1, -2) * scale) @ v
                            ).reshape(b, h, 1, dd)


def reference(p: Program, a: dict[str, np.ndarray]) -> np.ndarray:
    """The exact answer, in float64, one head at a time (no (H, N, N) float64 buffer)."""
    if p.kind == "softmax":
        x = a["x"].astype(np.float64)
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    d = p.dims
    scale = 1.0 / math.sqrt(d["D"])
    q, k, v = (a[n].astype(np.float64) for n in "qkv")
    out = np.empty(q.shape, dtype=np.float64)
    group = d["H"] // d.get("KV", d["H"])
    for bi in range(d["B"]):
        for hi in range(d["H"]):
            s = q[bi, hi] @ k[bi, hi // group].T * scale
            if p.causal:
                s = s + np.triu(np.full(s.shape, -np.inf), 1)
            e = np.exp(s - s.max(-1, keepdims=True))
            out[bi, hi] = (e / e.sum(-1, keepdims=True)) @ v[bi, hi // group]
    return out


# --------------------------------------------------------------------------- variants

@dataclass
class AVariant(Variant):
    slow_ok: bool = False  # may run in fewer rounds when one call takes long
    check: bool = True  # computes the program's result (the GEMM floor does not)
    rounds: dict[int, int] = field(default_factory=dict)  # thread count -> timed rounds it ran


def braze_variant(name: str, fn: Callable[..., Any], arrays: dict[str, np.ndarray], fusion: str,
                  single_threaded: bool, dtype: str = "float32") -> AVariant:
    import braze
    tensors = {k: braze.from_numpy(a) if dtype == "float32" else braze.from_numpy(a).to(getattr(braze, dtype)).realize()
               for k, a in arrays.items()}
    fused = fusion == "1"
    return braze_variant_of(AVariant, name, lambda: fn(**tensors), fusion, warm_calls=2 if fused else 0,
                            warmup=2 if fused else 1, single_threaded=single_threaded, slow_ok=not fused)


def gemm_variant(p: Program, arrays: dict[str, np.ndarray]) -> AVariant:
    """The program's two matmuls alone, through numpy's BLAS into preallocated outputs:
    ``q @ k^T`` and ``scores @ v``, nothing between them. For dense prefill they are
    compute-bound: an attention doing them at BLAS's speed takes at least this long,
    fused or not (``_gemm_floor_note``). BLAS's speed is not the core's: on the
    development machine numpy's OpenBLAS picks its Haswell (AVX2) kernels on a core
    with 512-bit FMA units, 100-127 of 260 GFLOP/s, and braze's AVX-512 tiles beat it.
    Causal attention skips half of the matmuls, and decoding is bound by memory: there
    it is a comparison."""
    d = p.dims
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    if p.kind == "decode":  # the query heads that share a KV head are the rows, as braze does it
        q = q.reshape(d["B"], d["KV"], d["H"] // d["KV"], d["D"])
    kt = k.swapaxes(-1, -2)
    scores = np.matmul(q, kt)
    out = np.matmul(scores, v)

    def call() -> None:
        np.matmul(q, kt, out=scores)
        np.matmul(scores, v, out=out)
    return AVariant("gemm", call, lambda: out, warmup=2, check=False)


def _through(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` (float16 or bfloat16), held as float32: every variant then
    sees the same values, the half ones in their type, numpy and the reference in float."""
    import braze
    return braze.from_numpy(a).to(getattr(braze, dtype)).float().numpy().copy()


def run_program(p: Program, lib: ctypes.CDLL, threads: list[int], reps: int, torch: Any, budget_s: float,
                rng: np.random.Generator, log: Callable[[str], None], dtype: str = "float32") -> dict[str, Any]:
    from braze.runtime.cpu import set_num_threads

    arrays = make_inputs(p, rng)
    attn_dtype = dtype if p.kind != "softmax" else "float32"
    if attn_dtype != "float32":
        arrays = {k: _through(a, dtype) for k, a in arrays.items()}
    nt_holder = [1]
    variants: list[AVariant] = []
    if p.kind == "softmax":
        x = arrays["x"]
        y = np.empty_like(x)
        cfn = lib["softmax_rows"]
        c_args = [_ptr(x), _ptr(y), _ptr(x.shape[0]), _ptr(x.shape[1])]

        def c_call() -> None:
            cfn(*c_args, ctypes.c_int(nt_holder[0]))

        def c_result() -> np.ndarray:
            c_call()
            return y.copy()
        variants.append(AVariant("c", c_call, c_result, warmup=2))
    attn = p.kind != "softmax"
    set_num_threads(threads[0])
    blas_set_num_threads(threads[0])
    variants.append(braze_variant("braze", braze_fn(p, user=False),
                                  {k: a for k, a in arrays.items() if k != "mask"}, "1", False, attn_dtype))
    if attn:
        variants.append(braze_variant("user", braze_fn(p, user=True), arrays, "1", False, attn_dtype))
    if p.kind == "decode":  # a step called again and again: what braze.jit is for
        import braze
        variants.append(braze_variant("user_jit", braze.jit(braze_fn(p, user=True)), arrays, "1", False, attn_dtype))
    # The reference executor is single-threaded except for its matmuls (numpy's BLAS).
    variants.append(braze_variant("unfused", braze_fn(p, user=False),
                                  {k: a for k, a in arrays.items() if k != "mask"}, "0", not attn, attn_dtype))
    if attn:
        variants.append(gemm_variant(p, arrays))
    np_fn = numpy_fn(p)
    variants.append(AVariant("numpy", lambda: np_fn(**arrays), lambda: np.asarray(np_fn(**arrays)), warmup=1,
                             single_threaded=not attn, slow_ok=True))
    if torch is not None:
        tt = {k: torch.from_numpy(a).to(getattr(torch, attn_dtype)) for k, a in arrays.items() if k != "mask"}
        F = torch.nn.functional
        if p.kind == "softmax":
            def t_call() -> Any:
                with torch.inference_mode():
                    return torch.softmax(tt["x"], -1)
        elif p.kind == "prefill":
            def t_call() -> Any:
                with torch.inference_mode():
                    return F.scaled_dot_product_attention(tt["q"], tt["k"], tt["v"], is_causal=p.causal)
        else:
            def t_call() -> Any:
                with torch.inference_mode():
                    return F.scaled_dot_product_attention(tt["q"], tt["k"], tt["v"], enable_gqa=True)
        tv = AVariant("torch", t_call, lambda: t_call().float().numpy().copy(), per_thread=lambda nt: torch.set_num_threads(nt))
        torch.set_num_threads(threads[0])
        tv.first_ms = _timed(t_call) * 1e3
        variants.append(tv)

    # correctness: every variant against numpy in float64
    ref = reference(p, arrays)
    for v in variants:
        if not v.check:
            continue
        out = v.result()
        v.err = float(np.max(np.abs(out.astype(np.float64) - ref))) if out.shape == ref.shape else float("inf")

    for j, nt in enumerate(threads):
        nt_holder[0] = nt
        set_num_threads(nt)
        blas_set_num_threads(nt)
        # Single-threaded variants are timed at the first thread count only, that median reused.
        active = [v for v in variants if j == 0 or not v.single_threaded]
        plan: dict[str, set[int]] = {}
        for v in active:
            v.per_thread(nt)
            t_one = math.inf
            for _ in range(v.warmup):
                t_one = min(t_one, timed(v))
            v.times[nt] = []
            k = reps
            if v.slow_ok and t_one * reps > budget_s:
                k = min(reps, max(3, int(budget_s / t_one)))
            plan[v.name] = {round(i * reps / k) for i in range(k)}  # spread over the rounds
            v.rounds[nt] = k
        gc.collect()
        for r in range(reps):
            for v in active:
                if r in plan[v.name]:
                    v.times[nt].append(timed(v))
        for v in variants:
            if v not in active:
                v.times[nt] = v.times[threads[0]]
                v.rounds[nt] = v.rounds[threads[0]]
        meds = {v.name: statistics.median(v.times[nt]) * 1e3 for v in variants}
        log(f"  {p.name} nt={nt}: " + ", ".join(f"{k} {m:.2f} ms" for k, m in meds.items()))
    return {
        "program": p.name, "kind": p.kind, "desc": p.desc(), "dims": p.dims, "causal": p.causal,
        "shape": p.shape_str(),
        "variants": {
            v.name: {
                "median_ms": {str(nt): statistics.median(v.times[nt]) * 1e3 for nt in threads},
                "min_ms": {str(nt): min(v.times[nt]) * 1e3 for nt in threads},
                "times_ms": {str(nt): [t * 1e3 for t in v.times[nt]] for nt in threads},
                "rounds": {str(nt): v.rounds[nt] for nt in threads},
                "first_call_ms": v.first_ms,
                "single_threaded": v.single_threaded,
                "max_abs_err": v.err,
                "stats": v.stats, "first_call_stats": v.first_stats,
            } for v in variants
        },
    }


# --------------------------------------------------------------------------- report

def _cell(vs: dict[str, Any], name: str, nt: int, threads: list[int], reps: int, base: str | None) -> str:
    v = vs.get(name)
    if v is None:
        return "-"
    m = v["median_ms"][str(nt)]
    star = "*" if v.get("single_threaded") and nt != threads[0] else ""
    k = v["rounds"][str(nt)]
    few = f" †{k}" if k < reps else ""
    b = vs.get(base) if base else None
    if b is None or name == base:
        return f"{_fmt(m)}{star}{few}"
    return f"{_fmt(m)}{star}{few} ({m / b['median_ms'][str(nt)]:.2f}x)"


def _ratio(vs: dict[str, Any], a: str, b: str, nt: int) -> str:
    if a not in vs or b not in vs:
        return "-"
    return f"{vs[a]['median_ms'][str(nt)] / vs[b]['median_ms'][str(nt)]:.2f}"


def markdown(res: dict[str, Any]) -> str:
    threads, reps = res["threads"], res["reps"]
    m = res["machine"]
    lines = [f"# braze reduction-fusion benchmark (softmax, attention), {res['date']}", "",
             f"`{res['command']}`  ",
             f"attention dtype: {res.get('dtype', 'float32')}  ",
             f"machine: {m['cpu']}, nproc {m['nproc']}, {m['cc']}, numpy {m['numpy']}, braze at {m['commit']}"
             + (f" plus uncommitted {', '.join(m['braze_uncommitted'])}" if m["braze_uncommitted"] else "")
             + (f", torch {res['torch']}" if res.get("torch") else ", torch not installed") + "  ",
             f"load average at start {res['loadavg_start']}, at end {res['loadavg_end']}; mode {res['mode']}, "
             f"{reps} timed rounds after warm-up, interleaved, medians in ms; numpy's BLAS threads "
             + ("set per row" if res["blas_threads_settable"] else "NOT settable (library default)")
             + f"; BRAZE_SHAPE_VARIANTS={res['braze_shape_variants']} (each shape is its own program).  ",
             (f"* = single-threaded (reference executor / numpy element-wise), timed at {threads[0]} thread(s) "
              f"only; †k = a slow variant timed in only k of the {reps} rounds (spread evenly; about "
              f"{res['slow_budget_s']:.0f} s of calls per program and thread count)."), ""]
    soft = [p for p in res["programs"] if p["kind"] == "softmax"]
    attn = [p for p in res["programs"] if p["kind"] != "softmax"]
    if soft:
        cols = ["c", "braze", "unfused", "numpy", "torch"]
        lines += [("Softmax, `e = (x - x.amax(-1, keepdim=True)).exp(); e / e.sum(-1, keepdim=True)`; "
                   "(x) = ratio to the hand-written C in the same run; torch is `torch.softmax`:"), "",
                  "| program | thr | " + " | ".join(cols) + " | braze / unfused |",
                  "|" + "---|" * (len(cols) + 3)]
        for p in soft:
            for nt in threads:
                lines.append(f"| {p['program']} | {nt} | "
                             + " | ".join(_cell(p["variants"], c, nt, threads, reps, "c") for c in cols)
                             + f" | {_ratio(p['variants'], 'braze', 'unfused', nt)} |")
        lines.append("")
    if attn:
        cols = ["torch", "braze", "user", "user_jit", "unfused", "numpy", "gemm"]
        base = "torch" if res.get("torch") else None
        lines += [("Attention; braze = `scaled_dot_product_attention` (under `braze.jit`), user = the same "
                   "written by hand (explicit additive mask when causal; not jitted), user_jit = that under `braze.jit` "
                   "(decode); gemm = the two matmuls "
                   "alone in numpy's BLAS, for dense prefill the floor of any implementation that does them at BLAS "
                   "speed; ")
                  + ("(x) = ratio to torch's `scaled_dot_product_attention` in the same run:" if base
                     else "torch not installed, no ratios:"), "",
                  "| program | shape | thr | " + " | ".join(cols)
                  + " | braze / unfused | user / unfused | gemm / unfused |",
                  "|" + "---|" * (len(cols) + 6)]
        for p in attn:
            for nt in threads:
                lines.append(f"| {p['program']} | {p['shape']} | {nt} | "
                             + " | ".join(_cell(p["variants"], c, nt, threads, reps, base) for c in cols)
                             + f" | {_ratio(p['variants'], 'braze', 'unfused', nt)}"
                             + f" | {_ratio(p['variants'], 'user', 'unfused', nt)}"
                             + f" | {_ratio(p['variants'], 'gemm', 'unfused', nt)} |")
        lines.append("")
    lines += [("braze's counters for one steady-state call (`braze.stats()`; kernels = fused kernels + extern "
               "steps such as matmul; bytes in MiB; peak = high-water mark above what braze held before the "
               "call, i.e. above the inputs) and the first call, ms (plan build + gcc into a fresh cache; "
               "a plan hit, fast, when an earlier variant recorded the same stream: braze's "
               "`scaled_dot_product_attention` is written from the same primitive ops as user code):"), "",
              ("| program | variant | first call | kernels | allocations | pool hits | bytes allocated "
               "| peak above inputs | one N x N (MiB) |"),
              "|" + "---|" * 9]
    for p in res["programs"]:
        nxn = p["dims"]["N"] ** 2 * 4 if p["kind"] == "prefill" else None
        for name in ("braze", "user", "user_jit", "unfused"):
            v = p["variants"].get(name)
            if v is None:
                continue
            s = v["stats"]
            lines.append(f"| {p['program']} | {name} | {_fmt(v['first_call_ms'])} | {s['kernel_launches']} "
                         f"| {s['allocations']} | {s['pool_hits']} | {_mib(s['bytes_allocated'])} "
                         f"| {_mib(s['peak_above_live_before'])} | {_mib(nxn)} |")
    names = ["c", "braze", "user", "user_jit", "unfused", "numpy", "torch"]
    lines += ["", "Max abs error against numpy in float64:", "",
              "| program | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for p in res["programs"]:
        vs = p["variants"]
        lines.append(f"| {p['program']} | " + " | ".join(
            f"{vs[n]['max_abs_err']:.1e}" if vs.get(n, {}).get("max_abs_err") is not None else "-"
            for n in names) + " |")
    if res.get("targets"):
        lines += ["", "Targets (1 thread):", ""]
        for t in res["targets"]:
            lines.append(f"- {t['what']}: {t['value']:.2f} (target {t['target']}) "
                         f"{'**met**' if t['met'] else '**missed**'}"
                         + (f" ({t['note']})" if t.get("note") else ""))
    return "\n".join(lines) + "\n"


def _gemm_floor_note(p: dict[str, Any]) -> str:
    """What a missed 3x over unfused needs, for dense (not causal) prefill: the two
    matmuls are compute-bound, and when numpy's BLAS runs them alone at more than a
    third of unfused's time, 3x needs them faster than that BLAS runs them. (Causal
    attention skips half of them, and decoding is bound by memory, not by BLAS: neither
    gets the note.)"""
    vs = p["variants"]
    if p["kind"] != "prefill" or p["causal"] or "gemm" not in vs:
        return ""
    gemm, unfused = (float(vs[n]["median_ms"]["1"]) for n in ("gemm", "unfused"))
    if gemm / unfused <= ATTN_UNFUSED_TARGET:
        return ""
    d = p["dims"]
    gflops = 4 * d["B"] * d["H"] * d["N"] ** 2 * d["D"] / (gemm * 1e-3) / 1e9
    return (f"the two matmuls alone, in numpy's BLAS at {gflops:.0f} GFLOP/s, take {gemm / unfused:.2f}x "
            "unfused: 3x needs them faster than that")


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets at 1 thread, for the programs that ran."""
    if 1 not in res["threads"]:
        return []
    out: list[dict[str, Any]] = []

    def med(p: dict[str, Any], v: str) -> float:
        return float(p["variants"][v]["median_ms"]["1"])

    for p in res["programs"]:
        vs = p["variants"]
        if p["program"] == SOFTMAX_TARGET[0]:
            r = med(p, "braze") / med(p, "c")
            out.append({"what": f"{p['program']} braze / C", "value": r, "target": SOFTMAX_TARGET[1],
                        "met": r <= SOFTMAX_TARGET[1]})
        if p["kind"] == "softmax" or p["dims"]["N"] < 1024:
            continue
        for name in [n for n in ("braze", "user", "user_jit") if n in vs]:
            if "torch" in vs:
                r = med(p, name) / med(p, "torch")
                out.append({"what": f"{p['program']} {name} / torch SDPA", "value": r, "target": ATTN_TORCH_TARGET,
                            "met": r <= ATTN_TORCH_TARGET})
            r = med(p, name) / med(p, "unfused")
            out.append({"what": f"{p['program']} {name} / unfused", "value": r, "target": round(ATTN_UNFUSED_TARGET, 2),
                        "met": r <= ATTN_UNFUSED_TARGET, "note": _gemm_floor_note(p) if r > ATTN_UNFUSED_TARGET else ""})
            if p["kind"] == "prefill" and p["dims"]["N"] == NXN_AT:
                nxn = p["dims"]["N"] ** 2 * 4
                r = vs[name]["stats"]["peak_above_live_before"] / nxn
                out.append({"what": f"{p['program']} {name} peak above inputs / one N x N float32 buffer",
                            "value": r, "target": "< 1", "met": r < 1})
    return out


# --------------------------------------------------------------------------- main

def select(programs: list[Program], wanted: set[str]) -> list[Program]:
    """Programs named exactly, or by a prefix ("softmax", "prefill", "decode", "prefill_N1024")."""
    if not wanted:
        return programs
    return [p for p in programs if any(p.name == w or p.name.startswith(w) for w in wanted)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.attention", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 1 rep (a does-it-run check)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds per variant (default 10; smoke 1)")
    ap.add_argument("--programs", default="", help="comma-separated names or prefixes (softmax, prefill, decode, "
                    "prefill_N4096, ...) of: " + ",".join(p.name for p in programs_for("full")))
    ap.add_argument("--no-torch", action="store_true", help="skip torch even when installed")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="q, k, v (and the causal mask) of the attention programs, for braze and torch; numpy, "
                         "gemm and the reference get the same values in float32 (softmax stays float32)")
    ap.add_argument("--slow-budget", type=float, default=20.0,
                    help="seconds of timed calls per program and thread count a slow variant (unfused, numpy) "
                         "gets before it runs in fewer rounds (default 20; at least 3 rounds)")
    ap.add_argument("--out", default=str(HERE / "results"), help="directory for the JSON (markdown inside)")
    ap.add_argument("--keep-cache", action="store_true",
                    help="use braze's usual kernel cache (default: a fresh one, so first calls include gcc)")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "full"
    reps = args.reps if args.reps is not None else (1 if args.smoke else 10)
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    wanted = {s.strip() for s in args.programs.split(",") if s.strip()}
    programs = select(programs_for(mode), wanted)
    if wanted and not programs:
        ap.error(f"no program matches {', '.join(sorted(wanted))}; programs: "
                 + ", ".join(p.name for p in programs_for(mode)))
    if reps < 1 or not threads or min(threads) < 1:
        ap.error("--reps and --threads must be positive")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # braze's kernels and the baselines share one libgomp, which reads the wait policy
    # once, when it is loaded: give it braze's default before anything loads it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    torch = None if args.no_torch else _import_torch()
    command = " ".join(["python -m bench.attention", *(sys.argv[1:] if argv is None else argv)])
    from braze.runtime import memory
    from braze.runtime.cpu import get_num_threads, set_num_threads

    # main() may run inside another program (the smoke test, ``braze bench``): put back
    # the settings it changes.
    saved_threads = (get_num_threads(), blas_get_num_threads(), torch.get_num_threads() if torch else None)
    with contextlib.ExitStack() as stack:
        # Every shape here is its own program (as in a model with fixed shapes): do not let
        # braze's "new shapes every call" guard send the later shapes to the reference executor.
        stack.enter_context(env("BRAZE_SHAPE_VARIANTS", "1000"))
        res: dict[str, Any] = {
            "date": _dt.datetime.now().isoformat(timespec="seconds"), "command": command, "mode": mode,
            "threads": threads, "reps": reps, "slow_budget_s": args.slow_budget, "machine": machine(),
            "loadavg_start": loadavg(), "torch": getattr(torch, "__version__", None),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "braze_shape_variants": os.environ.get("BRAZE_SHAPE_VARIANTS"),
            "blas_threads_settable": blas_set_num_threads(threads[0]), "programs": [], "dtype": args.dtype,
        }
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="braze-bench-"))
        if not args.keep_cache:
            stack.enter_context(env("BRAZE_CACHE_DIR", str(Path(tmp) / "cache")))
        try:
            lib = build_baselines(Path(tmp))
            rng = np.random.default_rng(0)
            t0 = time.perf_counter()
            for p in programs:
                log(f"{p.name}: {p.desc()} ...")
                t1 = time.perf_counter()
                res["programs"].append(run_program(p, lib, threads, reps, torch, args.slow_budget, rng, log,
                                                   args.dtype))
                res["programs"][-1]["seconds"] = time.perf_counter() - t1
                gc.collect()
                memory.pool_clear()  # the next program's first call starts from an empty pool too
            res["seconds"] = time.perf_counter() - t0
        finally:
            set_num_threads(saved_threads[0])
            if saved_threads[1] is not None:
                blas_set_num_threads(saved_threads[1])
            if torch is not None:
                torch.set_num_threads(saved_threads[2])
    res["loadavg_end"] = loadavg()
    res["targets"] = targets(res) if mode == "full" else []
    write_results(res, markdown(res), args.out, "attention", args.smoke, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
