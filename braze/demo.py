"""A short tour of the lazy stream: ``python -m braze.demo``.

Records a few ops, prints the nodes waiting on the stream, flushes them by asking for
the result, and checks it against the same computation in numpy.
"""

from __future__ import annotations

import numpy as np

import braze
from braze.stream import stream


def main() -> int:
    braze.manual_seed(0)
    x = braze.randn(4, 8)
    w = braze.randn(8, 3)
    braze.reset_stats()

    h = (x @ w).relu()
    y = braze.softmax(h - h.mean(-1, keepdim=True), dim=-1)
    view = y.T[1:]  # a view: Layout arithmetic, no node

    pending = list(stream("cpu").nodes)
    print(f"recorded {len(pending)} nodes, nothing has run yet:")
    for node in pending:
        print("   ", node)
    print(f"the view y.T[1:] shares y's storage: {view.shares_storage(y)}, strides {view.stride()}")

    got = y.numpy()  # sync point: the stream is flushed to the executor here
    xs, ws = x.numpy(), w.numpy()
    hs = np.maximum(xs @ ws, 0)
    hs = hs - hs.mean(-1, keepdims=True)
    e = np.exp(hs - hs.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    ok = np.allclose(got, want, rtol=1e-5, atol=1e-6)
    print("result:\n", y)
    print("matches numpy:", ok)
    print("stats:", {k: v for k, v in braze.stats().items() if v})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
