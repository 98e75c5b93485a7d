"""Tile sizes of the attention chain kernel on a GPU: each candidate (rows, keys, warps,
stages) set through ``BRAZE_TRITON_CHAIN`` in a process of its own (its own kernel cache
directory), timed on causal attention in bfloat16 beside torch's FlashAttention backend.

    PYTHONPATH=. python3 -m bench.gpu_chain_tiles [--configs 128,64,8,3 ...] [--out FILE]

Per shape and candidate: ms per call of ``braze.jit`` over ``bench.gpu_attention``'s
``braze_causal`` (the recording replayed: the kernel's time once the host keeps ahead),
``REPS`` calls back to back between two CUDA events, the median of ``ROUNDS``; torch's
``scaled_dot_product_attention(is_causal=True)`` timed the same way in the same process.
What ``triton_chain.GPU_TILE`` holds is the candidate ``default``. A candidate that does
not compile (shared memory) is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

SHAPES = [(8, 1024, 64), (8, 1024, 128), (4, 4096, 64), (4, 4096, 128), (1, 16384, 64), (1, 16384, 128)]
CANDIDATES = ["default", "128,64,4,3", "128,128,4,3", "128,64,8,4", "128,32,4,3", "64,64,4,3", "64,128,4,3",
              "128,128,8,2", "128,128,8,3"]
HEADS, REPS, ROUNDS = 16, 20, 5


def _time(torch: Any, fn: Any, sync: Any) -> float:
    for _ in range(3):
        fn()
    sync()
    out = []
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(REPS):
            fn()
        sync()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / REPS)
    return statistics.median(out)


def child(with_torch: bool) -> None:
    """One candidate (already in the environment): a JSON line per shape."""
    import ml_dtypes
    import numpy as np
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    import braze
    from bench.gpu_attention import braze_causal
    gen = torch.Generator(device="cuda").manual_seed(0)
    for b, n, d in SHAPES:
        row: dict[str, Any] = {"B": b, "N": n, "D": d}
        try:
            shape = (b, HEADS, n, d)
            tq, tk, tv = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
            q, k, v = (braze.tensor(x.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16), device="cuda")
                       for x in (tq, tk, tv))
            fn = braze.jit(braze_causal)
            got = fn(q, k, v).numpy().astype(np.float32)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                want = scaled_dot_product_attention(tq, tk, tv, is_causal=True).float().cpu().numpy()
            row["max_diff"] = float(np.abs(got - want).max())
            row["braze_ms"] = _time(torch, lambda: fn(q, k, v).realize(), braze.cuda.synchronize)
            if with_torch:
                def sdpa() -> Any:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return scaled_dot_product_attention(tq, tk, tv, is_causal=True)
                row["torch_ms"] = _time(torch, sdpa, torch.cuda.synchronize)
            del q, k, v, tq, tk, tv
        except Exception as e:  # (a tile that does not fit: Triton's OutOfResources)
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=CANDIDATES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--with-torch", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.with_torch)
        return 0
    results: dict[str, list[dict[str, Any]]] = {}
    for cfg in args.configs:
        env = dict(os.environ, BRAZE_CACHE_DIR=tempfile.mkdtemp(prefix="braze-tiles-"))
        env.pop("BRAZE_TRITON_CHAIN", None)
        if cfg != "default":
            env["BRAZE_TRITON_CHAIN"] = cfg
        cmd = [sys.executable, "-m", "bench.gpu_chain_tiles", "--child"] + (["--with-torch"] if cfg == "default" else [])
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        if p.returncode:
            print(f"{cfg}: rc {p.returncode}: {p.stderr[-400:]}", file=sys.stderr)
        results[cfg] = rows
        print(cfg, json.dumps(rows), flush=True)
    torch_ms = {(r["B"], r["N"], r["D"]): r.get("torch_ms") for r in results.get("default", [])}
    head = "| candidate | " + " | ".join(f"B{b} N{n} D{d}" for b, n, d in SHAPES) + " |"
    lines = [head, "|---" * (len(SHAPES) + 1) + "|"]
    lines.append("| torch FlashAttention ms | " + " | ".join(
        f"{torch_ms.get(s) or float('nan'):.3f}" for s in SHAPES) + " |")
    for cfg, rows in results.items():
        by = {(r["B"], r["N"], r["D"]): r for r in rows}
        cells = []
        for s in SHAPES:
            r = by.get(s, {})
            t = torch_ms.get(s)
            cells.append(f"{r['braze_ms']:.3f} ({t / r['braze_ms']:.2f}x)" if "braze_ms" in r and t
                         else "fails" if "error" in r else "n/a")
        lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results, "markdown": "\n".join(lines)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
