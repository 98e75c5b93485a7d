"""Shared pieces of braze's benchmarks (``bench.fusion``, ``bench.attention``).

The methodology, written once: C baselines compiled from ``bench/baselines/*.c``; a
``Variant`` is one way of computing a program, warmed up and then timed in interleaved
rounds (every variant once per round, so that load from other work on a shared machine
falls on all of them alike); medians are reported. braze's counters (``braze.stats()``)
are taken for one steady-state call, and the first call separately.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import glob
import os
import re
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, TypeVar

import numpy as np

HERE = Path(__file__).resolve().parent
BASELINES = HERE / "baselines"
C_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared"]


# --------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def env(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def build_baselines(directory: Path) -> ctypes.CDLL:
    """Compile every bench/baselines/*.c of kernels into one shared object and load it
    (the standalone programs there, steady.c and paged_kv.c, have a main of their own
    and are compiled by hand, as their first lines say)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "gcc"
    sources = sorted(str(p) for p in BASELINES.glob("*.c") if not re.search(r"^int main\(", p.read_text(), re.M))
    so = directory / "baselines.so"
    # Compile with -ffast-math but link without it: gcc 12 links crtfastmath.o into a
    # -ffast-math shared object, whose constructor turns on flush-to-zero for the whole
    # process when it is loaded, and braze's own kernels (denormal results) then change.
    objects = []
    for src in sources:
        obj = directory / (Path(src).stem + ".o")
        subprocess.run([cc, *C_FLAGS, "-c", src, "-o", str(obj)], check=True)
        objects.append(str(obj))
    link = [f for f in C_FLAGS if f != "-ffast-math"]
    subprocess.run([cc, *link, *objects, "-o", str(so), "-lm"], check=True)
    return ctypes.CDLL(str(so))


def _ptr(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, int):
        return ctypes.c_int64(a)
    return a


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def loadavg() -> list[float]:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def machine() -> dict[str, Any]:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    try:
        ccv = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[0]
    except (OSError, IndexError):
        ccv = "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                                cwd=HERE.parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "braze"], capture_output=True, text=True, check=False,
                               cwd=HERE.parent).stdout.split()[1::2]
    except OSError:
        commit, dirty = "", []
    return {"cpu": model, "nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "numpy": np.__version__, "cc": ccv, "commit": commit,
            "braze_uncommitted": dirty}


def _import_torch() -> Any:
    try:
        import torch
    except Exception:  # noqa: BLE001 - not installed, or broken: skip it
        return None
    return torch


@dataclass
class Variant:
    name: str
    run: Callable[[], Any]  # one timed call
    result: Callable[[], np.ndarray]  # one untimed call, the output as numpy
    per_thread: Callable[[int], None] = lambda nt: None
    warmup: int = 2
    single_threaded: bool = False  # timed at the first thread count only, reused at the others
    first_ms: float | None = None
    stats: dict[str, int] | None = None
    first_stats: dict[str, int] | None = None
    err: float | None = None
    times: dict[int, list[float]] = field(default_factory=dict)
    #: entered around each call, outside its timing (braze's executor choice, an
    #: environment variable: switching it costs more than a small call)
    setting: Callable[[], ContextManager[Any]] = contextlib.nullcontext


def timed(v: Variant) -> float:
    """One call of ``v``, in its setting; seconds."""
    with v.setting():
        return _timed(v.run)


STAT_KEYS = ("kernel_launches", "kernels_compiled", "allocations", "pool_hits", "bytes_allocated",
             "peak_bytes", "live_bytes", "plan_hits", "plan_misses", "nodes_recorded")


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def braze_stats_of(fn: Callable[[], None]) -> tuple[float, dict[str, int]]:
    """Time one call of ``fn`` and take braze's counters over it; ``peak_above_live_before``
    is the high-water mark above what braze held before the call (the inputs)."""
    import braze
    gc.collect()
    live0 = braze.stats()["live_bytes"]
    braze.reset_stats()
    t = _timed(fn)
    s = braze.stats()
    out = {k: s[k] for k in STAT_KEYS}
    out["live_bytes_before"] = live0
    out["peak_above_live_before"] = s["peak_bytes"] - live0
    return t, out


V = TypeVar("V", bound=Variant)


def braze_variant_of(make: Callable[..., V], name: str, program: Callable[[], Any], fusion: str,
                     warm_calls: int, **kw: Any) -> V:
    """``make(name, call, result, ...)``: the variant running ``program`` (a braze call)
    with ``BRAZE_FUSION=fusion``, each call realized and dropped. Its first call is
    timed and counted (schedule and compile), then ``warm_calls`` more run (plan cached,
    pool warm) and one steady call is counted. ``kw``: the variant's other fields."""

    def call() -> None:
        y = program()
        y.realize()
        del y

    def result() -> np.ndarray:
        with env("BRAZE_FUSION", fusion):
            return np.array(program().numpy())

    v = make(name, call, result, setting=lambda: env("BRAZE_FUSION", fusion), **kw)
    with v.setting():
        t, v.first_stats = braze_stats_of(call)
        v.first_ms = t * 1e3
        for _ in range(warm_calls):
            call()
        _, v.stats = braze_stats_of(call)
    return v


_BLAS_SYMBOLS = {
    "set": ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads", "bli_thread_set_num_threads"),
    "get": ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads", "MKL_Get_Max_Threads", "bli_thread_get_num_threads"),
    "corename": ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                 "openblas_get_corename"),
}
_blas_fns: dict[str, Any] = {}


def _blas_fn(kind: str) -> Any:
    """numpy's BLAS entry point ``kind`` ("set" or "get" the thread count, or OpenBLAS's
    "corename": the kernels it picked for this CPU), or None."""
    if kind not in _blas_fns:
        fn = None
        libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
        for path in [*sorted(glob.glob(str(libdir / "*blas*"))), ""]:
            try:
                lib = ctypes.CDLL(path or None)
            except OSError:
                continue
            fn = next((f for f in (getattr(lib, sym, None) for sym in _BLAS_SYMBOLS[kind]) if f is not None), None)
            if fn is not None:
                break
        _blas_fns[kind] = fn
    return _blas_fns[kind]


def blas_set_num_threads(n: int) -> bool:
    """Set the thread count of the BLAS numpy uses (numpy's matmul, and so braze's
    matmul extern step and its reference executor), through the library's own call: the
    ``OPENBLAS_NUM_THREADS`` variable is read once, at load. False when no known BLAS
    was found (its threads then stay at the library's default)."""
    fn = _blas_fn("set")
    if fn is None:
        return False
    fn(ctypes.c_int(n))
    return True


def blas_get_num_threads() -> int | None:
    """The thread count of numpy's BLAS, or None when it cannot be asked."""
    fn = _blas_fn("get")
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    return int(fn())


def write_results(res: dict[str, Any], md: str, out_dir: str, name: str, smoke: bool,
                  log: Callable[[str], None]) -> None:
    """Write a benchmark's results as ``<out_dir>/<name>-<date>[-smoke].json`` (the
    markdown table inside, under "markdown") and print the table."""
    import datetime
    import json
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{datetime.date.today().isoformat()}" + ("-smoke" if smoke else "")
    res["markdown"] = md
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    print(md)
    log(f"wrote {out / stem}.json ({res['seconds']:.0f} s)")


def model_file(model: str | None, who: str) -> str | None:
    """The GGUF file a benchmark runs (default: the default model), or None after
    saying on stderr that it does not exist."""
    from pathlib import Path

    from braze.models import default_llm_path
    path = str(Path(model) if model else default_llm_path())
    if not Path(path).is_file():
        print(f"{who}: no such model file: {path}", file=sys.stderr, flush=True)
        return None
    return path
