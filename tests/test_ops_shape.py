"""Creation, matmul, joining/splitting, indexing and padding ops against numpy:
tensor/from_numpy/zeros/ones/full/empty/arange/linspace/rand/randn and the *_like forms;
matmul and @ (batch broadcasting, 1-D operands); cat, stack, split, chunk, gather,
index_select, masked_fill, tril/triu, one_hot, pad (all modes, negative pads) and
__getitem__ with ints, slices, steps, None, Ellipsis, int tensors and bool masks.

Inputs are random strided views (``strategies.tensors``); tolerances in ``strategies.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import braze
from braze import (DimOutOfRange, DtypeMismatch, IndexOutOfRange, RankMismatch, ShapeMismatch,
                   Unsupported)

from strategies import (ALL, FAST, FLOATS, INTS, assert_close, ids, make_values, oracle, scalar_for, shapes,
                        small, tensors)

# -- creation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(shape=shapes(max_dims=3), seed=st.integers(0, 2**31))
def test_full_zeros_ones(d, shape, seed):
    v = scalar_for(d, seed)
    assert_close(braze.full(shape, v, dtype=d), np.full(shape, np.asarray(v).astype(d.np)), d)
    assert_close(braze.zeros(shape, dtype=d), np.zeros(shape, d.np), d)
    assert_close(braze.ones(*shape, dtype=d), np.ones(shape, d.np), d)
    x = braze.tensor(make_values(seed, d, int(np.prod(shape)), "small").reshape(shape))
    assert_close(braze.zeros_like(x), np.zeros(shape, d.np), d)
    assert_close(braze.ones_like(x), np.ones(shape, d.np), d)
    assert_close(braze.full_like(x, v), np.full(shape, np.asarray(v).astype(d.np)), d)
    e = braze.empty(shape, dtype=d)
    assert e.shape == tuple(shape) and e.dtype is d and e.numpy().shape == tuple(shape)
    e = braze.empty_like(x)
    assert e.shape == tuple(shape) and e.dtype is d
    assert braze.zeros_like(x, dtype=braze.float64).dtype is braze.float64


def test_creation_defaults_and_errors():
    assert braze.zeros(2, 3).dtype is braze.float32 and braze.zeros(2, 3).shape == (2, 3)
    assert braze.zeros(()).shape == ()
    assert braze.empty(0, 4).shape == (0, 4)
    assert braze.full((2,), 7).dtype is braze.int64
    assert braze.full((2,), 7.5).dtype is braze.float32
    assert braze.full((2,), True).dtype is braze.bool_
    with pytest.raises(DtypeMismatch):
        braze.full((2,), 1.5, dtype=braze.int32)
    with pytest.raises(DtypeMismatch):
        braze.full((2,), 2, dtype=braze.bool_)
    with pytest.raises(ShapeMismatch):
        braze.zeros(-1)


@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(shape=shapes(max_dims=3), seed=st.integers(0, 2**31))
def test_tensor_and_from_numpy(d, shape, seed):
    a = make_values(seed, d, int(np.prod(shape)), "any").reshape(shape)
    t = braze.tensor(a)
    assert_close(t, a, d)
    assert not np.shares_memory(t.numpy(), a) or a.size == 0
    f = braze.from_numpy(a)
    assert_close(f, a, d)
    if a.size:  # from_numpy shares memory both ways
        a.reshape(-1)[0] = a.reshape(-1)[-1]
        assert_close(f, a, d)
    if a.size == 0:
        return  # nested lists cannot spell an empty shape such as (0, 2)
    # nested lists round-trip with an explicit dtype
    lst = a.astype(np.float32).tolist() if d.is_half else a.tolist()
    assert_close(braze.tensor(lst, dtype=d), a, d)


def test_tensor_infers_dtypes():
    assert braze.tensor([1, 2]).dtype is braze.int64
    assert braze.tensor([1.0, 2]).dtype is braze.float32
    assert braze.tensor([True, False]).dtype is braze.bool_
    assert braze.tensor(3.0).shape == () and braze.tensor(3.0).item() == 3.0
    assert braze.tensor([]).shape == (0,)
    assert braze.tensor(np.zeros(3, np.float16)).dtype is braze.float16
    with pytest.raises(Unsupported):
        braze.from_numpy(np.zeros(3, np.complex64))


@pytest.mark.parametrize("d", [braze.float32, braze.float64, braze.int64, braze.int32, braze.int8,
                               braze.float16, braze.bfloat16], ids=ids)
@FAST
@given(start=st.integers(-20, 20), n=st.integers(0, 30), step=st.integers(-4, 4).filter(bool),
       frac=st.sampled_from([0.0, 0.5, 0.25]))
def test_arange(d, start, n, step, frac):
    if d.is_integer:
        frac = 0.0
    if d in (braze.int8,) and (abs(start) + n * abs(step) > 120):
        n = 5
    s, st_ = start + frac, step * (1 if not frac else 0.5)
    end = s + n * st_ if frac or not d.is_integer else start + n * step
    if frac:
        got, want = braze.arange(s, end, st_, dtype=d), np.arange(s, end, st_, dtype=np.float64)
    else:
        got, want = braze.arange(start, end, step, dtype=d), np.arange(start, end, step, dtype=np.int64)
    assert_close(got, want.astype(d.np), d)


def test_arange_defaults():
    assert braze.arange(5).dtype is braze.int64 and braze.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert braze.arange(0, 1, 0.25).dtype is braze.float32
    assert braze.arange(0, 1, 0.25).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert braze.arange(5, 0, -2).tolist() == [5, 3, 1]
    assert braze.arange(3, 3).shape == (0,)
    with pytest.raises(Unsupported):
        braze.arange(0, 5, 0)


@pytest.mark.parametrize("d", FLOATS, ids=ids)
@FAST
@given(start=st.floats(-100, 100), end=st.floats(-100, 100), steps=st.integers(0, 40))
def test_linspace(d, start, end, steps):
    got = braze.linspace(start, end, steps, dtype=d)
    assert_close(got, np.linspace(start, end, steps, dtype=np.float64).astype(d.np), d, "reduce",
                 scale=max(abs(start), abs(end)))


@pytest.mark.parametrize("d", FLOATS, ids=ids)
@pytest.mark.parametrize("fn", ["rand", "randn"])
def test_random_seeded_and_generator(d, fn):
    f = getattr(braze, fn)
    braze.manual_seed(1234)
    a = f(3, 400, dtype=d).numpy().copy()
    braze.manual_seed(1234)
    b = f((3, 400), dtype=d).numpy().copy()
    np.testing.assert_array_equal(a, b)
    g1, g2 = braze.Generator(7), braze.Generator(7)
    np.testing.assert_array_equal(f(50, generator=g1, dtype=d).numpy(), f(50, generator=g2, dtype=d).numpy())
    assert not np.array_equal(f(50, generator=g1, dtype=d).numpy(), f(50, generator=braze.Generator(8),
                                                                     dtype=d).numpy())
    g1.manual_seed(7)
    np.testing.assert_array_equal(f(50, generator=g1, dtype=d).numpy(), f(50, generator=braze.Generator(7),
                                                                          dtype=d).numpy())
    assert a.dtype == d.np and a.shape == (3, 400)
    x = a.astype(np.float64)
    assert np.isfinite(x).all()
    if fn == "rand":
        big = f(20000, dtype=d, generator=braze.Generator(3)).numpy().astype(np.float64)
        assert big.min() >= 0.0 and big.max() < 1.0, "rand is uniform on [0, 1)"
        assert abs(big.mean() - 0.5) < 0.02
    else:
        big = f(20000, dtype=d, generator=braze.Generator(3)).numpy().astype(np.float64)
        assert abs(big.mean()) < 0.05 and abs(big.std() - 1) < 0.05
    like = getattr(braze, fn + "_like")(braze.zeros(2, 5, dtype=d))
    assert like.shape == (2, 5) and like.dtype is d
    assert f(0, 3, dtype=d).shape == (0, 3) and f(dtype=d).shape == ()


def test_random_rejects_int_dtype():
    for f in (braze.rand, braze.randn):
        with pytest.raises(DtypeMismatch):
            f(3, dtype=braze.int32)


# -- matmul ------------------------------------------------------------------------------------------

MATMUL = FLOATS + INTS


@st.composite
def matmul_shapes(draw):
    m, k, n = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(0, 4))
    kind = draw(st.sampled_from(["2d", "batch", "batch", "1d-left", "1d-right", "1d-both"]))
    if kind == "1d-both":
        return (k,), (k,)
    ba, bb = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, min_side=0, max_side=3)).input_shapes
    if kind == "2d":
        ba = bb = ()
    a = (k,) if kind == "1d-left" else ba + (m, k)
    b = (k,) if kind == "1d-right" else bb + (k, n)
    return a, b


@pytest.mark.parametrize("d", MATMUL, ids=ids)
@FAST
@given(data=st.data(), sh=matmul_shapes(), spelling=st.sampled_from(["@", "fn", "method"]))
def test_matmul(d, data, sh, spelling):
    dom = "small"
    a = data.draw(tensors(d, sh[0], domain=dom), label="a")
    b = data.draw(tensors(d, sh[1], domain=dom), label="b")
    got = {"@": lambda: a.t @ b.t, "fn": lambda: braze.matmul(a.t, b.t), "method": lambda: a.t.matmul(b.t)}[spelling]()
    if d.is_integer:
        assert_close(got, np.matmul(a.a.astype(np.int64), b.a.astype(np.int64)).astype(d.np), d)
    else:
        scale = np.matmul(np.abs(a.a.astype(np.float64)), np.abs(b.a.astype(np.float64)))
        assert_close(got, oracle(np.matmul, [a.a, b.a], d), d, "reduce", scale=scale)


def test_matmul_errors():
    x = small(braze.float32, (2, 3))
    with pytest.raises(ShapeMismatch):
        x @ x
    with pytest.raises(RankMismatch):
        braze.matmul(braze.tensor(1.0), x)
    with pytest.raises(DtypeMismatch):
        x @ small(braze.float64, (3, 2))
    with pytest.raises(DtypeMismatch):
        small(braze.bool_, (2, 3)) @ small(braze.bool_, (3, 2))
    with pytest.raises(ShapeMismatch):
        small(braze.float32, (2, 2, 3)) @ small(braze.float32, (3, 3, 2))


# -- cat, stack, split, chunk -----------------------------------------------------------------------------

@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), base=shapes(min_dims=1, max_dims=3, max_side=4), count=st.integers(1, 3))
def test_cat_stack(d, data, base, count):
    dim = data.draw(st.integers(-len(base), len(base) - 1))
    parts = []
    for _ in range(count):
        sh = list(base)
        sh[dim] = data.draw(st.integers(0, 3))
        parts.append(data.draw(tensors(d, tuple(sh))))
    assert_close(braze.cat([p.t for p in parts], dim), np.concatenate([p.a for p in parts], axis=dim), d)
    same = [data.draw(tensors(d, base)) for _ in range(count)]
    sdim = data.draw(st.integers(-len(base) - 1, len(base)))
    assert_close(braze.stack([p.t for p in same], sdim), np.stack([p.a for p in same], axis=sdim), d)


def test_cat_stack_errors():
    a, b = small(braze.float32, (2, 3)), small(braze.float32, (3, 3))
    with pytest.raises(ShapeMismatch):
        braze.cat([a, b], 1)
    with pytest.raises(ShapeMismatch):
        braze.stack([a, b])
    with pytest.raises(DimOutOfRange):
        braze.cat([a, a], 2)
    with pytest.raises(ShapeMismatch):
        braze.cat([])


@pytest.mark.parametrize("d", [braze.float32, braze.int8, braze.bool_, braze.bfloat16], ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, max_side=7))
def test_split_chunk(d, data, shape):
    p = data.draw(tensors(d, shape))
    a = p.a
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    n = a.shape[dim]
    size = data.draw(st.integers(1, 8))
    bounds = list(range(size, n, size))
    want = np.split(a, bounds, axis=dim) if n else [a]
    got = p.t.split(size, dim)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, d)
    sizes = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=4))
    sizes[-1] = n - sum(sizes[:-1])
    if sizes[-1] >= 0:
        got = braze.tensor(a).split(sizes, dim)
        for g, w in zip(got, np.split(a, np.cumsum(sizes)[:-1], axis=dim)):
            assert_close(g, w, d)
    else:
        with pytest.raises(ShapeMismatch):
            p.t.split(sizes, dim)
    chunks = data.draw(st.integers(1, 8))
    csize = -(-n // chunks) if n else 1  # PyTorch: chunks of ceil(n / chunks), maybe fewer chunks
    want = np.split(a, list(range(csize, n, csize)), axis=dim) if n else [a]
    got = p.t.chunk(chunks, dim)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, d)


# -- gather, index_select, masked_fill ------------------------------------------------------------------

@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
       idt=st.sampled_from([braze.int64, braze.int32]))
def test_gather(d, data, shape, idt):
    p = data.draw(tensors(d, shape))
    a = p.a
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    ishape = tuple(data.draw(st.integers(0, 5)) if i == dim % a.ndim else data.draw(st.integers(0, n))
                   for i, n in enumerate(a.shape))
    idx = np.asarray(data.draw(hnp.arrays(np.int64, ishape, elements=st.integers(0, a.shape[dim] - 1))))
    got = braze.gather(p.t, dim, braze.tensor(idx.astype(idt.np)))
    sub = a[tuple(slice(0, m) if i != dim % a.ndim else slice(None) for i, m in enumerate(ishape))]
    assert_close(got, np.take_along_axis(sub, idx, axis=dim), d)
    assert_close(p.t.gather(dim, braze.tensor(idx)), np.take_along_axis(sub, idx, axis=dim), d)
    if a.shape[dim] and idx.size:
        bad = idx.copy()
        bad.reshape(-1)[0] = a.shape[dim]
        with pytest.raises(IndexOutOfRange):
            braze.gather(p.t, dim, braze.tensor(bad))


@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, min_side=0, max_side=4),
       idt=st.sampled_from([braze.int64, braze.int32]))
def test_index_select(d, data, shape, idt):
    p = data.draw(tensors(d, shape))
    a = p.a
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    n = a.shape[dim]
    k = data.draw(st.integers(0, 5)) if n else 0
    idx = np.asarray(data.draw(hnp.arrays(np.int64, (k,), elements=st.integers(0, max(n - 1, 0)))))
    ip = data.draw(tensors(idt, (k,), domain="nonneg"))  # a strided index tensor
    ivals = ip.a % max(n, 1)
    it = braze.remainder(ip.t, max(n, 1)) if n else ip.t
    assert_close(braze.index_select(p.t, dim, braze.tensor(idx.astype(idt.np))), np.take(a, idx, axis=dim), d)
    if n:
        assert_close(p.t.index_select(dim, it), np.take(a, ivals.astype(np.int64), axis=dim), d)
    with pytest.raises(DtypeMismatch):
        braze.index_select(p.t, dim, braze.tensor(idx.astype(np.float32)))
    with pytest.raises(IndexOutOfRange):
        braze.index_select(p.t, dim, braze.tensor([n]))


@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), shapes_=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=0, max_side=4),
       as_tensor=st.booleans())
def test_masked_fill(d, data, shapes_, as_tensor):
    xs, ms = shapes_.input_shapes
    full = shapes_.result_shape
    if len(ms) > len(full) or np.broadcast_shapes(xs, ms) != xs:
        xs = full  # the mask must broadcast to the input's shape
    p = data.draw(tensors(d, xs))
    m = data.draw(tensors(braze.bool_, ms))
    v = scalar_for(d, data.draw(st.integers(0, 2**31)))
    vv = np.asarray(v).astype(d.np)
    value = braze.tensor(vv) if as_tensor else v
    got = p.t.masked_fill(m.t, value) if data.draw(st.booleans()) else braze.masked_fill(p.t, m.t, value)
    assert_close(got, np.where(m.a, vv, p.a), d)


def test_masked_fill_rules():
    x = small(braze.float32, (2, 3))
    with pytest.raises(DtypeMismatch):
        x.masked_fill(small(braze.int64, (2, 3)), 0.0)
    with pytest.raises(ShapeMismatch):
        x.masked_fill(small(braze.bool_, (4, 2, 3)), 0.0)
    with pytest.raises(DtypeMismatch):
        small(braze.int32).masked_fill(small(braze.bool_), 0.5)


# -- tril, triu, one_hot --------------------------------------------------------------------------------

@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=4, max_side=5), diagonal=st.integers(-6, 6))
def test_tril_triu(d, data, shape, diagonal):
    p = data.draw(tensors(d, shape))
    assert_close(braze.tril(p.t, diagonal), np.tril(p.a, diagonal), d)
    assert_close(p.t.triu(diagonal), np.triu(p.a, diagonal), d)
    assert_close(braze.triu(p.t), np.triu(p.a), d)


def test_tril_needs_2d():
    with pytest.raises(RankMismatch):
        braze.tril(braze.ones(3))


@pytest.mark.parametrize("d", INTS, ids=ids)
@FAST
@given(data=st.data(), shape=shapes(max_dims=3, max_side=4), classes=st.integers(1, 6))
def test_one_hot(d, data, shape, classes):
    idx = data.draw(tensors(d, shape, domain="nonneg"))
    vals = idx.a.astype(np.int64) % classes
    t = braze.remainder(idx.t, classes)
    got = braze.one_hot(t, classes)
    assert_close(got, (vals[..., None] == np.arange(classes)).astype(np.int64), braze.int64)
    if vals.size:
        auto = braze.one_hot(braze.tensor(vals.astype(d.np)))
        assert_close(auto, (vals[..., None] == np.arange(vals.max() + 1)).astype(np.int64), braze.int64)
        with pytest.raises(IndexOutOfRange):
            braze.one_hot(braze.tensor(vals.astype(d.np)), int(vals.max()))


def test_one_hot_rejects_floats_and_negatives():
    with pytest.raises(DtypeMismatch):
        braze.one_hot(braze.tensor([0.0, 1.0]), 3)
    with pytest.raises(IndexOutOfRange):
        braze.one_hot(braze.tensor([0, -1]), 3)


# -- pad ----------------------------------------------------------------------------------------------

def _np_pad(a, pad, mode, value):
    pairs = [(0, 0)] * a.ndim
    for i in range(len(pad) // 2):
        pairs[a.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    # negative amounts crop first
    crop = tuple(slice(-min(lo, 0), a.shape[d] + min(hi, 0)) for d, (lo, hi) in enumerate(pairs))
    a = a[crop]
    pos = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if mode == "constant":
        return np.pad(a, pos, mode="constant", constant_values=np.asarray(value).astype(a.dtype))
    return np.pad(a, pos, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))
def test_pad(d, mode, data, shape):
    p = data.draw(tensors(d, shape))
    a = p.a
    npairs = data.draw(st.integers(1, a.ndim))
    pad = []
    for i in range(npairs):
        n = a.shape[a.ndim - 1 - i]
        if mode == "constant":
            lo = data.draw(st.integers(-n, 3))
            hi = data.draw(st.integers(-(n + min(lo, 0)), 3))
        else:
            limit = {"reflect": n - 1, "replicate": 6 if n else 0, "circular": n}[mode]
            lo, hi = data.draw(st.integers(0, max(limit, 0))), data.draw(st.integers(0, max(limit, 0)))
        pad += [lo, hi]
    v = scalar_for(d, data.draw(st.integers(0, 2**31)))
    got = braze.pad(p.t, pad, mode=mode, value=v) if mode == "constant" else braze.pad(p.t, pad, mode=mode)
    assert_close(got, _np_pad(a, pad, mode, v), d)


def test_pad_errors():
    x = small(braze.float32, (2, 3))
    with pytest.raises(ShapeMismatch):
        braze.pad(x, [1])
    with pytest.raises(ShapeMismatch):
        braze.pad(x, [3, 0], mode="reflect")
    with pytest.raises(ShapeMismatch):
        braze.pad(x, [4, 0], mode="circular")
    with pytest.raises(ShapeMismatch):
        braze.pad(x, [-2, -2])
    with pytest.raises(Unsupported):
        braze.pad(x, [1, 1], mode="wrap")
    with pytest.raises(DtypeMismatch):
        braze.pad(small(braze.int32), [1, 1], value=0.5)


# -- __getitem__ ------------------------------------------------------------------------------------------

@st.composite
def basic_index(draw, shape):
    """A tuple of ints, slices (with steps), None and at most one Ellipsis for ``shape``."""
    items = []
    dims = list(shape)
    use_ellipsis = draw(st.booleans())
    n_real = draw(st.integers(0, len(dims)))
    ell_at = draw(st.integers(0, n_real)) if use_ellipsis else -1
    consumed = 0
    for k in range(n_real + 1):
        if k == ell_at:
            items.append(Ellipsis)
        if k == n_real:
            break
        if draw(st.integers(0, 4)) == 0:
            items.append(None)
        # which dim this item indexes: from the front before the ellipsis, else from the back
        dsize = dims[consumed] if ell_at < 0 or k < ell_at else dims[len(dims) - (n_real - k)]
        consumed += 1
        kind = draw(st.sampled_from(["int", "slice", "slice", "full"]))
        if kind == "int" and dsize:
            items.append(draw(st.integers(-dsize, dsize - 1)))
        elif kind == "full":
            items.append(slice(None))
        else:
            lo = draw(st.none() | st.integers(-dsize - 2, dsize + 2))
            hi = draw(st.none() | st.integers(-dsize - 2, dsize + 2))
            step = draw(st.none() | st.integers(1, 3))
            items.append(slice(lo, hi, step))
    if draw(st.booleans()):
        items.append(None) if len(items) < 6 else None
    return tuple(items)


@pytest.mark.parametrize("d", [braze.float32, braze.int16, braze.bool_, braze.bfloat16], ids=ids)
@FAST
@given(data=st.data(), shape=shapes(max_dims=4, max_side=5))
def test_getitem_basic(d, data, shape):
    p = data.draw(tensors(d, shape))
    idx = data.draw(basic_index(shape))
    got = p.t[idx]
    assert got.shares_storage(p.t), "basic indexing is a view"
    assert_close(got, p.a[idx], d)
    if len(idx) == 1:
        assert_close(p.t[idx[0]], p.a[idx[0]], d)


@pytest.mark.parametrize("d", [braze.float32, braze.int64, braze.bool_, braze.float16], ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, max_side=5), idt=st.sampled_from(["i64", "i32", "list"]))
def test_getitem_int_tensor(d, data, shape, idt):
    p = data.draw(tensors(d, shape))
    a = p.a
    dim = data.draw(st.integers(0, a.ndim - 1))
    n = a.shape[dim]
    ishape = data.draw(shapes(max_dims=2, max_side=4)) if n else (0,)
    idx = np.asarray(data.draw(hnp.arrays(np.int64, ishape, elements=st.integers(-n, max(n - 1, 0))))) if n \
        else np.zeros((0,), np.int64)
    index = idx.tolist() if idt == "list" and idx.ndim == 1 else braze.tensor(idx.astype(np.int32 if idt == "i32"
                                                                                             else np.int64))
    lead = (slice(None),) * dim
    assert_close(p.t[lead + (index,)], a[lead + (idx,)], d)
    if n:
        with pytest.raises(IndexOutOfRange):
            p.t[lead + (braze.tensor([n]),)]


@pytest.mark.parametrize("d", [braze.float32, braze.uint8, braze.bool_], ids=ids)
@FAST
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, max_side=4))
def test_getitem_bool_mask(d, data, shape):
    p = data.draw(tensors(d, shape))
    a = p.a
    start = data.draw(st.integers(0, a.ndim - 1))
    k = data.draw(st.integers(1, a.ndim - start))
    m = data.draw(tensors(braze.bool_, a.shape[start:start + k]))
    lead = (slice(None),) * start
    assert_close(p.t[lead + (m.t,)], a[lead + (m.a,)], d)
    if a.ndim == k and start == 0:
        assert_close(p.t[m.t], a[m.a], d)


def test_getitem_errors():
    x = small(braze.float32, (2, 3))
    with pytest.raises(IndexOutOfRange):
        x[2]
    with pytest.raises(IndexOutOfRange):
        x[:, -4]
    with pytest.raises(DimOutOfRange):
        x[0, 0, 0]
    with pytest.raises(Unsupported):
        x[::-1]
    with pytest.raises(Unsupported):
        x[..., ...]
    with pytest.raises(ShapeMismatch):
        x[braze.tensor([True, False, True])]
    with pytest.raises(DtypeMismatch):
        x[braze.tensor([0.0])]
