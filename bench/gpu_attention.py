"""Causal attention on a GPU: braze's chain kernel (attention written as user code,
rendered as Triton) against PyTorch's FlashAttention backend, both in bfloat16.

``run(log, quick, smoke)`` (imported by ``bench/gpu.py``; ``python -m bench.gpu_attention
[--quick|--smoke]`` on its own) times, for B in (1, 4, 8), H = 16, N in (1024, 4096, 16384), D in (64, 128)
(combinations whose q, k, v and output pass ~2 GB are skipped):

- braze: ``softmax((q @ k^T * D**-0.5).masked_fill(j > i, -inf), -1) @ v`` over cuda
  tensors made from numpy (``braze.tensor(..., device="cuda")``), one call per timed
  run, ended by ``braze.cuda.synchronize()`` (which waits for the GPU);
- torch: ``scaled_dot_product_attention(q, k, v, is_causal=True)`` under
  ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, the same values;

each the median of ``REPS`` runs after ``WARMUP``, timed by CUDA events around the call
(and the synchronisation); ``speed b/t`` is torch's time over braze's (>= 0.9 is issue
16's bar). TFLOP/s counts the causal half of the two matmuls:
``2 * 2 * B * H * N^2 * D / 2``. Each combination first checks that braze ran it as one
kernel (no N x N scores in memory) and that its output is torch's within bfloat16
tolerance (``ATOL``); a combination that fails either is reported and not timed.
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any, Callable

import numpy as np

BATCHES = (1, 4, 8)
HEADS = 16
LENGTHS = (1024, 4096, 16384)
HEAD_DIMS = (64, 128)
QUICK = [(1, 1024, 64), (4, 4096, 128), (1, 16384, 128)]  # (B, N, D) of ``--quick``
SMOKE = [(1, 96, 64)]  # ``--smoke``: under the interpreter
MAX_BYTES = 2 * 1024 ** 3  # q, k, v and the output in bfloat16
WARMUP = 3
REPS = 10
ATOL = 2e-2  # bfloat16 outputs of size ~1: a few units in the last place, summed differently


def braze_causal(q: Any, k: Any, v: Any) -> Any:
    """Causal attention as a user writes it (nanoGPT's masked_fill with -inf)."""
    import braze
    n = q.shape[-2]
    i = braze.arange(n, device="cuda")[:, None]
    j = braze.arange(n, device="cuda")[None, :]
    s = (q @ k.mT * q.shape[-1] ** -0.5).masked_fill(j > i, -math.inf)
    return braze.softmax(s, -1) @ v


def _median_ms(torch: Any, fn: Callable[[], Any], sync: Callable[[], None], events: bool, reps: int) -> float:
    """Median ms of ``fn(); sync()`` after ``WARMUP`` calls: CUDA events around each call on
    a GPU, wall time in ``smoke`` (torch on the CPU)."""
    import time
    for _ in range(WARMUP):
        fn()
        sync()
    times = []
    for _ in range(reps):
        if events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            sync()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _combos(quick: bool, smoke: bool) -> list[tuple[int, int, int]]:
    if smoke:
        return list(SMOKE)
    if quick:
        return list(QUICK)
    return [(b, n, d) for b in BATCHES for n in LENGTHS for d in HEAD_DIMS]


def run(log: Callable[[str], None] = print, quick: bool = False, smoke: bool = False) -> dict[str, Any]:
    """Time every combination; log a markdown table; return its rows (times in ms) and
    the table. ``smoke``: tiny shapes, braze under Triton's interpreter and torch on the
    CPU (its math backend), wall times: the script's own test."""
    import braze
    if not smoke and (not braze.cuda.is_available() or braze.cuda.interpreting()):
        why = f"no GPU run ({braze.cuda.unavailable_reason() or 'Triton interpreter'})"
        log(f"gpu_attention: skipped: {why}")
        return {"skipped": why}
    import ml_dtypes
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    dev = "cpu" if smoke else "cuda"
    backend = SDPBackend.MATH if smoke else SDPBackend.FLASH_ATTENTION
    heads = 2 if smoke else HEADS
    reps = 2 if smoke else REPS
    where = "torch on the CPU (math), braze under Triton's interpreter" if smoke else torch.cuda.get_device_name()
    lines = [f"causal attention, bfloat16, H={heads}: braze (user code) vs torch SDPA "
             f"{'math' if smoke else 'FlashAttention'}, {where}; median of {reps} after {WARMUP}"
             f"{', CUDA events' if not smoke else ', wall time'}; speed = torch's time / braze's", "",
             "| B | N | D | braze ms | braze TFLOP/s | torch ms | torch TFLOP/s | speed | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in lines:
        log(x)
    rows: list[dict[str, Any]] = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for b, n, d in _combos(quick, smoke):
        shape = (b, heads, n, d)
        nbytes = 4 * math.prod(shape) * 2
        if nbytes > MAX_BYTES:
            log(f"| {b} | {n} | {d} | skipped: {nbytes / 2 ** 30:.1f} GiB of q, k, v and output | | | | | |")
            continue
        # drawn by torch (on the GPU: fast), copied through the host into braze: the same values
        tq, tk, tv = (torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
        bq, bk, bv = (braze.tensor(x.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16), device="cuda")
                      for x in (tq, tk, tv))
        row: dict[str, Any] = {"B": b, "H": heads, "N": n, "D": d}
        braze.cuda.synchronize()
        before = braze.stats()["kernel_launches"]
        out = braze_causal(bq, bk, bv)
        braze.cuda.synchronize()
        launches = braze.stats()["kernel_launches"] - before

        def torch_call() -> Any:
            with sdpa_kernel(backend):
                return scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        want = torch_call()
        diff = float(np.abs(out.numpy().astype(np.float32) - want.float().cpu().numpy()).max())
        del out, want
        row.update(launches=launches, max_diff=diff)
        if launches != 1 or not diff <= ATOL:
            log(f"| {b} | {n} | {d} | not timed: braze ran {launches} kernels, max abs diff {diff:.3g} "
                f"(want 1 kernel, <= {ATOL}) | | | | | |")
            rows.append(row)
            continue
        flops = 2 * 2 * b * heads * n * n * d / 2
        t_braze = _median_ms(torch, lambda: braze_causal(bq, bk, bv).realize(), braze.cuda.synchronize, not smoke, reps)
        t_torch = _median_ms(torch, torch_call, (lambda: None) if smoke else torch.cuda.synchronize, not smoke, reps)
        row.update(braze_ms=t_braze, torch_ms=t_torch, braze_tflops=flops / t_braze / 1e9,
                   torch_tflops=flops / t_torch / 1e9, speed=t_torch / t_braze)
        log(f"| {b} | {n} | {d} | {t_braze:.3f} | {row['braze_tflops']:.1f} | {t_torch:.3f} | "
            f"{row['torch_tflops']:.1f} | {row['speed']:.2f} | {diff:.3g} |")
        rows.append(row)
        del bq, bk, bv, tq, tk, tv
        if not smoke:
            torch.cuda.empty_cache()
    table = [x for x in lines[2:]] + [
        f"| {r['B']} | {r['N']} | {r['D']} | {r['braze_ms']:.3f} | {r['braze_tflops']:.1f} | {r['torch_ms']:.3f} | "
        f"{r['torch_tflops']:.1f} | {r['speed']:.2f} | {r['max_diff']:.3g} |" for r in rows if "braze_ms" in r]
    return {"rows": rows, "markdown": lines[0] + "\n\n" + "\n".join(table)}


if __name__ == "__main__":
    run(print, quick="--quick" in sys.argv[1:], smoke="--smoke" in sys.argv[1:])
