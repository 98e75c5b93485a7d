"""Paged decoding attention (keys and values read through a block table) against the same
attention over contiguous caches: what the gather costs.

    .venv/bin/python -m bench.paged                 # B = 8, L = 512, 1024, 2048, 1 thread
    .venv/bin/python -m bench.paged --threads 2 --identity
    .venv/bin/python -m bench.paged --kv-dtypes float32,float16   # the cache's type, side by side

SmolLM2's heads (9 query heads, 3 KV heads, head dim 64), B = 8 sequences of one query
each, blocks of 16 rows. Three programs, each one chain kernel, timed as a captured step's
replay (``StepCapture(static=True)``: the kernel alone, no recording), best of 3 x 300:

  paged        ``kp.view(blocks, 16, 3, 64)[table].reshape(B, L, 3, 64).transpose(1, 2)``,
               the table a random permutation of the pool's blocks (``--identity``: in order)
  head-major   k, v contiguous (B, 3, L, 64), as braze's own KV caches are
  token-major  k, v contiguous (B, L, 3, 64) (the pool's row layout, without a table)

Keys and values are stored as each of ``--kv-dtypes`` (default float32) and cast to
float32 as read (``PagedKVCache`` casts the gathered rows), which the chain kernel
does as it loads them; the programs of all types alternate, round by round.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

import braze
import braze.nn.functional as F
from braze.capture import StepCapture

B, H, KVH, D, BS = 8, 9, 3, 64, 16


def _replay_us(fn: Callable[[], braze.Tensor], n: int) -> float:
    cap = StepCapture(static=True)
    cap.observe(0, fn)
    cap.observe(0, fn)
    assert cap.ready, cap.reason
    for _ in range(10):
        cap.replay(0)
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        cap.replay(0)
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def programs(L: int, identity: bool, dtype: braze.DType) -> dict[str, Callable[[], Any]]:
    """The three attention programs over keys and values stored as ``dtype``."""
    rng = np.random.default_rng(0)
    nb = L // BS
    blocks = B * nb + 8

    def stored(*shape: int) -> braze.Tensor:
        return braze.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype).realize()
    pool = [stored(blocks * BS, KVH, D) for _ in range(2)]
    order = np.arange(B * nb) if identity else rng.permutation(blocks)[:B * nb]
    table = braze.from_numpy(order.reshape(B, nb).astype(np.int64))
    pos = braze.from_numpy(np.full((B, 1), L - 1, np.int64))
    q = braze.from_numpy(rng.standard_normal((B, H, 1, D)).astype(np.float32))
    head = [stored(B, KVH, L, D) for _ in range(2)]
    tok = [stored(B, L, KVH, D) for _ in range(2)]

    def attend(k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
        mask = (braze.arange(L).reshape(1, L) <= pos.reshape(B, 1)).reshape(B, 1, 1, L)
        return F.scaled_dot_product_attention(q, k.float(), v.float(), attn_mask=mask, enable_gqa=True)

    def paged() -> braze.Tensor:
        k, v = (p.view(blocks, BS, KVH, D)[table].float().reshape(B, L, KVH, D).transpose(1, 2) for p in pool)
        return attend(k, v)

    return {"paged": paged, "head-major": lambda: attend(*head),
            "token-major": lambda: attend(*(t.transpose(1, 2) for t in tok))}


def run(L: int, identity: bool, n: int, dtypes: list[str]) -> dict[str, float]:
    progs = {f"{name} {dt}": fn for dt in dtypes for name, fn in programs(L, identity, getattr(braze, dt)).items()}
    out = {name: float("inf") for name in progs}
    for _ in range(3):
        for name, fn in progs.items():
            out[name] = min(out[name], _replay_us(fn, n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--identity", action="store_true", help="the table lists the blocks in order")
    ap.add_argument("--kv-dtypes", default="float32", help="types the keys and values are stored as (default float32)")
    ap.add_argument("--smoke", action="store_true", help="one small length, few reps")
    a = ap.parse_args()
    braze.set_num_threads(a.threads)
    dtypes = a.kv_dtypes.split(",")
    for L in ((64,) if a.smoke else (512, 1024, 2048)):
        t = run(L, a.identity, 5 if a.smoke else 300, dtypes)
        for dt in dtypes:
            p, h, k = t[f"paged {dt}"], t[f"head-major {dt}"], t[f"token-major {dt}"]
            print(f"L={L:5d} {dt:8s}: paged {p:7.0f} us, head-major {h:7.0f} us, token-major {k:7.0f} us, "
                  f"paged / head-major {p / h:.2f}, paged / token-major {p / k:.2f}")


if __name__ == "__main__":
    main()
