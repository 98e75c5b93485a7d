"""GPU benchmark (issue 16, part 5): braze's cuda device beside torch eager and torch.compile.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 bench/gpu.py --out $OUT/gpu.json   # on a GPU
    PYTHONPATH=. python3 bench/gpu.py --quick --out $OUT/gpu.json              # ~3 minutes
    PYTHONPATH=.:/tmp/torchsite .venv/bin/python bench/gpu.py --smoke          # here, no GPU

Sections (``--only elementwise,attention,llm``; each runs inside its own guard, so a
failure prints its traceback and the others still run: one run on a lent GPU gives every
number it can):

- **elementwise**: custom-erf GELU, softmax and LayerNorm, the programs of
  ``bench/fusion.py`` (imported: written once over a module ``m``, so braze and torch
  run the same formula op for op) at the fusion benchmark's shapes and at GPU-sized ones
  (~256 MiB per float32 operand, far past launch overhead and the 50 MiB L2), in float32
  and bfloat16 (inputs rounded to bfloat16 once, so both sides read the same values).
  The programs' one dtype-less constant (``where(x < 0, -1.0, 1.0)``) is cast to the
  case's dtype on both sides (braze does not promote; torch would promote to float32).
  Beside them ``scale`` (``x * 2.0``, GPU-sized only): the simplest streaming kernel, what
  braze's element-wise kernels reach by their launch structure alone. The full run also
  times the fusion benchmark's tiny smoke shapes in float32 (what a call costs beside
  its kernel); ``--quick`` runs the GPU-sized shapes only.
- **attention**, **llm**: ``run(log)`` of ``bench/gpu_attention.py`` and
  ``bench/gpu_llm.py`` when those modules exist; keyword arguments ``quick`` / ``smoke``
  are passed when their ``run`` takes them (in ``--smoke`` a ``run`` without ``smoke`` is
  skipped). ``run`` may return a JSON-able dict (its ``"markdown"``, if any, goes with
  the tables), a markdown string, or nothing: the markdown tables it printed (lines
  starting with "|") are taken then, and all it printed is kept in the JSON.

Timing, the same for every variant: wall time (``time.perf_counter``) around one call
and its synchronization (braze: ``y = prog(...); y.realize(); braze.cuda.synchronize()``;
torch: the call, then ``torch.cuda.synchronize()``), after warm-up calls; the median of
``--reps`` (>= 10 on a GPU) such calls. So launch and Python overhead are in it, as a
user sees them. After braze's synchronize, ``torch.cuda.synchronize()`` (a device-wide
wait) is timed too: if that tail is not negligible, braze's synchronize did not wait for
its kernels, which the run says, and then the time counts to the end of the tail. Also
reported: "back to back", per call over 20 calls with one synchronize at the end (what
the kernels cost when launches overlap them). First calls (braze: plan + Triton compile;
torch.compile: its compile) are timed separately. GB/s is the bytes a kernel must move at
least (every input read once, the output written once) over the time, and "% copy" its
fraction of the device-to-device copy bandwidth measured at the start of the same run
(torch ``copy_`` of 1 GiB: bytes read + written / time), the HBM ceiling reached in
practice. Errors: max abs difference of braze (and of torch.compile) from torch eager,
both in the case's dtype; for bfloat16 also each against torch in float32 on the same
(rounded) inputs.

``--smoke`` runs all of it at tiny sizes with the cuda device under Triton's interpreter
(``BRAZE_CUDA_INTERPRET=1``) and torch on the CPU: the script's own test.

Writes the results as JSON to ``--out`` (after every case, so a run cut short keeps what it
measured) and the markdown beside it (``.md``), and prints the markdown at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import importlib
import importlib.util
import inspect
import io
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
# Run as a script (``python3 bench/gpu.py``), Python puts bench/ itself first on the path,
# where its modules (attention, llm, shapes...) would shadow installed ones: the repo root
# goes there instead, so ``bench.*`` and ``braze`` import as packages.
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == _ROOT / "bench":
    sys.path[0] = str(_ROOT)
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from bench import fusion  # noqa: E402
from bench.harness import _fmt, machine  # noqa: E402

PROGRAMS = ("scale", "gelu_custom", "softmax", "layernorm")
#: fusion.SHAPES' key per program, and the GPU-sized shape added to the fusion benchmark's
#: (its layernorm is 32 MiB, inside an H100's L2; these are 256 MiB per float32 operand)
GPU_SHAPES: dict[str, tuple[int, ...]] = {"gelu": (64, 512, 2048), "softmax": (16384, 4096), "norm": (65536, 1024)}
DTYPES = ("float32", "bfloat16")
SECTIONS = ("elementwise", "attention", "llm")  # the last two: bench/gpu_<name>.py, when present
TARGET_FRACTION = 0.85  # of the HBM bound (issue 16)
TARGET_VS_COMPILE = 1.0
COPY_BYTES = 1 << 30
B2B_CALLS = 20
SLOW_CALL_S = 0.5  # a braze call slower than this is timed 3 times, not --reps

Log = Callable[[str], None]


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- device

@dataclass
class Device:
    """Where torch runs (the GPU, or the CPU in --smoke) and how each side waits."""

    torch: Any
    name: str  # torch device: "cuda" or "cpu"
    braze: Any = None  # the braze module, or None where braze's cuda device is unavailable
    braze_why: str = ""

    @property
    def gpu(self) -> bool:
        return self.name == "cuda"

    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def bsync(self) -> None:
        self.braze.cuda.synchronize()


def open_device(smoke: bool) -> Device:
    if smoke:
        os.environ["BRAZE_CUDA_INTERPRET"] = "1"  # read when braze first asks for the cuda device
    elif os.environ.pop("TRITON_INTERPRET", None) is not None:
        # it would run torch.compile's Triton kernels (and braze's) on the CPU: no GPU number
        log("bench/gpu.py: TRITON_INTERPRET unset for this run (it would interpret every Triton kernel on the CPU)")
    import torch
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: torch sees no CUDA device (run with --smoke to test the script on the CPU)")
    dev = Device(torch, "cpu" if smoke else "cuda")
    try:
        import braze
        why = braze.cuda.unavailable_reason()
        if why is None and not smoke and braze.cuda.interpreting():
            why = ("it runs under Triton's interpreter here (BRAZE_CUDA_INTERPRET is set): on the CPU, "
                   "not a GPU measurement; not timed")
        if why is None:
            dev.braze = braze
        else:
            dev.braze_why = why
    except Exception as e:  # noqa: BLE001 - braze unusable here: torch's numbers still come
        dev.braze_why = f"import braze failed: {type(e).__name__}: {e}"
    return dev


def _cmd(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def describe(dev: Device) -> dict[str, Any]:
    """The GPU, its driver and the software versions, as the run saw them."""
    torch = dev.torch
    out: dict[str, Any] = {"torch": torch.__version__, "torch_device": dev.name,
                           "braze_cuda": "available" if dev.braze is not None else dev.braze_why}
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        out["triton"] = None
    if dev.braze is not None:
        out["braze_interpreting"] = bool(dev.braze.cuda.interpreting())
    if dev.gpu:
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                   memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,
                   l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
        clock, bus = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
        if clock and bus:  # kHz, bits; double data rate
            out["spec_bandwidth_gbs"] = round(2 * clock * 1e3 * bus / 8 / 1e9, 1)
        smi = _cmd(["nvidia-smi", "--query-gpu=driver_version,clocks.max.memory,power.limit",
                    "--format=csv,noheader"])
        out["driver"] = smi.split(",")[0].strip() if smi else _driver_api_version()
        out["nvidia_smi"] = smi or None
    return out


def _driver_api_version() -> str | None:
    """The CUDA driver API version (e.g. "12.8") where nvidia-smi is missing."""
    try:
        from cuda.bindings import driver
        _, v = driver.cuDriverGetVersion()
        return f"CUDA driver API {int(v) // 1000}.{int(v) % 1000 // 10}"
    except Exception:  # noqa: BLE001 - no cuda-bindings here: the driver stays unnamed
        return None


def copy_bandwidth(dev: Device, nbytes: int, reps: int) -> dict[str, Any]:
    """A device-to-device copy with torch: bytes read + written over the median time."""
    torch = dev.torch
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev.name).fill_(1)
    dst = torch.empty_like(src)
    times = wall(lambda: dst.copy_(src), dev.sync, reps, warmup=3)
    t = statistics.median(times)
    del src, dst
    return {"bytes": nbytes, "median_ms": t * 1e3, "min_ms": min(times) * 1e3,
            "gbs": 2 * nbytes / t / 1e9, "gbs_best": 2 * nbytes / min(times) / 1e9}


# --------------------------------------------------------------------------- timing

def wall(call: Callable[[], Any], sync: Callable[[], None], reps: int, warmup: int = 2) -> list[float]:
    """Seconds of each of ``reps`` calls, each with its synchronization, after ``warmup``."""
    for _ in range(warmup):
        call()
        sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def back_to_back(call: Callable[[], Any], sync: Callable[[], None], n: int) -> float:
    """Seconds per call over ``n`` calls with one synchronization at the end."""
    call()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    sync()
    return (time.perf_counter() - t0) / n


def braze_wall(call: Callable[[], Any], dev: Device, reps: int, warmup: int = 2) -> tuple[list[float], list[float]]:
    """braze's timed calls (call + ``braze.cuda.synchronize()``) and, per call, the
    tail of a device-wide wait after it (~0 when braze's synchronize waits as it should)."""
    for _ in range(warmup):
        call()
        dev.bsync()
        dev.sync()
    times, tails = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        dev.bsync()
        t1 = time.perf_counter()
        dev.sync()
        tails.append(time.perf_counter() - t1)
        times.append(t1 - t0)
    return times, tails


def kernel_ms(call: Callable[[], Any], dev: Device, n: int = 10) -> float | None:
    """GPU time per call of the kernels ``call`` launches (any stream, any launcher:
    braze's Triton kernels, torch's), from torch's profiler (CUPTI): what the kernels
    cost without the host's time between them. None without a GPU."""
    if not dev.gpu:
        return None
    torch = dev.torch
    call()
    dev.sync()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        dev.sync()
    total = 0.0
    for evt in prof.key_averages():
        total += getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "self_cuda_time_total", 0.0)
    return total / n / 1e3


def _timing(times: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "times_ms": [round(t * 1e3, 4) for t in times]}


# --------------------------------------------------------------------------- programs

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


# --------------------------------------------------------------------------- elementwise

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
    V["eager"] = {**_timing(times), "back_to_back_ms": back_to_back(t_eager, dev.sync, B2B_CALLS) * 1e3,
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
            V["torch.compile"] = {**_timing(times), "first_call_ms": first * 1e3, "err_vs_eager": err,
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
    v.update(_timing(times))
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
    v["jit"] = {**_timing(jt), "back_to_back_ms": back_to_back(jcall, sync, B2B_CALLS if "reps_cut" not in v else 2) * 1e3}
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


# --------------------------------------------------------------------------- optional sections

class _Tee(io.TextIOBase):
    """stdout that is also kept: a section's printed tables go into the results too."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return int(self.real.write(text))

    def flush(self) -> None:
        self.real.flush()


def sibling(name: str, kwargs: dict[str, bool], out: dict[str, Any], log: Log) -> None:
    """Run ``bench/<name>.py``'s ``run(log, ...)`` if the module exists. What it prints
    (through ``log`` or ``print``) is kept under "output"; unless ``run`` returns
    markdown, the tables it printed (lines starting with "|") stand for it, also when it fails."""
    if importlib.util.find_spec(f"bench.{name}") is None:
        out["skipped"] = f"bench/{name}.py does not exist"
        log(f"{name}: skipped ({out['skipped']})")
        return
    mod = importlib.import_module(f"bench.{name}")
    params = inspect.signature(mod.run).parameters
    if kwargs.get("smoke") and "smoke" not in params:
        out["skipped"] = "its run() takes no smoke flag: not run in --smoke"
        log(f"{name}: skipped ({out['skipped']})")
        return
    tee = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            r = mod.run(log, **{k: v for k, v in kwargs.items() if k in params})
    finally:  # what it printed before a failure counts too
        out["output"] = tee.kept.getvalue()
        table = [line for line in out["output"].splitlines() if line.startswith("|")]
        if table:
            out["markdown"] = f"{name} (the tables bench/{name}.py printed):\n\n" + "\n".join(table)
    if isinstance(r, str):
        out["markdown"] = r
    elif isinstance(r, dict):
        out.update(r)


# --------------------------------------------------------------------------- report

def markdown(res: dict[str, Any]) -> str:
    """The run as markdown, in bench/RESULTS.md's form: a heading naming the GPU, the
    command, then each section's tables."""
    g = res["gpu"]
    cp = res.get("copy") or {}
    head = (f"## GPU (issue 16): {g.get('gpu', 'no GPU, torch on the ' + g['torch_device'])}, {res['date']}, "
            f"braze {res['machine'].get('commit', '?')}")
    lines = [head, "", f"    {res['command']}", "",
             f"driver {g.get('driver')}, CUDA {g.get('cuda')}, torch {g['torch']}, Triton {g.get('triton')}; "
             f"braze's cuda device: {g['braze_cuda']}"
             + (" (under Triton's interpreter)" if g.get("braze_interpreting") else "") + ".  "]
    if cp:
        lines.append(f"Copy bandwidth (torch `copy_` of {cp['bytes'] / 2**30:.2f} GiB, read + write): "
                     f"**{cp['gbs']:.0f} GB/s** median, {cp['gbs_best']:.0f} best"
                     + (f"; spec {g['spec_bandwidth_gbs']:.0f} GB/s" if g.get("spec_bandwidth_gbs") else "")
                     + ". % copy below is a fraction of the median.")
    for name, sec in res["sections"].items():
        if name == "elementwise":
            lines += elementwise_md(sec, res["reps"])
        elif sec.get("markdown"):
            lines += ["", sec["markdown"].rstrip()]
        if sec.get("skipped"):
            lines += ["", f"{name}: skipped ({sec['skipped']})"]
        if sec.get("error"):
            lines += ["", f"{name}: FAILED: {sec['error'].strip().splitlines()[-1]}"]
    return "\n".join(lines) + "\n"


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


# --------------------------------------------------------------------------- main

def guarded(name: str, fn: Callable[[dict[str, Any]], None], res: dict[str, Any], sink: Callable[[], None],
            over: Callable[[], bool], log: Log) -> None:
    """Run one section into ``res["sections"][name]``; a failure is printed and recorded,
    and the run goes on."""
    sec: dict[str, Any] = {}
    res["sections"][name] = sec
    if over():
        sec["skipped"] = "past --budget"
        log(f"{name}: skipped (past --budget)")
        return
    t0 = time.perf_counter()
    try:
        fn(sec)
    except Exception:  # noqa: BLE001 - device time is precious: every other section still runs
        tb = traceback.format_exc()
        sec["error"] = tb
        log(f"{name}: FAILED\n{tb}")
    sec["seconds"] = round(time.perf_counter() - t0, 1)
    sink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu.py", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/gpu-<date>[-smoke].json); "
                    "the markdown goes beside it as .md")
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    ap.add_argument("--quick", action="store_true", help="GPU-sized shapes only, 10 reps (fits ~3 minutes)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, braze under Triton's interpreter, "
                    "torch on the CPU: tests the script without a GPU")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per variant (default 20; quick 10; smoke 2)")
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated: scale (x * 2.0) or "
                    "bench/fusion.py's programs")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--budget", type=float, default=None, help="seconds: start no case or section after this "
                    "(the run then ends cleanly, inside the caller's time limit)")
    args = ap.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        ap.error(f"--only: no section {', '.join(sorted(unknown))} (sections: {', '.join(SECTIONS)})")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.reps is None:
        args.reps = {"smoke": 2, "quick": 10, "full": 20}[mode]
    date = _dt.date.today().isoformat()
    out = Path(args.out) if args.out else _ROOT / "bench" / "results" / f"gpu-{date}{'-smoke' if args.smoke else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    dev = open_device(args.smoke)
    res: dict[str, Any] = {"date": date, "mode": mode, "reps": args.reps,
                           "command": "python3 bench/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
                           "machine": machine(), "gpu": describe(dev), "sections": {}}
    g = res["gpu"]
    log(f"GPU: {g.get('gpu', 'none: torch on ' + dev.name)}; driver {g.get('driver')}; CUDA {g.get('cuda')}; "
        f"torch {g['torch']}; Triton {g.get('triton')}; braze's cuda device: {g['braze_cuda']}")

    def sink() -> None:  # after every case: a run cut short keeps what it measured, table included
        res["seconds"] = time.perf_counter() - t_start
        res["markdown"] = markdown(res)
        out.write_text(json.dumps(res, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(res["markdown"])

    def over() -> bool:
        return args.budget is not None and time.perf_counter() - t_start > args.budget

    try:
        res["copy"] = copy_bandwidth(dev, 1 << 22 if args.smoke else COPY_BYTES, 5 if args.smoke else 30)
        log(f"copy bandwidth: {res['copy']['gbs']:.0f} GB/s (median), {res['copy']['gbs_best']:.0f} best")
    except Exception:  # noqa: BLE001
        res["copy"] = None
        log("copy bandwidth: FAILED\n" + traceback.format_exc())
    sink()
    copy_gbs = res["copy"]["gbs"] if res["copy"] else 0.0
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    flags = {"quick": args.quick, "smoke": args.smoke}
    for name in only:
        if name == "elementwise":
            guarded(name, lambda sec: elementwise(dev, args, mode, copy_gbs, sink, over, sec, log), res, sink, over,
                    log)
        else:
            module = f"gpu_{name}"
            guarded(name, lambda sec: sibling(module, flags, sec, log), res, sink, over, log)
    sink()
    md = res["markdown"]
    log(f"wrote {out} and {out.with_suffix('.md')} ({time.perf_counter() - t_start:.0f} s)")
    print("\n" + md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
