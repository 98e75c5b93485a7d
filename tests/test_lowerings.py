"""Lowerings of what used to be extern steps: float->int casts, gathers (``gather``,
``take_along_dim``, ``index_select``, embeddings) with bounds-checked indices, ``cumsum``
along rows and ``topk`` of small k. Each is checked against the reference executor
(``BRAZE_FUSION=0``), at several shapes of one program (generic kernels), and for the
number of kernels it takes with a producer and a consumer.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
from braze.errors import IndexOutOfRange
from braze.runtime.cpu import compiler_available

needs_cc = pytest.mark.skipif(not compiler_available(), reason="no C compiler")


def both(fn: Callable[..., Any], *arrays: np.ndarray, monkeypatch: Any,
         rtol: float = 0.0) -> tuple[list[np.ndarray], dict[str, int]]:
    """``fn`` fused (its outputs and stats) after checking it against the reference:
    equal, or within ``rtol`` (a sum folded in another order than numpy's)."""
    def go() -> tuple[list[np.ndarray], dict[str, int]]:
        braze.reset_stats()
        out = fn(*[braze.from_numpy(a) for a in arrays])
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.numpy().copy() for o in outs], braze.stats()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref, _ = go()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "1")
        got, st = go()
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        if rtol:
            np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * float(np.abs(r).max(initial=0)))
        else:
            np.testing.assert_array_equal(g, r)
    return got, st


# -- float -> int casts ----------------------------------------------------------------------

SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 2.5, -2.5, 127.9, -128.9, 255.5, 300, -1,
                    2147483647.0, 2147483648.0, -2147483649.0, 9.3e18, -9.3e18, 0.0, -0.0, 65504.0])


@pytest.mark.parametrize("src", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("to", ["int8", "uint8", "int16", "int32", "int64"])
def test_float_to_int_truncates_saturates_and_maps_nan_to_zero(src: str, to: str, monkeypatch: Any) -> None:
    s, d = getattr(braze, src), getattr(braze, to)
    got, st = both(lambda x: ((x.to(s) * 1.0).to(d) + 1), SPECIAL, monkeypatch=monkeypatch)
    info = np.iinfo(d.np)
    want = np.array([0, info.max, info.min], np.int64) + 1
    assert (got[0][:3].astype(np.int64) == want.astype(d.np).astype(np.int64)).all()
    if compiler_available():
        assert st["kernel_launches"] == 1, st  # the cast to float, the multiply, the cast to int and the add


@needs_cc
def test_a_float_to_int_cast_is_fused_at_every_shape(monkeypatch: Any) -> None:
    rng = np.random.default_rng(0)
    for shape in [(5, 7), (33, 100), (2, 3, 300)]:
        a = (rng.standard_normal(shape) * 100).astype(np.float32)
        _, st = both(lambda x: (x.abs() * 3 - 7).to(braze.int32) * 2, a, monkeypatch=monkeypatch)
        assert st["kernel_launches"] == 1
    # a strided view
    a = (rng.standard_normal((40, 30)) * 100).astype(np.float32)
    _, st = both(lambda x: x.T[::2].to(braze.int16), a, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1


# -- gathers: gather, take_along_dim, index_select and embeddings ---------------------------------

GATHER_SHAPES = [((6, 5), (4, 3)), ((17, 40), (17, 9)), ((3, 70, 9), (2, 50, 9))]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
@pytest.mark.parametrize("idt", [np.int64, np.int32])
def test_gather_matches_the_reference_at_every_shape(dtype: str, idt: Any, monkeypatch: Any) -> None:
    rng = np.random.default_rng(1)
    for xs, ish in GATHER_SHAPES:
        x = (rng.standard_normal(xs) * 4).astype(getattr(braze, dtype).np)
        idx = rng.integers(0, xs[1], ish).astype(idt)
        got, st = both(lambda a, i: a.gather(1, i), x, idx, monkeypatch=monkeypatch)
        sub = x[tuple(slice(0, n) for n in ish[:1])]
        np.testing.assert_array_equal(got[0], np.take_along_axis(sub[:, :, :ish[2]] if len(ish) == 3 else sub,
                                                                 idx.astype(np.int64), 1))
        if compiler_available():
            assert st["kernel_launches"] == 1


@needs_cc
def test_a_gather_takes_its_index_producer_and_consumer_into_its_kernel(monkeypatch: Any) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((30, 50)).astype(np.float32)
    idx = rng.integers(0, 25, (30, 20))
    # the index computed in the kernel (+ 3), the result scaled: one kernel
    _, st = both(lambda a, i: (a.gather(1, i + 3) * 2).abs() - 1, x, idx, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1
    # a source of another shape than the index, computed in the flush, is stored first
    _, st = both(lambda a, i: (a * 3).gather(1, i) + 1, x, idx, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 2
    # of the index's shape, its element-wise work is done at the gathered places
    full = rng.integers(0, 50, (30, 50))
    got, st = both(lambda a, i: (a.abs() - 1).gather(1, i) * 2, x, full, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1
    np.testing.assert_array_equal(got[0], np.take_along_axis(np.abs(x) - 1, full, 1) * 2)
    # ... also where it reads its coordinate (an arange), and along the rows
    got, st = both(lambda a, i: (a + braze.arange(50).to(braze.float32)).gather(0, i[:, :50] % 30), x, full,
                   monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], np.take_along_axis(x + np.arange(50, dtype=np.float32), full % 30, 0))


def test_gather_of_non_contiguous_views(monkeypatch: Any) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 30)).astype(np.float32)
    idx = rng.integers(0, 20, (30, 40))
    got, _ = both(lambda a, i: a.T[:, ::2].gather(1, i[::2, 1::2].T.T), x, idx, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], np.take_along_axis(x.T[:15, ::2], idx[::2, 1::2], 1))


@pytest.mark.parametrize("dim, ishape", [(0, (3, 4, 1)), (1, (5, 3, 7)), (-1, (1, 4, 3)), (None, (6,))])
def test_take_along_dim_broadcasts_as_pytorch(dim: int | None, ishape: tuple[int, ...], monkeypatch: Any) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 1, 7)).astype(np.float32)
    idx = rng.integers(0, 35 if dim is None else x.shape[dim], ishape)
    got, _ = both(lambda a, i: braze.take_along_dim(a, i, dim) * 2, x, idx, monkeypatch=monkeypatch)
    if dim is None:
        want = np.take_along_axis(x.reshape(-1), idx, 0)
    else:
        d = dim % 3
        shape = np.broadcast_shapes(x.shape[:d] + (1,) + x.shape[d + 1:], idx.shape[:d] + (1,) + idx.shape[d + 1:])
        xb = np.broadcast_to(x, shape[:d] + (x.shape[d],) + shape[d + 1:])
        ib = np.broadcast_to(idx, shape[:d] + (idx.shape[d],) + shape[d + 1:])
        want = np.take_along_axis(xb, ib, d)
    np.testing.assert_array_equal(got[0], want * 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_select_at_every_dim_and_shape(dtype: str, dim: int, monkeypatch: Any) -> None:
    rng = np.random.default_rng(5)
    for shape in [(4, 5, 6), (9, 3, 300), (2, 40, 33)]:
        x = (rng.standard_normal(shape) * 5).astype(getattr(braze, dtype).np)
        idx = rng.integers(0, shape[dim], (7,))
        got, st = both(lambda a, i: a.index_select(dim, i) * 2, x, idx, monkeypatch=monkeypatch)
        if dtype != "bfloat16":  # (the reference's own bfloat16 rounding is checked by both)
            np.testing.assert_array_equal(got[0], np.take(x, idx, axis=dim) * 2)
        if compiler_available():
            assert st["kernel_launches"] == 1


@needs_cc
def test_an_embedding_and_its_scale_are_one_kernel(monkeypatch: Any) -> None:
    import braze.nn.functional as F
    rng = np.random.default_rng(6)
    for vocab, d, n in [(50, 64, (2, 3)), (100, 2048, (1, 7)), (30, 300, (4,))]:
        w = rng.standard_normal((vocab, d)).astype(np.float32)
        ids = rng.integers(0, vocab, n)
        got, st = both(lambda ww, i: F.embedding(i, ww) * 8.0, w, ids, monkeypatch=monkeypatch)
        np.testing.assert_array_equal(got[0], w[ids] * 8.0)
        assert st["kernel_launches"] == 1


# -- bounds checks ------------------------------------------------------------------------

@pytest.mark.parametrize("fusion", ["0", "1"])
@pytest.mark.parametrize("shift", [-3, 10, 1 << 40, -(1 << 40)])
def test_indices_out_of_range_raise_in_the_kernel_and_read_nothing_outside(fusion: str, shift: int,
                                                                           monkeypatch: Any) -> None:
    """Indices computed in the flush (so the recording cannot check them) outside the
    dim raise ``IndexOutOfRange`` naming the op, the value and the size; a kernel reads
    at 0 instead (an index of 2^40 would crash the process if it were read)."""
    import braze.nn.functional as F
    monkeypatch.setenv("BRAZE_FUSION", fusion)
    x = braze.from_numpy(np.arange(40, dtype=np.float32).reshape(8, 5))
    before = x * 2
    cases = [("gather", lambda i: x.gather(1, i.reshape(1, 3).expand(8, 3)) + 1, 5),
             ("index_select", lambda i: F.embedding(i, x) * 3, 8),
             ("gather", lambda i: braze.take_along_dim(x, i.reshape(1, 3), 1), 5)]
    for op, fn, size in cases:
        idx = braze.arange(3) + shift  # 3 + shift - 1 ... the largest, or the most negative, is out
        bad = fn(idx)
        later = bad - 1
        with pytest.raises(IndexOutOfRange) as info:
            later.numpy()
        assert info.value.op == op and info.value.size == size
        # the value the reference names: the most negative index, else the largest
        assert info.value.index == (shift if shift < 0 else shift + 2), str(info.value)
        assert f"index {info.value.index} out of range for dimension" in str(info.value)
        with pytest.raises(braze.BrazeError):
            bad.numpy()
        np.testing.assert_array_equal(before.numpy(), np.arange(40, dtype=np.float32).reshape(8, 5) * 2)
        assert (fn(braze.arange(3)) * 1).numpy().size  # the stream goes on


@needs_cc
def test_a_replayed_plan_checks_indices_written_in_place(monkeypatch: Any) -> None:
    import braze.nn.functional as F
    monkeypatch.setenv("BRAZE_FUSION", "1")
    w = braze.from_numpy(np.ones((10, 16), np.float32))
    ids = braze.tensor([1, 2, 3])
    for _ in range(2):
        assert (F.embedding(ids, w) * 2).numpy().sum() == 96
    ids[1] = 12  # pending: the recording cannot read it, the kernel checks it
    with pytest.raises(IndexOutOfRange, match="index 12 out of range for dimension 0 of size 10"):
        (F.embedding(ids, w) * 2).numpy()
    ids[1] = 9
    assert (F.embedding(ids, w) * 2).numpy().sum() == 96


# -- cumsum along rows ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "bool"])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_cumsum_matches_the_reference_at_every_shape(dtype: str, dim: int, monkeypatch: Any) -> None:
    rng = np.random.default_rng(7)
    d = getattr(braze, dtype)
    for shape in [(4, 7, 3), (9, 33, 100), (2, 5, 1300)]:
        a = (rng.standard_normal(shape) * 3).astype(d.np)
        got, st = both(lambda x: x.cumsum(dim), a, monkeypatch=monkeypatch)
        if dtype in ("int32", "bool", "float64"):
            np.testing.assert_array_equal(got[0], np.cumsum(a, dim, dtype=np.int64 if dtype in ("int32", "bool") else None))
        if compiler_available():
            assert st["kernel_launches"] == 1


@needs_cc
def test_a_cumsum_takes_its_producer_and_consumer_into_its_kernel(monkeypatch: Any) -> None:
    rng = np.random.default_rng(8)
    a = rng.standard_normal((30, 200)).astype(np.float32)
    got, st = both(lambda x: ((x.abs() - 0.5).cumsum(-1) - 1).abs(), a, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1
    np.testing.assert_array_equal(got[0], np.abs(np.cumsum(np.abs(a) - np.float32(0.5), -1) - 1))
    # top-p sampling's cumulative probabilities: the softmax and the scan in one kernel
    got, st = both(lambda x: braze.softmax(x, -1).cumsum(-1) > 0.9, a, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1
    # a reduction of the scanned values folds in a walk that scans, in the same kernel
    got, st = both(lambda x: x.cumsum(-1).amax(-1), a, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1
    np.testing.assert_array_equal(got[0], np.cumsum(a, -1).max(-1))


@needs_cc
@pytest.mark.parametrize("n", [7, 256, 700])
def test_folds_of_scanned_values_and_what_reads_them_are_one_kernel(n: int, monkeypatch: Any) -> None:
    """Top-p's renormalisation after the sort: the scan, a sum of the values it masks,
    the stores dividing by that sum (a second walk that scans again); and a scan of a
    softmax whose values are folded: its max and sum, the scan, a fold of it."""
    rng = np.random.default_rng(12)
    a = -np.sort(-np.abs(rng.standard_normal((9, n)).astype(np.float32)), -1) / n

    def top_p(x: Any) -> Any:
        kept = x.masked_fill(x.cumsum(-1) - x > 0.9 / n * 10, 0.0)
        return kept / kept.sum(-1, keepdim=True)
    got, st = both(top_p, a, monkeypatch=monkeypatch, rtol=1e-5)
    assert st["kernel_launches"] == 1
    c = np.cumsum(a, -1)
    kept = np.where(c - a > 0.9 / n * 10, 0, a)
    np.testing.assert_allclose(got[0], kept / kept.sum(-1, keepdims=True), rtol=1e-5)
    got, st = both(lambda x: ((x.softmax(-1).cumsum(-1) < 0.5).sum(-1), x.cumsum(-1).sum(-1)), a,
                   monkeypatch=monkeypatch, rtol=1e-5)
    assert st["kernel_launches"] == 1
    assert (got[0] <= n).all()


def test_cumsum_of_non_contiguous_views(monkeypatch: Any) -> None:
    a = np.random.default_rng(9).standard_normal((40, 30)).astype(np.float32)
    got, _ = both(lambda x: x.T[::2, 3:].cumsum(-1), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], np.cumsum(a.T[::2, 3:], -1))


# -- topk of small k ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k, dim", [(1, -1), (5, -1), (16, 0), (3, 1)])
def test_topk_orders_ties_and_nan_as_the_reference(dtype: str, largest: bool, k: int, dim: int,
                                                    monkeypatch: Any) -> None:
    rng = np.random.default_rng(10)
    d = getattr(braze, dtype)
    for shape in [(17, 20, 19), (16, 40, 300), (20, 5, 33)]:
        a = rng.integers(-3, 4, shape).astype(d.np)  # many ties
        if d.is_floating_point:
            a[0, 1, :5] = np.nan
            a[1, :, 2] = np.nan
        got, st = both(lambda x: x.topk(k, dim, largest=largest), a, monkeypatch=monkeypatch)
        if compiler_available():
            assert st["kernel_launches"] == 1
        order = np.argsort(-a if largest and not d.is_floating_point else a, axis=dim, kind="stable")
        if not d.is_floating_point:
            np.testing.assert_array_equal(got[1], np.take(order, np.arange(k), axis=dim))


@needs_cc
def test_topk_is_a_kernel_after_its_producer_and_numpy_past_small_k(monkeypatch: Any) -> None:
    a = np.random.default_rng(11).standard_normal((64, 1000)).astype(np.float32)
    got, st = both(lambda x: (x.abs() * 2).topk(8), a, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 2  # the producer's kernel, then the top-k kernel
    np.testing.assert_array_equal(got[0], -np.sort(-np.abs(a) * 2, -1)[:, :8])
    from braze import plan
    plan.clear()
    both(lambda x: x.topk(40), a, monkeypatch=monkeypatch)
    steps = [s for p in plan.stored_plans() for s in p.steps]
    assert any(isinstance(s, plan.ExternStep) for s in steps)  # numpy's sort, between kernels
    assert not any(isinstance(getattr(s, "step", None) and s.step.kernel, braze.ir.TopK) for s in steps)
    got, _ = both(lambda x: x.T[::3, 1:].topk(4, largest=False, sorted=False), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], np.sort(a.T[::3, 1:], -1)[:, :4])


# -- generic kernels ----------------------------------------------------------------------

@needs_cc
@pytest.mark.parametrize("name", ["gather", "embedding", "cumsum", "topk"])
def test_new_shapes_of_each_lowering_compile_nothing_past_the_second(name: str, monkeypatch: Any,
                                                                   plan_builds: list[bool]) -> None:
    import braze.nn.functional as F
    monkeypatch.setenv("BRAZE_FUSION", "1")
    prog = {
        "gather": lambda x: x.gather(1, (x.abs() * 3).to(braze.int64).clamp(0, x.shape[1] - 1)) * 2,
        "embedding": lambda x: F.embedding((x[:, 0].abs() * 2).to(braze.int64) % x.shape[0], x) * 3,
        "cumsum": lambda x: braze.softmax(x, -1).cumsum(-1) > 0.5,
        "topk": lambda x: x.topk(4)[0] * 1,
    }[name]
    rng = np.random.default_rng(12)
    for shape in [(5, 7), (33, 100), (64, 300), (9, 1000)]:
        a = rng.standard_normal(shape).astype(np.float32)
        got = prog(braze.from_numpy(a)).numpy()
        with monkeypatch.context() as m:
            m.setenv("BRAZE_FUSION", "0")
            np.testing.assert_array_equal(got, prog(braze.from_numpy(a)).numpy())
    assert len(plan_builds) >= 4 and not any(plan_builds[2:]), plan_builds


def test_a_cumsum_over_a_dim_of_one(monkeypatch: Any) -> None:
    """A generic kernel keeps a scan's row even where it is one element long."""
    for shape in [(1, 2), (1, 5), (1, 9)]:
        a = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
        got, _ = both(lambda x: x.cumsum(0), a, monkeypatch=monkeypatch)
        np.testing.assert_array_equal(got[0], a)
