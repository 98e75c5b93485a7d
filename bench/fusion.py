"""Fusion benchmarks: braze's fused kernels against hand-written C, numpy and PyTorch.

    .venv/bin/python -m bench.fusion                  # the full run (several minutes)
    .venv/bin/python -m bench.fusion --smoke          # tiny shapes, 1 rep: does it still work
    .venv/bin/python -m bench.fusion --threads 1 --programs softmax,layernorm

Programs (float32):
  gelu_ref     ``braze.gelu(x)`` on (32, 512, 2048), Burn's GELU benchmark
  gelu_erf     ``x * (erf(x / sqrt(2)) + 1) / 2``
  gelu_custom  the same with erf written from elementary ops (Abramowitz-Stegun 7.1.26)
  softmax      ``exp(x - max) / sum`` over the last dim of (4096, 4096)
  softmax_fn   ``braze.softmax(x, -1)``
  layernorm    LayerNorm over (8192, 1024) from primitive ops
  rmsnorm      RMSNorm over (8192, 1024) from primitive ops
  rope         rotary embedding, half-split layout, on (1, 32, 2048, 64)

Variants, side by side in one run:
  c            a hand-written single-pass loop (bench/baselines/*.c), built with
               -O3 -march=native -ffast-math -fopenmp, writing a preallocated output: the
               practical limit. Every ratio is to it, measured in the same run.
  braze        the whole user-visible call, ``y = prog(x); y.realize()``, with the plan
               cached and the kernel compiled (steady state); the first call (schedule +
               gcc, into a fresh cache directory) is reported once, separately.
  unfused      the same with ``BRAZE_FUSION=0`` (braze's reference executor).
  numpy        the same formulas in numpy (single-threaded; numpy has no erf).
  torch        PyTorch eager, and ``torch.compile`` (first call reported separately),
               when torch is installed (``pip install torch==2.13.0``).

Timing: for each program and thread count, every variant is warmed up, then
``--reps`` rounds run every variant once each (interleaved, so that load from other work
on a shared machine falls on all of them alike); the median per variant is reported.

Also measured: Python overhead (microseconds per recorded op on tiny tensors, without
flushing; a cached 10-op program on (4, 4) tensors, end to end).

Writes ``bench/results/fusion-<date>.json`` (or under ``--out``; the markdown table is in
it too, under "markdown") and prints the markdown table. ``main(argv)`` is the entry point (for ``braze bench fusion``).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .harness import (  # noqa: F401 - shared with bench.attention; names kept importable from here
    BASELINES,
    C_FLAGS,
    STAT_KEYS,
    Variant,
    _fmt,
    _import_torch,
    _mib,
    _ptr,
    _timed,
    braze_stats_of,
    braze_variant_of,
    timed,
    build_baselines,
    env,
    loadavg,
    machine,
    write_results,
)

HERE = Path(__file__).resolve().parent

SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "full": {"gelu": (32, 512, 2048), "softmax": (4096, 4096), "norm": (8192, 1024), "rope": (1, 32, 2048, 64)},
    "smoke": {"gelu": (2, 4, 64), "softmax": (8, 64), "norm": (8, 64), "rope": (1, 2, 8, 16)},
}

# Abramowitz-Stegun 7.1.26
AS_P = 0.3275911
AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
LN_EPS = 1e-5
RMS_EPS = 1e-6

# Targets from the issue, at 1 thread: braze / hand-written C.
TARGETS = {"gelu_custom": 1.15, "softmax": 1.3, "softmax_fn": 1.3, "layernorm": 1.3}


# --------------------------------------------------------------------------- programs
# Written once over a module ``m`` (braze, or torch through ``_TorchOps``), so braze and
# torch run the same formula op for op.

def erf_as(m: Any, x: Any) -> Any:
    sign = m.where(x < 0, -1.0, 1.0)
    a = x.abs()
    t = 1.0 / (1.0 + AS_P * a)
    a1, a2, a3, a4, a5 = AS_A
    poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t
    return sign * (1.0 - poly * (-a * a).exp())


def gelu_ref(m: Any, x: Any) -> Any:
    return m.gelu(x)


def gelu_erf(m: Any, x: Any) -> Any:
    return x * (m.erf(x / math.sqrt(2)) + 1) / 2


def gelu_custom(m: Any, x: Any) -> Any:
    return x * (erf_as(m, x / math.sqrt(2)) + 1) / 2


def softmax(m: Any, x: Any) -> Any:
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def softmax_fn(m: Any, x: Any) -> Any:
    return m.softmax(x, -1)


def layernorm(m: Any, x: Any, w: Any, b: Any) -> Any:
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc * (var + LN_EPS).rsqrt() * w + b


def rmsnorm(m: Any, x: Any, w: Any) -> Any:
    return x * ((x * x).mean(-1, keepdim=True) + RMS_EPS).rsqrt() * w


def rope(m: Any, x: Any, cos: Any, sin: Any) -> Any:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return m.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


# numpy versions (numpy has no erf: gelu_ref and gelu_erf have none)
def _np_erf_as(x: np.ndarray) -> np.ndarray:
    sign = np.where(x < 0, np.float32(-1), np.float32(1))
    a = np.abs(x)
    t = 1.0 / (1.0 + AS_P * a)
    a1, a2, a3, a4, a5 = AS_A
    poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t
    return sign * (1.0 - poly * np.exp(-a * a))


NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "gelu_custom": lambda x: x * (_np_erf_as(x / np.float32(math.sqrt(2))) + 1) / 2,
    "softmax": lambda x: (lambda e: e / e.sum(-1, keepdims=True))(np.exp(x - x.max(-1, keepdims=True))),
    "layernorm": lambda x, w, b: (lambda xc: xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + np.float32(LN_EPS))
                                  * w + b)(x - x.mean(-1, keepdims=True)),
    "rmsnorm": lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(RMS_EPS)) * w,
    "rope": lambda x, c, s: np.concatenate(
        [x[..., :x.shape[-1] // 2] * c - x[..., x.shape[-1] // 2:] * s,
         x[..., x.shape[-1] // 2:] * c + x[..., :x.shape[-1] // 2] * s], -1),
}
NUMPY["softmax_fn"] = NUMPY["softmax"]


@dataclass
class Program:
    name: str
    fn: Callable[..., Any]
    shape_key: str
    inputs: Callable[[np.random.Generator, tuple[int, ...]], list[np.ndarray]]
    c_fn: str  # symbol in the baseline library
    c_args: Callable[[list[np.ndarray], np.ndarray], list[Any]]  # arrays -> extra args before nt
    desc: str


def _x(rng: np.random.Generator, shape: tuple[int, ...]) -> list[np.ndarray]:
    return [rng.standard_normal(shape, dtype=np.float32)]


def _norm_inputs(bias: bool) -> Callable[[np.random.Generator, tuple[int, ...]], list[np.ndarray]]:
    def make(rng: np.random.Generator, shape: tuple[int, ...]) -> list[np.ndarray]:
        out = [rng.standard_normal(shape, dtype=np.float32),
               (1 + 0.1 * rng.standard_normal(shape[-1:], dtype=np.float32)).astype(np.float32)]
        if bias:
            out.append(0.1 * rng.standard_normal(shape[-1:], dtype=np.float32))
        return out
    return make


def _rope_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> list[np.ndarray]:
    seq, dim = shape[-2], shape[-1]
    half = dim // 2
    inv = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
    ang = np.arange(seq, dtype=np.float64)[:, None] * inv[None, :]
    return [rng.standard_normal(shape, dtype=np.float32),
            np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]


def _rows(a: list[np.ndarray]) -> tuple[int, int]:
    x = a[0]
    return int(np.prod(x.shape[:-1])), int(x.shape[-1])


PROGRAMS: list[Program] = [
    Program("gelu_ref", gelu_ref, "gelu", _x, "gelu_erf_libm", lambda a, y: [a[0].size],
            "braze.gelu(x)  [C: libm erff]"),
    Program("gelu_erf", gelu_erf, "gelu", _x, "gelu_erf_libm", lambda a, y: [a[0].size],
            "x * (erf(x / sqrt(2)) + 1) / 2  [C: libm erff]"),
    Program("gelu_custom", gelu_custom, "gelu", _x, "gelu_erf_custom", lambda a, y: [a[0].size],
            "same, erf from elementary ops (A-S 7.1.26)"),
    Program("softmax", softmax, "softmax", _x, "softmax_rows", lambda a, y: list(_rows(a)),
            "exp(x - max) / sum, last dim"),
    Program("softmax_fn", softmax_fn, "softmax", _x, "softmax_rows", lambda a, y: list(_rows(a)),
            "braze.softmax(x, -1)"),
    Program("layernorm", layernorm, "norm", _norm_inputs(True), "layernorm_rows",
            lambda a, y: [a[1], a[2], y, *_rows(a), ctypes.c_float(LN_EPS)], "LayerNorm from primitives"),
    Program("rmsnorm", rmsnorm, "norm", _norm_inputs(False), "rmsnorm_rows",
            lambda a, y: [a[1], y, *_rows(a), ctypes.c_float(RMS_EPS)], "RMSNorm from primitives"),
    Program("rope", rope, "rope", _rope_inputs, "rope_half",
            lambda a, y: [a[1], a[2], y, int(np.prod(a[0].shape[:-2])), a[0].shape[-2], a[0].shape[-1]],
            "rotary embedding, half-split, cat"),
]

# Which C function's argument list puts y right after x (the element-wise and softmax
# kernels), and which take it among their extra args.
_Y_AFTER_X = {"gelu_erf_libm", "gelu_erf_custom", "softmax_rows"}


# --------------------------------------------------------------------------- helpers

class _TorchOps:
    """The few function forms the programs take from ``m``, for torch."""

    def __init__(self, torch: Any) -> None:
        self.t = torch

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return self.t.where(c, a, b)

    def cat(self, xs: Any, dim: int) -> Any:
        return self.t.cat(xs, dim)

    def erf(self, x: Any) -> Any:
        return self.t.erf(x)

    def gelu(self, x: Any) -> Any:
        return self.t.nn.functional.gelu(x)

    def softmax(self, x: Any, dim: int) -> Any:
        return self.t.softmax(x, dim)


# --------------------------------------------------------------------------- variants

def braze_variant(name: str, prog: Program, arrays: list[np.ndarray], fusion: str) -> Variant:
    import braze
    tensors = [braze.from_numpy(a) for a in arrays]
    return braze_variant_of(Variant, name, lambda: prog.fn(braze, *tensors), fusion, warm_calls=2,
                            warmup=3 if fusion == "1" else 1, single_threaded=fusion == "0")


def run_program(prog: Program, shape: tuple[int, ...], lib: ctypes.CDLL, threads: list[int], reps: int,
                torch: Any, torch_compile: bool, rng: np.random.Generator, log: Callable[[str], None]) -> dict[str, Any]:
    from braze.runtime.cpu import set_num_threads

    arrays = prog.inputs(rng, shape)
    y = np.empty_like(arrays[0])
    cfn = lib[prog.c_fn]
    nt_holder = [1]
    extra = prog.c_args(arrays, y)
    if prog.c_fn in _Y_AFTER_X:
        c_args = [_ptr(arrays[0]), _ptr(y), *[_ptr(a) for a in extra]]
    else:
        c_args = [_ptr(arrays[0]), *[_ptr(a) for a in extra]]

    def c_call() -> None:
        cfn(*c_args, ctypes.c_int(nt_holder[0]))

    def c_result() -> np.ndarray:
        c_call()
        return y.copy()

    variants: list[Variant] = [Variant("c", c_call, c_result, warmup=2)]
    variants.append(braze_variant("braze", prog, arrays, "1"))
    variants.append(braze_variant("unfused", prog, arrays, "0"))
    np_fn = NUMPY.get(prog.name)
    if np_fn is not None:
        variants.append(Variant("numpy", lambda: np_fn(*arrays), lambda: np.asarray(np_fn(*arrays)), warmup=1,
                                single_threaded=True))
    if torch is not None:
        ops = _TorchOps(torch)
        tt = [torch.from_numpy(a) for a in arrays]

        def t_eager() -> Any:
            with torch.inference_mode():
                return prog.fn(ops, *tt)

        variants.append(Variant("torch", t_eager, lambda: t_eager().numpy().copy(),
                                per_thread=lambda nt: torch.set_num_threads(nt)))
        if torch_compile:
            # One compiled function per program (its own code object): dynamo caches per
            # code object, and sharing one lambda would hit its recompile limit and
            # silently fall back to eager.
            compiled = torch.compile(prog.fn)

            def t_comp() -> Any:
                with torch.inference_mode():
                    return compiled(ops, *tt)

            v = Variant("torch.compile", t_comp, lambda: t_comp().numpy().copy(),
                        per_thread=lambda nt: torch.set_num_threads(nt))
            try:
                v.first_ms = _timed(t_comp) * 1e3
                variants.append(v)
            except Exception as e:  # noqa: BLE001 - inductor may be unusable here: report, go on
                log(f"  torch.compile failed for {prog.name}: {type(e).__name__}: {e}")

    # correctness: every variant against the hand-written C
    set_num_threads(1)
    nt_holder[0] = 1
    ref = variants[0].result()
    for v in variants[1:]:
        out = v.result()
        v.err = float(np.max(np.abs(out.astype(np.float64) - ref))) if out.shape == ref.shape else float("inf")
    for j, nt in enumerate(threads):
        nt_holder[0] = nt
        set_num_threads(nt)
        # The reference executor and numpy use one thread whatever the setting: they
        # are timed once, at the first thread count, and that median is reused.
        active = [v for v in variants if j == 0 or not v.single_threaded]
        for v in active:
            v.per_thread(nt)
            for _ in range(v.warmup):
                timed(v)
            v.times[nt] = []
        gc.collect()
        for _ in range(reps):
            for v in active:
                v.times[nt].append(timed(v))
        for v in variants:
            if v not in active:
                v.times[nt] = v.times[threads[0]]
        meds = {v.name: statistics.median(v.times[nt]) * 1e3 for v in variants}
        log(f"  {prog.name} nt={nt}: " + ", ".join(f"{k} {m:.2f} ms" for k, m in meds.items()))
    return {
        "program": prog.name, "desc": prog.desc, "shape": list(shape), "c_function": prog.c_fn,
        "variants": {
            v.name: {
                "median_ms": {str(nt): statistics.median(v.times[nt]) * 1e3 for nt in threads},
                "min_ms": {str(nt): min(v.times[nt]) * 1e3 for nt in threads},
                "times_ms": {str(nt): [t * 1e3 for t in v.times[nt]] for nt in threads},
                "first_call_ms": v.first_ms,
                "single_threaded": v.single_threaded,
                "max_abs_err_vs_c": v.err,
                "stats": v.stats, "first_call_stats": v.first_stats,
            } for v in variants
        },
    }


# --------------------------------------------------------------------------- overhead

def overhead(reps: int, n_ops: int, torch: Any) -> dict[str, Any]:
    """Python cost per recorded op, and a cached 10-op program end to end, on (4, 4)."""
    import braze
    from braze.runtime.cpu import set_num_threads

    set_num_threads(1)
    a, b = braze.randn(4, 4), braze.randn(4, 4)
    out: dict[str, Any] = {"n_ops": n_ops}

    def record(kind: str) -> float:
        braze.synchronize()
        keep = []
        t0 = time.perf_counter()
        if kind == "tensor":
            for _ in range(n_ops):
                keep.append(a + b)
        else:
            for _ in range(n_ops):
                keep.append(a * 2.0)
        t = time.perf_counter() - t0
        with env("BRAZE_FUSION", "0"):  # run the recorded nodes cheaply, untimed
            braze.synchronize()
        return t / n_ops * 1e6

    for kind in ("tensor", "scalar"):
        record(kind)
        out[f"record_us_per_op_{kind}"] = statistics.median(record(kind) for _ in range(reps))

    x, w, c = braze.randn(4, 4), braze.randn(4), braze.randn(4, 4)

    def prog10(m: Any, x: Any, w: Any, c: Any) -> Any:
        y = x * w + c            # 2
        y = m.exp(y) - x         # 4
        y = y * y + 1.0          # 6
        y = m.sqrt(y) / (m.abs(c) + 1.0)  # 10
        return y

    def per_call(fn: Callable[[], Any], calls: int) -> float:
        for _ in range(20):
            fn()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) / calls * 1e6)
        return statistics.median(samples)

    def bz(fusion: str) -> Callable[[], None]:
        def call() -> None:
            with env("BRAZE_FUSION", fusion):
                prog10(braze, x, w, c).realize()
        return call

    braze.reset_stats()
    out["program10_us"] = {"braze": per_call(bz("1"), 200)}
    s = braze.stats()
    out["program10_stats"] = {k: s[k] for k in ("kernel_launches", "plan_hits", "plan_misses", "kernels_compiled")}
    out["program10_us"]["unfused"] = per_call(bz("0"), 200)
    xn, wn, cn = x.numpy(), w.numpy(), c.numpy()
    out["program10_us"]["numpy"] = per_call(lambda: prog10(np, xn, wn, cn), 200)
    if torch is not None:
        torch.set_num_threads(1)
        xt, wt, ct = (torch.from_numpy(v) for v in (xn, wn, cn))

        def te() -> None:
            with torch.inference_mode():
                prog10(torch, xt, wt, ct)
        out["program10_us"]["torch"] = per_call(te, 200)
    return out


# --------------------------------------------------------------------------- report

def markdown(res: dict[str, Any]) -> str:
    threads = res["threads"]
    cols = ["c", "braze", "unfused", "numpy", "torch", "torch.compile"]
    lines = [f"# braze fusion benchmark, {res['date']}", "",
             f"`{res['command']}`  ",
             f"machine: {res['machine']['cpu']}, nproc {res['machine']['nproc']}, "
             f"{res['machine']['cc']}, numpy {res['machine']['numpy']}, braze at {res['machine']['commit']}"
             + (f" plus uncommitted {', '.join(res['machine']['braze_uncommitted'])}"
                if res['machine']['braze_uncommitted'] else "")
             + (f", torch {res['torch']}" if res.get("torch") else ", torch not installed") + "  ",
             f"load average at start {res['loadavg_start']}, at end {res['loadavg_end']}; "
             f"mode {res['mode']}, {res['reps']} timed rounds after warm-up, medians in ms; "
             f"(x) = ratio to the hand-written C in the same run; * = single-threaded (braze's reference "
             f"executor, numpy), timed at {threads[0]} thread(s) only", ""]
    lines.append("| program | shape | thr | " + " | ".join(cols) + " | braze / torch.compile |")
    lines.append("|" + "---|" * (len(cols) + 4))
    for p in res["programs"]:
        vs = p["variants"]
        for nt in threads:
            c = vs["c"]["median_ms"][str(nt)]
            cells = []
            for name in cols:
                v = vs.get(name)
                if v is None:
                    cells.append("-")
                    continue
                m = v["median_ms"][str(nt)]
                star = "*" if v.get("single_threaded") and nt != threads[0] else ""
                cells.append(_fmt(m) if name == "c" else f"{_fmt(m)}{star} ({m / c:.2f}x)")
            tc = vs.get("torch.compile")
            vsc = f"{vs['braze']['median_ms'][str(nt)] / tc['median_ms'][str(nt)]:.2f}" if tc else "-"
            lines.append(f"| {p['program']} | {'x'.join(map(str, p['shape']))} | {nt} | " + " | ".join(cells)
                         + f" | {vsc} |")
    lines += ["", "First call (plan build + gcc into a fresh cache; torch.compile: its compile), ms, and "
              "braze's counters for one steady-state call (`braze.stats()`; bytes in MiB):", "",
              "| program | braze first call | torch.compile first call | kernels | allocations | pool hits "
              "| bytes allocated | peak above inputs | unfused: kernels | allocations | bytes allocated "
              "| peak above inputs | max abs err braze / unfused vs C |",
              "|" + "---|" * 13]
    for p in res["programs"]:
        vs = p["variants"]
        b, u = vs["braze"], vs["unfused"]
        bs, us = b["stats"], u["stats"]
        tc = vs.get("torch.compile")
        lines.append(
            f"| {p['program']} | {_fmt(b['first_call_ms'])} | {_fmt(tc['first_call_ms']) if tc else '-'} "
            f"| {bs['kernel_launches']} | {bs['allocations']} | {bs['pool_hits']} | {_mib(bs['bytes_allocated'])} "
            f"| {_mib(bs['peak_above_live_before'])} | {us['kernel_launches']} | {us['allocations']} "
            f"| {_mib(us['bytes_allocated'])} | {_mib(us['peak_above_live_before'])} "
            f"| {b['max_abs_err_vs_c']:.1e} / {u['max_abs_err_vs_c']:.1e} |")
    if res.get("targets"):
        lines += ["", "Targets (1 thread):", ""]
        for t in res["targets"]:
            lines.append(f"- {t['what']}: {t['value']:.2f} (target {t['target']}) "
                         f"{'**met**' if t['met'] else '**missed**'}")
    o = res.get("overhead")
    if o:
        lines += ["", f"Python overhead, (4, 4) float32, 1 thread: recording {o['n_ops']} ops without flushing, "
                  f"{o['record_us_per_op_tensor']:.2f} us per `a + b`, {o['record_us_per_op_scalar']:.2f} us per "
                  "`a * 2.0`; a cached 10-op program end to end (record + flush + launch): "
                  + ", ".join(f"{k} {v:.1f} us" for k, v in o["program10_us"].items())
                  + f" (braze counters over its runs: {o['program10_stats']})."]
    return "\n".join(lines) + "\n"


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    if 1 not in res["threads"]:
        return []
    out = []
    for p in res["programs"]:
        vs = p["variants"]
        c = vs["c"]["median_ms"]["1"]
        b = vs["braze"]["median_ms"]["1"]
        if p["program"] in TARGETS:
            out.append({"what": f"{p['program']} braze / C", "value": b / c, "target": TARGETS[p["program"]],
                        "met": b / c <= TARGETS[p["program"]]})
        tc = vs.get("torch.compile")
        if tc:
            r = b / tc["median_ms"]["1"]
            out.append({"what": f"{p['program']} braze / torch.compile", "value": r, "target": 1.0, "met": r <= 1.0})
    return out


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fusion", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 1 rep (a does-it-run check)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds per variant (default 10; smoke 1)")
    ap.add_argument("--programs", default="", help="comma-separated subset of: "
                    + ",".join(p.name for p in PROGRAMS))
    ap.add_argument("--no-torch", action="store_true", help="skip torch even when installed")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-overhead", action="store_true", help="skip the Python-overhead measurements")
    ap.add_argument("--out", default=str(HERE / "results"), help="directory for the JSON and markdown")
    ap.add_argument("--keep-cache", action="store_true",
                    help="use braze's usual kernel cache (default: a fresh one, so first calls include gcc)")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "full"
    reps = args.reps if args.reps is not None else (1 if args.smoke else 10)
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    wanted = {s.strip() for s in args.programs.split(",") if s.strip()}
    unknown = wanted - {p.name for p in PROGRAMS}
    if unknown:
        ap.error(f"unknown programs: {', '.join(sorted(unknown))}")
    programs = [p for p in PROGRAMS if not wanted or p.name in wanted]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # braze's kernels and the baselines share one libgomp, which reads the wait policy
    # once, when it is loaded: give it braze's default before anything loads it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    torch = None if args.no_torch else _import_torch()
    start = loadavg()
    command = " ".join(["python -m bench.fusion", *(sys.argv[1:] if argv is None else argv)])
    res: dict[str, Any] = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "command": command, "mode": mode,
        "threads": threads, "reps": reps, "machine": machine(), "loadavg_start": start,
        "torch": getattr(torch, "__version__", None), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "programs": [],
    }
    with tempfile.TemporaryDirectory(prefix="braze-bench-") as tmp:
        cache = contextlib.nullcontext() if args.keep_cache else env("BRAZE_CACHE_DIR", str(Path(tmp) / "cache"))
        with cache:
            lib = build_baselines(Path(tmp))
            rng = np.random.default_rng(0)
            t0 = time.perf_counter()
            for prog in programs:
                shape = SHAPES[mode][prog.shape_key]
                log(f"{prog.name} {shape} ...")
                res["programs"].append(run_program(prog, shape, lib, threads, reps, torch,
                                                   not args.no_compile, rng, log))
                gc.collect()
            if not args.no_overhead:
                res["overhead"] = overhead(reps=max(reps, 3) if args.smoke else reps,
                                           n_ops=50 if args.smoke else 500, torch=torch)
            res["seconds"] = time.perf_counter() - t0
    res["loadavg_end"] = loadavg()
    res["targets"] = targets(res) if mode == "full" else []
    write_results(res, markdown(res), args.out, "fusion", args.smoke, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
