"""The GPU benchmark's element-wise section (``bench/gpu.py --only elementwise``): the
fusion benchmark's programs (custom-erf GELU, softmax, LayerNorm) and ``scale`` on braze's
cuda device, torch eager and ``torch.compile``, at its shapes and GPU-sized ones, in
float32 and bfloat16; the section's markdown tables and the issue's targets. How it
times and what its columns mean: ``bench/gpu.py``'s docstring.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import fusion
from bench.gpu_device import Device, Log, back_to_back, braze_wall, kernel_ms, timing, wall
from bench.harness import _fmt

PROGRAMS = ("scale", "gelu_custom", "softmax", "layernorm")
#: fusion.SHAPES' key per program, and the GPU-sized shape added to the fusion benchmark's
#: (its layernorm is 32 MiB, inside an H100's L2; these are 256 MiB per float32 operand)
GPU_SHAPES: dict[str, tuple[int, ...]] = {"gelu": (64, 512, 2048), "softmax": (16384, 4096), "norm": (65536, 1024)}
DTYPES = ("float32", "bfloat16")
TARGET_FRACTION = 0.85  # of the HBM bound (issue 16)
TARGET_VS_COMPILE = 1.0
B2B_CALLS = 20
SLOW_CALL_S = 0.5  # a braze call slower than this is timed 3 times, not --reps


class TypedOps:
    """The function forms the fusion programs take from ``m`` (braze's module, or
    fusion's torch adapter), with a ``where`` of two Python scalars cast to the case's
    dtype: braze does not promote, and torch would promote the bfloat16 program to float32."""

    def __init__(self, base: Any, dtype: Any) -> None:
        self.base = base
        self.dtype = dtype

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return self.base.where(c, a, b).to(self.dtype)

    def cat(self, xs: Any, dim: int) -> Any:
        return self.base.cat(xs, dim)

    def erf(self, x: Any) -> Any:
        return self.base.erf(x)

    def gelu(self, x: Any) -> Any:
        return self.base.gelu(x)

    def softmax(self, x: Any, dim: int) -> Any:
        return self.base.softmax(x, dim)


def scale(m: Any, x: Any) -> Any:
    return x * 2.0


#: not a fusion program: the simplest streaming kernel (one read, one write per element), at the
#: GPU-sized shape only. It says what braze's element-wise launch structure reaches by itself,
#: so a shortfall of GELU's can be told apart from one of its body.
SCALE = fusion.Program("scale", scale, "gelu", fusion._x, "", lambda a, y: [], "x * 2.0")


def program(name: str) -> fusion.Program:
    for p in (SCALE, *fusion.PROGRAMS):
        if p.name == name:
            return p
    raise SystemExit(f"bench/gpu.py: no program {name!r} (scale, or one of bench/fusion.py's)")


def bound(fn: Callable[..., Any], ops: Any) -> Callable[..., Any]:
    """``fn`` with its module bound: a fresh function object per case, so that each
    ``torch.compile`` of it starts from its own code cache entry."""
    def call(*xs: Any) -> Any:
        return fn(ops, *xs)
    return call


def _host(y: Any) -> np.ndarray:
    """A torch result as float64 numpy (bfloat16 widened exactly)."""
    return np.asarray(y.detach().float().cpu().numpy(), dtype=np.float64)


def _bhost(y: Any) -> np.ndarray:
    return np.asarray(y.numpy()).astype(np.float64)


def _maxerr(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    d = np.abs(a - b)
    return float(np.nanmax(d)) if d.size else 0.0


def run_case(dev: Device, prog: fusion.Program, shape: tuple[int, ...], dtype: str, reps: int,
             compile_: bool, rng: np.random.Generator, log: Log) -> dict[str, Any]:
    torch = dev.torch
    tdt = getattr(torch, dtype)
    arrays = prog.inputs(rng, shape)
    tt = [torch.from_numpy(a).to(dev.name).to(tdt) for a in arrays]
    if dtype != "float32":  # the values both sides read: the torch-rounded ones
        arrays = [t.float().cpu().numpy() for t in tt]
    itemsize = tt[0].element_size()
    res: dict[str, Any] = {"program": prog.name, "shape": list(shape), "dtype": dtype,
                           "bytes_min": sum(int(t.numel()) for t in tt) * itemsize + int(tt[0].numel()) * itemsize,
                           "variants": {}}
    ops = TypedOps(fusion._TorchOps(torch), tdt)
    eager = bound(prog.fn, ops)

    def t_eager() -> Any:
        with torch.inference_mode():
            return eager(*tt)

    ref = _host(t_eager())
    ref32: np.ndarray | None = None
    if dtype != "float32":
        ref32 = _host(bound(prog.fn, TypedOps(fusion._TorchOps(torch), torch.float32))(*[t.float() for t in tt]))
        res["eager_err_vs_fp32"] = _maxerr(ref, ref32)
    dev.sync()
    V = res["variants"]

    if dev.braze is not None:
        try:
            V["braze"] = braze_variant(dev, prog, arrays, dtype, reps, ref, ref32)
        except Exception as e:  # noqa: BLE001 - one failing case must not cost the others
            V["braze"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  braze failed: {type(e).__name__}: {e}\n" + traceback.format_exc())

    times = wall(t_eager, dev.sync, reps)
    V["eager"] = {**timing(times), "back_to_back_ms": back_to_back(t_eager, dev.sync, B2B_CALLS) * 1e3,
                  "kernel_ms": kernel_ms(t_eager, dev)}

    if compile_:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(bound(prog.fn, ops), dynamic=False)

            def t_comp() -> Any:
                with torch.inference_mode():
                    return compiled(*tt)

            t0 = time.perf_counter()
            y = t_comp()
            dev.sync()
            first = time.perf_counter() - t0
            err = _maxerr(_host(y), ref)
            del y
            times = wall(t_comp, dev.sync, reps)
            V["torch.compile"] = {**timing(times), "first_call_ms": first * 1e3, "err_vs_eager": err,
                                  "back_to_back_ms": back_to_back(t_comp, dev.sync, B2B_CALLS) * 1e3,
                                  "kernel_ms": kernel_ms(t_comp, dev)}
        except Exception as e:  # noqa: BLE001 - inductor unusable for this case: report, go on
            V["torch.compile"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  torch.compile failed: {type(e).__name__}: {e}")
    del tt
    gc.collect()
    return res


def braze_variant(dev: Device, prog: fusion.Program, arrays: list[np.ndarray], dtype: str, reps: int,
                  ref: np.ndarray, ref32: np.ndarray | None) -> dict[str, Any]:
    braze = dev.braze
    bdt = getattr(braze, dtype)
    bt = [braze.tensor(a, device="cuda").to(bdt) for a in arrays]
    for t in bt:
        t.realize()
    dev.bsync()
    fn = bound(prog.fn, TypedOps(braze, bdt))

    def call() -> None:
        fn(*bt).realize()

    braze.reset_stats()
    t0 = time.perf_counter()
    y = fn(*bt)
    y.realize()
    dev.bsync()
    dev.sync()
    first = time.perf_counter() - t0
    first_stats = braze.stats()
    out = _bhost(y)
    v: dict[str, Any] = {"first_call_ms": first * 1e3, "err_vs_eager": _maxerr(out, ref), "dtype_out": y.dtype.name,
                         "first_kernels_compiled": first_stats["kernels_compiled"]}
    if ref32 is not None:
        v["err_vs_fp32"] = _maxerr(out, ref32)
    call()
    dev.bsync()
    braze.reset_stats()
    call()
    dev.bsync()
    s = braze.stats()
    del y
    v["kernel_launches"] = s["kernel_launches"]
    v["plan_hits"] = s["plan_hits"]
    t0 = time.perf_counter()
    call()
    dev.bsync()
    if time.perf_counter() - t0 > SLOW_CALL_S:  # something pathological: keep the device time for the rest
        reps = min(reps, 3)
        v["reps_cut"] = reps
    times, tails = braze_wall(call, dev, reps, warmup=1)
    tail = statistics.median(tails)
    if tail > max(20e-6, 0.1 * statistics.median(times)):
        # braze's synchronize returned before its kernels finished: count to the device wait
        v["sync_waits"] = False
        times = [t + u for t, u in zip(times, tails)]
    v.update(timing(times))
    v["sync_tail_ms"] = tail * 1e3

    def sync() -> None:
        dev.bsync()
        dev.sync()
    v["back_to_back_ms"] = back_to_back(call, sync, B2B_CALLS if "reps_cut" not in v else 2) * 1e3
    v["kernel_ms"] = kernel_ms(call, dev)
    # braze.jit: the same program traced once and replayed (no Python of it per call),
    # the counterpart of torch.compile's one call per program
    jfn = braze.jit(fn)

    def jcall() -> None:
        jfn(*bt).realize()
    jt, _ = braze_wall(jcall, dev, reps if "reps_cut" not in v else 2, warmup=2)
    v["jit"] = {**timing(jt), "back_to_back_ms": back_to_back(jcall, sync, B2B_CALLS if "reps_cut" not in v else 2) * 1e3}
    del bt
    return v


def cases_for(mode: str, programs: list[str], dtypes: list[str]) -> list[tuple[fusion.Program, tuple[int, ...], str]]:
    """(program, shape, dtype) in the order they run. The full run adds, in float32, the
    fusion benchmark's tiny smoke shapes (what a call costs beside its kernel: launch and
    Python overhead) and its own shapes to the GPU-sized ones; --quick has the GPU-sized only."""
    out = []
    for name in programs:
        prog = program(name)
        key = prog.shape_key
        for dtype in dtypes:
            if mode == "smoke":
                shapes = [fusion.SHAPES["smoke"][key]]
            elif mode == "quick":
                shapes = [GPU_SHAPES[key]]
            elif prog is SCALE:
                shapes = [GPU_SHAPES[key]]
            else:
                shapes = ([fusion.SHAPES["smoke"][key]] if dtype == "float32" else []) + [
                    fusion.SHAPES["full"][key], GPU_SHAPES[key]]
            out += [(prog, shape, dtype) for shape in shapes]
    return out


def elementwise(dev: Device, args: argparse.Namespace, mode: str, copy_gbs: float, sink: Callable[[], None],
                over: Callable[[], bool], out: dict[str, Any], log: Log) -> None:
    rng = np.random.default_rng(0)
    out["cases"] = []
    out["timing"] = ("wall time around call + synchronize, median of reps after warm-up; braze: y = prog(...); "
                     "y.realize(); braze.cuda.synchronize()")
    for prog, shape, dtype in cases_for(mode, args.programs.split(","), args.dtypes.split(",")):
        what = f"{prog.name} {'x'.join(map(str, shape))} {dtype}"
        if over():
            out.setdefault("not_run", []).append(what)
            log(f"elementwise: {what}: not run (past --budget)")
            continue
        log(f"elementwise: {what}")
        try:
            c = run_case(dev, prog, shape, dtype, args.reps, not args.no_compile, rng, log)
        except Exception as e:  # noqa: BLE001 - e.g. torch eager itself failed: the next case still runs
            log(traceback.format_exc())
            c = {"program": prog.name, "shape": list(shape), "dtype": dtype, "bytes_min": 0,
                 "variants": {}, "error": f"{type(e).__name__}: {e}"}
        add_rates(c, copy_gbs)
        log("  " + summary(c))
        out["cases"].append(c)
        sink()


def add_rates(c: dict[str, Any], copy_gbs: float) -> None:
    for v in c["variants"].values():
        if "median_ms" in v:
            v["gbs"] = c["bytes_min"] / (v["median_ms"] * 1e-3) / 1e9
            v["fraction_of_copy"] = v["gbs"] / copy_gbs if copy_gbs else None
        if v.get("kernel_ms"):
            v["kernel_fraction_of_copy"] = c["bytes_min"] / (v["kernel_ms"] * 1e-3) / 1e9 / copy_gbs if copy_gbs else None
    b = c["variants"].get("braze", {})
    if "median_ms" in b:
        for k in ("eager", "torch.compile"):
            v = c["variants"].get(k, {})
            if "median_ms" in v:  # speed ratio: > 1 means braze is faster
                b[f"speedup_vs_{k}"] = v["median_ms"] / b["median_ms"]
                if "jit" in b:
                    b[f"jit_speedup_vs_{k}"] = v["median_ms"] / b["jit"]["median_ms"]
            if v.get("kernel_ms") and b.get("kernel_ms"):
                b[f"kernel_speedup_vs_{k}"] = v["kernel_ms"] / b["kernel_ms"]


def summary(c: dict[str, Any]) -> str:
    parts = []
    for k, v in c["variants"].items():
        if "error" in v:
            parts.append(f"{k} ERROR")
        elif "median_ms" in v:
            frac = v.get("fraction_of_copy")
            parts.append(f"{k} {_fmt(v['median_ms'])} ms ({_gbs(v)} GB/s"
                         + (f", {frac:.0%} of copy" if frac is not None else "") + ")")
    b = c["variants"].get("braze", {})
    if "kernel_launches" in b:
        parts.append(f"braze launches/call {b['kernel_launches']}, err vs eager {b['err_vs_eager']:.2e}")
    if b.get("sync_waits") is False:
        parts.append("WARNING: braze.cuda.synchronize() returned before the device was done")
    return "; ".join(parts)


# -- the section's tables

def _ms(v: dict[str, Any]) -> str:
    return "-" if not v else "error" if "error" in v else _fmt(v.get("median_ms"))


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _e(e: float | None) -> str:
    return "-" if e is None else f"{e:.1e}"


def _shape(c: dict[str, Any]) -> str:
    return "x".join(map(str, c["shape"]))


def elementwise_md(ew: dict[str, Any], reps: int) -> list[str]:
    cases = ew.get("cases") or []
    if not cases:
        return []
    lines = ["", "Element-wise and row kernels. Kernel ms: GPU time of the kernels per call (torch's profiler, "
             "CUPTI: no host time), % copy = bytes moved at least (inputs read once, output written once) / kernel "
             f"time / copy bandwidth. Call ms: median wall time around call + synchronize ({reps} calls after "
             "warm-up), host time included; braze eager records the program's ops in Python on every call, "
             "braze.jit replays them (torch.compile's counterpart); b2b = per call over 20 calls with one "
             "synchronize. vs = torch's time / braze's (> 1: braze faster). launches = braze's kernels per call; "
             "err = max abs vs torch eager in the dtype.", "",
             "| program | shape | dtype | MiB | braze kernel ms | % copy | compile kernel ms | % copy "
             "| kernel vs compile | braze call ms | jit call ms | jit b2b ms | eager call ms | compile call ms "
             "| jit vs compile | launches | err braze | err compile |",
             "|" + "---|" * 18]
    for c in cases:
        V = c["variants"]
        b, e, tc = V.get("braze", {}), V.get("eager", {}), V.get("torch.compile", {})
        j = b.get("jit", {})
        lines.append(
            f"| {c['program']} | {_shape(c)} | {c['dtype']} | {c['bytes_min'] / 2**20:.0f} "
            f"| {_fmt(b.get('kernel_ms'))} | {_kpct(b)} | {_fmt(tc.get('kernel_ms'))} | {_kpct(tc)} "
            f"| {_ratio(b.get('kernel_speedup_vs_torch.compile'))} | {_ms(b)} | {_ms(j)} "
            f"| {_fmt(j.get('back_to_back_ms'))} | {_ms(e)} | {_ms(tc)} | {_ratio(b.get('jit_speedup_vs_torch.compile'))} "
            f"| {b.get('kernel_launches', '-')} | {_e(b.get('err_vs_eager'))} | {_e(tc.get('err_vs_eager'))} |")
    lines += ["", "First calls, ms (braze: plan + Triton compile; torch.compile: its compile), and for bfloat16 "
              "the max abs error against torch in float32 on the same inputs:", ""]
    for c in cases:
        b, tc = c["variants"].get("braze", {}), c["variants"].get("torch.compile", {})
        extra = ""
        if "err_vs_fp32" in b:
            extra = f"; vs float32: braze {_e(b['err_vs_fp32'])}, eager {_e(c.get('eager_err_vs_fp32'))}"
        if "first_call_ms" in b or "first_call_ms" in tc:
            lines.append(f"- {c['program']} {_shape(c)} {c['dtype']}: braze {_fmt(b.get('first_call_ms'))}, "
                         f"torch.compile {_fmt(tc.get('first_call_ms'))}{extra}")
    lines += targets(cases)
    errors = [f"{c['program']} {_shape(c)} {c['dtype']}{' ' + k if k else ''}: {v['error']}"
              for c in cases for k, v in [("", c), *c["variants"].items()] if "error" in v]
    if any(c["variants"].get("braze", {}).get("sync_waits") is False for c in cases):
        errors.append("braze.cuda.synchronize() returned before the device was done: braze's times run to the end "
                      "of a torch.cuda.synchronize() after it")
    errors += [f"{c['program']} {_shape(c)} {c['dtype']}: braze timed {c['variants']['braze']['reps_cut']} times only "
               f"(a call took over {SLOW_CALL_S} s)" for c in cases if "reps_cut" in c["variants"].get("braze", {})]
    if ew.get("not_run"):
        errors.append(f"not run (past --budget): {', '.join(ew['not_run'])}")
    return lines + (["", "Errors and notes:", ""] + [f"- {e}" for e in errors] if errors else [])


def _gbs(v: dict[str, Any]) -> str:
    g = v.get("gbs")
    return "-" if g is None else f"{g:.0f}" if g >= 10 else f"{g:.3f}"


def _kpct(v: dict[str, Any]) -> str:
    f = v.get("kernel_fraction_of_copy")
    return "-" if f is None else f"{f:.0%}"


def targets(cases: list[dict[str, Any]]) -> list[str]:
    """The issue's targets at the GPU-sized shapes: kernels at >= 85% of the HBM bound and
    >= 1.0x torch.compile's; beside them the whole call's ratio, eager and jit."""
    big = {tuple(s) for s in GPU_SHAPES.values()}
    rows = []
    for c in cases:
        b = c["variants"].get("braze", {})
        if tuple(c["shape"]) not in big or b.get("kernel_fraction_of_copy") is None:
            continue
        f, r = b["kernel_fraction_of_copy"], b.get("kernel_speedup_vs_torch.compile")
        ok = f >= TARGET_FRACTION and (r is None or r >= TARGET_VS_COMPILE)
        rows.append(f"- {c['program']} {c['dtype']}: kernel at {f:.0%} of copy (target {TARGET_FRACTION:.0%}), "
                    + (f"{r:.2f}x torch.compile's kernel (target {TARGET_VS_COMPILE:.1f}x)" if r is not None
                       else "no torch.compile")
                    + f": **{'met' if ok else 'missed'}**; whole call {_ratio(b.get('speedup_vs_torch.compile'))} "
                      f"(eager recording), {_ratio(b.get('jit_speedup_vs_torch.compile'))} (braze.jit) of torch.compile's")
    return ["", "Targets (GPU-sized shapes):", "", *rows] if rows else []
