"""Layout arithmetic against numpy, which implements the same strided model.

``Layout.view`` must agree with numpy's reshape-without-copy rule: for any view numpy
can make by slicing, permuting and broadcasting, braze finds a strided layout for a
new shape exactly when ``np.reshape(..., copy=False)`` succeeds, and that layout reads
the same elements.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braze.layout import Layout, broadcast_shapes, contiguous_strides, normalize_dim
from braze.storage import strided

BASE = np.arange(4096, dtype=np.int32)


def _layout_of(arr: np.ndarray) -> Layout:
    """The element Layout of a numpy view of ``BASE``."""
    item = arr.itemsize
    offset = (arr.__array_interface__["data"][0] - BASE.__array_interface__["data"][0]) // item
    return Layout(arr.shape, tuple(s // item for s in arr.strides), offset)


def _read(lay: Layout) -> np.ndarray:
    return strided(BASE, lay.shape, lay.strides, lay.offset)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def numpy_views(draw: st.DrawFn) -> np.ndarray:
    """A (possibly non-contiguous, possibly broadcast) numpy view of BASE."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim)))
    arr = BASE[:prod(shape)].reshape(shape)
    perm = draw(st.permutations(range(ndim)))
    arr = arr.transpose(perm)
    index = []
    for n in arr.shape:
        # mostly long slices, so dims stay > 1 and layouts stay interesting
        start = draw(st.integers(0, (n - 1) // 2))
        step = draw(st.sampled_from((1, 1, 1, 2, 3)))
        stop = draw(st.integers(max(start + 1, n - 1), n))
        index.append(slice(start, stop, step))
    arr = arr[tuple(index)]
    if draw(st.booleans()):
        # broadcast: a new leading dim and size-1 dims stretched (stride 0)
        lead = draw(st.integers(0, 2))
        target = (lead,) * (lead > 0) + tuple(draw(st.integers(1, 3)) if n == 1 else n for n in arr.shape)
        arr = np.broadcast_to(arr, target)
    return arr


@st.composite
def view_and_shape(draw: st.DrawFn) -> tuple[np.ndarray, tuple[int, ...]]:
    arr = draw(numpy_views())
    factors = [f for n in arr.shape for f in _prime_factors(n)]
    if draw(st.booleans()):
        factors = draw(st.permutations(factors))
    # group consecutive factors into the new dims, and sprinkle size-1 dims
    new: list[int] = []
    for f in factors:
        if new and draw(st.booleans()):
            new[-1] *= f
        else:
            new.append(f)
        if draw(st.integers(0, 5)) == 0:
            new.append(1)
    if not new or draw(st.integers(0, 5)) == 0:
        new.insert(draw(st.integers(0, len(new))), 1)
    return arr, tuple(new)


def _numpy_can_view(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    try:
        out = np.reshape(arr, shape, copy=False)
    except ValueError:
        return None
    assert np.shares_memory(out, arr) or out.size == 0
    return out


@settings(max_examples=250, deadline=None)
@given(view_and_shape())
def test_view_agrees_with_numpy_nocopy_reshape(case: tuple[np.ndarray, tuple[int, ...]]) -> None:
    arr, shape = case
    lay = _layout_of(arr)
    np.testing.assert_array_equal(_read(lay), arr)
    got = lay.view(shape)
    want = _numpy_can_view(arr, shape)
    assert (got is not None) == (want is not None), (arr.shape, arr.strides, shape)
    if got is not None:
        assert got.shape == shape
        np.testing.assert_array_equal(_read(got), want)
        np.testing.assert_array_equal(_read(got), arr.reshape(shape))


@settings(max_examples=120, deadline=None)
@given(numpy_views(), st.data())
def test_movement_ops_match_numpy(arr: np.ndarray, data: st.DataObject) -> None:
    lay = _layout_of(arr)
    perm = data.draw(st.permutations(range(arr.ndim)))
    np.testing.assert_array_equal(_read(lay.permute(perm)), arr.transpose(perm))
    d = data.draw(st.integers(0, arr.ndim - 1))
    n = arr.shape[d]
    i = data.draw(st.integers(0, n - 1))
    np.testing.assert_array_equal(_read(lay.select(d, i)), np.take(arr, i, axis=d))
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    step = data.draw(st.integers(1, 4))
    sl = (slice(None),) * d + (slice(start, stop, step),)
    np.testing.assert_array_equal(_read(lay.slice(d, start, stop, step)), arr[sl])
    u = data.draw(st.integers(0, arr.ndim))
    np.testing.assert_array_equal(_read(lay.unsqueeze(u)), np.expand_dims(arr, u))
    ones = tuple(k for k, m in enumerate(arr.shape) if m == 1)
    np.testing.assert_array_equal(_read(lay.squeeze(ones)), arr.squeeze(ones) if ones else arr)
    a, b = data.draw(st.integers(0, arr.ndim - 1)), data.draw(st.integers(0, arr.ndim - 1))
    np.testing.assert_array_equal(_read(lay.transpose(a, b)), np.swapaxes(arr, a, b))
    target = (2,) + tuple(3 if m == 1 else m for m in arr.shape)
    np.testing.assert_array_equal(_read(lay.expand(target)), np.broadcast_to(arr, target))
    lo, hi = lay.span()
    touched = {lay.index(ix) for ix in np.ndindex(*arr.shape)}
    assert min(touched) == lo and max(touched) + 1 == hi
    assert lay.is_contiguous() == (arr.size == 0 or _contig_ignoring_ones(arr))


def _contig_ignoring_ones(arr: np.ndarray) -> bool:
    """PyTorch's rule: size-1 dims may carry any stride."""
    kept = [(n, s) for n, s in zip(arr.shape, arr.strides) if n != 1]
    return [s for _, s in kept] == [arr.itemsize * x for x in contiguous_strides(tuple(n for n, _ in kept))]


def test_view_examples() -> None:
    t = Layout.contiguous((2, 3, 4)).permute((1, 0, 2))  # (3, 2, 4), strides (4, 12, 1)
    assert t.view((3, 8)) is None  # dims 0 and 1 are not mutually contiguous
    assert t.view((3, 2, 2, 2)) == Layout((3, 2, 2, 2), (4, 12, 2, 1))
    assert t.view((1, 3, 1, 8, 1)) is None
    assert Layout.contiguous((4, 5), offset=7).view((20,)) == Layout((20,), (1,), 7)
    col = Layout((4, 1), (5, 1), 2)  # a column of a (4, 5) matrix
    assert col.view((4,)) == Layout((4,), (5,), 2)
    assert col.view((2, 2)) == Layout((2, 2), (10, 5), 2)
    assert Layout((3,), (0,), 0).view((1, 3)) is not None
    assert Layout((2, 3), (0, 1), 0).view((6,)) is None
    assert Layout((2, 3), (0, 0), 0).view((6,)) == Layout((6,), (0,), 0)
    assert Layout((0, 3), (1, 0), 0).view((3, 0)) is not None


def test_contiguous_strides() -> None:
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert Layout.contiguous([2, 3]) == Layout((2, 3), (3, 1), 0)  # any sequence of sizes
    assert contiguous_strides(()) == ()
    assert contiguous_strides((3, 0, 2)) == (2, 2, 1)  # size-0 dims count as 1, as in PyTorch
    assert Layout.contiguous((2, 0, 3)).is_contiguous()
    assert Layout((2, 1, 3), (3, 99, 1)).is_contiguous()
    assert not Layout((2, 3), (1, 2)).is_contiguous()


def test_normalize_dim_and_broadcast() -> None:
    from braze.errors import DimOutOfRange, ShapeMismatch
    assert normalize_dim("op", -1, 3) == 2
    assert normalize_dim("op", 3, 3, extra=1) == 3
    assert normalize_dim("op", -1, 0) == 0 and normalize_dim("op", 0, 0) == 0
    with pytest.raises(DimOutOfRange):
        normalize_dim("op", 3, 3)
    with pytest.raises(DimOutOfRange):
        normalize_dim("op", -4, 3)
    with pytest.raises(DimOutOfRange):
        normalize_dim("op", True, 3)
    assert broadcast_shapes("op", (3, 1), (4,), ()) == (3, 4)
    assert broadcast_shapes("op", (0, 1), (1, 5)) == (0, 5)
    with pytest.raises(ShapeMismatch) as info:
        broadcast_shapes("add", (2, 3), (4,))
    assert "add" in str(info.value) and "(2, 3)" in str(info.value) and "(4,)" in str(info.value)
