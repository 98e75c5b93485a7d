"""A paged KV cache's kernels (vLLM's PagedAttention): the write is a scatter into a
pool of blocks (``index_copy_`` / ``x[slots] = v``: one kernel over the new rows, each
stored at its checked slot), and attention reads keys and values through a block
table inside its one chain kernel (no gathered copy). Every case against the
reference executor, fused and with ``BRAZE_FUSION=0``."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.errors import IndexOutOfRange
from braze.runtime.cpu import compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")

RNG = np.random.default_rng(17)


def _both(monkeypatch: Any, run: Callable[[], Any]) -> tuple[Any, Any, dict[str, int]]:
    """``run()`` fused (with its stats) and on the reference executor."""
    monkeypatch.setenv("BRAZE_FUSION", "1")
    braze.reset_stats()
    fused = run()
    st = braze.stats()
    monkeypatch.setenv("BRAZE_FUSION", "0")
    return fused, run(), st


# -- the write: a scatter -------------------------------------------------------------------

@pytest.mark.parametrize("setitem", [False, True], ids=["index_copy_", "setitem"])
def test_the_kv_write_is_one_scatter_kernel(setitem: bool, monkeypatch: Any) -> None:
    pool0 = RNG.standard_normal((64, 3, 8)).astype(np.float32)
    k = RNG.standard_normal((4, 3, 8)).astype(np.float32)
    slots = np.array([5, 17, 63, 0], dtype=np.int64)

    def run() -> np.ndarray:
        pool = braze.from_numpy(pool0.copy())
        new = braze.from_numpy(k) * 2 + 1  # computed in the step (rotary's output, here)
        s = braze.from_numpy(slots)
        if setitem:
            pool[s] = new
        else:
            pool.index_copy_(0, s, new)
        return pool.numpy().copy()

    fused, ref, st = _both(monkeypatch, run)
    want = pool0.copy()
    want[slots] = k * 2 + 1
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(fused, want)
    assert st["kernel_launches"] == 2, st  # the step's own kernel, then the scatter: O(rows), not O(pool)


def test_a_scatter_replays_one_plan_at_new_slots(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")
    pool = braze.zeros(32, 2, 4)
    slots = braze.from_numpy(np.zeros(3, dtype=np.int64))
    want = np.zeros((32, 2, 4), np.float32)
    pool.numpy()
    braze.reset_stats()
    for t in range(5):
        rows = RNG.standard_normal((3, 2, 4)).astype(np.float32)
        slots.numpy()[:] = [t, 10 + 2 * t, 31 - t]  # written in place between steps
        pool.index_copy_(0, slots, braze.from_numpy(rows) + 0)
        want[[t, 10 + 2 * t, 31 - t]] = rows
        np.testing.assert_array_equal(pool.numpy(), want)
    st = braze.stats()
    assert st["plan_misses"] == 1 and st["kernels_compiled"] <= 2, st


def test_a_scatter_along_an_inner_dim_of_a_strided_target(monkeypatch: Any) -> None:
    base = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    src = RNG.standard_normal((4, 5, 2)).astype(np.float32)

    def run() -> np.ndarray:
        x = braze.from_numpy(base.copy())
        x.transpose(1, 2).index_copy_(2, braze.tensor([4, 1]), braze.from_numpy(src) - 1)
        return x.numpy().copy()

    fused, ref, _ = _both(monkeypatch, run)
    want = base.copy()
    want.transpose(0, 2, 1)[:, :, [4, 1]] = src - 1
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(fused, want)


def test_setitem_wraps_negative_rows_and_broadcasts(monkeypatch: Any) -> None:
    def run() -> np.ndarray:
        x = braze.zeros(6, 3)
        x[braze.tensor([-1, 2])] = braze.tensor([1.0, 2.0, 3.0])
        x[braze.tensor([0, -2]) + 0] = 7.0  # pending indices: wrapped on the stream
        return x.numpy().copy()

    fused, ref, _ = _both(monkeypatch, run)
    want = np.zeros((6, 3), np.float32)
    want[[-1, 2]] = [1, 2, 3]
    want[[0, -2]] = 7
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(fused, want)


@pytest.mark.parametrize("fusion", ["1", "0"])
def test_an_out_of_range_slot_raises_and_writes_nothing(fusion: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", fusion)
    pool0 = RNG.standard_normal((16, 2, 4)).astype(np.float32)
    pool = braze.from_numpy(pool0.copy())
    for bad in (16, -1, 1 << 40):
        slots = braze.tensor([3, bad, 5])
        with pytest.raises(IndexOutOfRange) as e:
            pool.index_copy_(0, slots + 0, braze.ones(3, 2, 4))  # pending: found in the kernel
            pool.numpy()
        assert e.value.index == bad and e.value.size == 16
        np.testing.assert_array_equal(pool.numpy(), pool0)
    # a realised index is checked as it is recorded
    with pytest.raises(IndexOutOfRange):
        pool.index_copy_(0, braze.tensor([16]), braze.ones(1, 2, 4))
    np.testing.assert_array_equal(pool.numpy(), pool0)
