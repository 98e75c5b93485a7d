"""The GPU benchmark's device and clocks (``bench/gpu.py`` and its sections): where torch
and braze run (the GPU, or the CPU and Triton's interpreter under ``--smoke``), what the
run saw of the GPU, driver and versions, the copy bandwidth every fraction is of, and
the timers: wall time around call + synchronize, back to back, and kernel time from
torch's profiler.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Log = Callable[[str], None]


def log(msg: str) -> None:
    print(msg, flush=True)


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


def timing(times: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "times_ms": [round(t * 1e3, 4) for t in times]}
