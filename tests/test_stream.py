"""The stream: ops record nodes, sync points flush them, the counters tell what happened.

Counters are asserted loosely where the answer depends on the executor (a fusing
executor launches fewer kernels and allocates fewer intermediates than the reference
one) and exactly where it does not (nodes recorded, flushes).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import braze
from braze.stream import Stream, stream

N = 1 << 18  # elements of the "big" tensors: 1 MiB of float32


@pytest.fixture(autouse=True)
def _flushed() -> Iterator[None]:
    braze.synchronize()
    gc.collect()  # so tensors of earlier tests are not freed in the middle of a measurement
    braze.reset_stats()
    yield
    braze.synchronize()


def _queued() -> int:
    return len(stream("cpu").nodes)


def test_reset_stats_zeroes_counters() -> None:
    x = braze.ones(4) + 1
    x.numpy()
    st = braze.stats()
    assert st["nodes_recorded"] == 2 and st["flushes"] == 1 and st["kernel_launches"] >= 1
    assert st["allocations"] >= 1 and st["bytes_allocated"] >= 16 and st["peak_bytes"] >= 16
    live = st["live_bytes"]
    braze.reset_stats()
    st = braze.stats()
    for k, v in st.items():
        if k == "live_bytes":
            assert v == live  # what braze holds does not change by resetting counters
        elif k == "peak_bytes":
            assert v == live  # the high-water mark restarts from what is live
        else:
            assert v == 0, k
    assert set(st) >= {"nodes_recorded", "flushes", "kernel_launches", "allocations", "bytes_allocated",
                       "live_bytes", "peak_bytes"}
    # stats() is a snapshot, not a live view
    snap = braze.stats()
    (x * 2).numpy()
    assert snap["nodes_recorded"] == 0


def test_three_op_program() -> None:
    x = braze.tensor(np.arange(1000, dtype=np.float32))
    assert braze.stats()["nodes_recorded"] == 0  # tensor() copies data in, no node
    assert braze.stats()["allocations"] == 1 and braze.stats()["bytes_allocated"] == 4000
    braze.reset_stats()
    y = ((x + 1) * 0.01).exp()
    st = braze.stats()
    assert st["nodes_recorded"] == 3 and _queued() == 3
    assert st["flushes"] == 0 and st["kernel_launches"] == 0
    assert st["allocations"] == 0  # nothing has run, nothing is allocated
    out = y.numpy()
    st = braze.stats()
    assert st["flushes"] == 1 and _queued() == 0
    assert 1 <= st["kernel_launches"] <= 3
    assert 1 <= st["allocations"] <= 3
    assert st["bytes_allocated"] == st["allocations"] * 4000
    assert st["peak_bytes"] >= 4000
    np.testing.assert_allclose(out, np.exp((np.arange(1000, dtype=np.float32) + 1) * np.float32(0.01)), rtol=1e-6)
    # reading again runs nothing
    y.numpy()
    y.tolist()
    assert braze.stats()["flushes"] == 1 and braze.stats()["kernel_launches"] == st["kernel_launches"]


def test_views_and_metadata_do_not_flush() -> None:
    x = braze.arange(12).reshape(3, 4) * 2
    n = _queued()
    v = x.T[1:, None]
    _ = (v.shape, v.dtype, v.device, v.stride(), v.ndim, v.numel(), len(x), x.size(0), x.is_contiguous())
    assert _queued() == n and braze.stats()["flushes"] == 0


SYNC_POINTS: dict[str, Callable[[braze.Tensor], Any]] = {
    "numpy": lambda t: t.numpy(),
    "item": lambda t: t.sum().item(),
    "tolist": lambda t: t.tolist(),
    "repr": lambda t: repr(t),
    "str": lambda t: str(t),
    "bool": lambda t: bool(t[0]),
    "float": lambda t: float(t[1]),
    "int": lambda t: int(t[1]),
    "realize": lambda t: t.realize(),
    "array": lambda t: np.asarray(t),
    "synchronize": lambda t: braze.synchronize(),
    "index": lambda t: [10, 20, 30][t[0].long()],
}


@pytest.mark.parametrize("name", sorted(SYNC_POINTS))
def test_every_sync_point_flushes(name: str) -> None:
    t = braze.tensor([1.0, 2.0]) * 1  # one pending node
    assert _queued() == 1
    SYNC_POINTS[name](t)
    assert _queued() == 0
    assert braze.stats()["flushes"] == 1
    assert t._storage.realized


def test_sync_point_values() -> None:
    t = braze.tensor([1.5, -2.0]) * 2
    assert repr(t) == "tensor([ 3., -4.])"
    assert t.realize() is t
    assert bool((t > 0)[0]) is True and bool((t > 0)[1]) is False


def test_queue_size_limit_flushes() -> None:
    s = stream("cpu")
    old = s.limit
    s.limit = 4
    try:
        x = braze.ones(8)
        for _ in range(3):
            x = x + 1
        assert _queued() == 0, "the 4th node reaches the limit and flushes"
        assert braze.stats()["flushes"] == 1 and x._storage.realized
        for _ in range(5):
            x = x * 1
        assert _queued() == 1 and braze.stats()["flushes"] == 2
        assert x.tolist() == [4.0] * 8
    finally:
        s.limit = old


def test_env_stream_limit() -> None:
    """``BRAZE_STREAM_LIMIT`` sets the limit of the streams braze creates."""
    code = ("import braze; from braze.stream import stream\n"
            "x = braze.ones(2)\n"
            "for _ in range(5): x = x + 1\n"
            "s = braze.stats()\n"
            "print(stream('cpu').limit, s['flushes'], len(stream('cpu').nodes))\n")
    env = dict(os.environ, BRAZE_STREAM_LIMIT="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "2", "0"]
    assert Stream(lambda nodes: None, limit=7).limit == 7


def test_one_stream_per_device() -> None:
    assert stream("cpu") is stream("cpu")
    assert braze.ones(2).device == braze.device("cpu")


def test_intermediates_are_freed_during_a_flush() -> None:
    """A chain of 40 ops on a 1 MiB tensor peaks at a few tensors' worth, not 40."""
    x = braze.ones(N).realize()
    nbytes = x.nbytes
    braze.synchronize()
    gc.collect()
    braze.reset_stats()
    start = braze.stats()["live_bytes"]
    y = x
    for i in range(40):
        y = y * 1.0001 if i % 2 else y + 0.5
    assert braze.stats()["allocations"] == 0
    y.realize()
    st = braze.stats()
    assert st["kernel_launches"] >= 1
    assert st["peak_bytes"] - start <= 4 * nbytes, (st["peak_bytes"] - start) / nbytes
    # after the flush only the result is held beyond what was there before
    assert st["live_bytes"] - start <= nbytes
    assert st["bytes_allocated"] <= 40 * nbytes
    del y
    assert braze.stats()["live_bytes"] <= start


def test_dropped_tensors_release_memory() -> None:
    start = braze.stats()["live_bytes"]
    x = (braze.ones(N) * 3).realize()
    assert braze.stats()["live_bytes"] >= start + x.nbytes
    v = x[::2]  # a view keeps the storage alive
    del x
    assert braze.stats()["live_bytes"] >= start + v.nbytes * 2
    del v
    assert braze.stats()["live_bytes"] <= start


def test_writes_count_as_nodes() -> None:
    x = braze.zeros(4).realize()
    braze.reset_stats()
    x[1] = 2.0
    x.add_(1.0)
    assert braze.stats()["nodes_recorded"] == 3  # assign; add + assign
    assert x.tolist() == [1.0, 3.0, 1.0, 1.0]
    assert braze.stats()["allocations"] <= 1  # the add's result; the writes allocate nothing
