"""Reductions, scans and orderings against numpy: sum, mean, max/min (values and
indices), amax, amin, prod, argmax, argmin, var/std (correction 0 and 1), any, all,
logsumexp, softmax, log_softmax, cumsum, sort/argsort (stable, descending, NaN), topk.

Dims are None, an int (negative too) or a tuple in any order, with and without
``keepdim``, on random strided views of every dtype each op supports, including 0-d
tensors and size-0 dims. Tolerances are in ``strategies.py``; sums compare with an
absolute tolerance scaled by the sum of magnitudes (the order of a float sum is the
implementation's business).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import braze
from braze import DtypeMismatch, ShapeMismatch

from strategies import (ALL, BOOL, FAST, FLOATS, INTS, NUMERIC, assert_close, ids, oracle, small, tensors,
                        up)

RSHAPES = dict(max_dims=4, max_side=4)


@st.composite
def dims_for(draw, ndim: int, allow_none: bool = True, allow_tuple: bool = True):
    """None, an int in [-ndim, ndim) (0 and -1 for a 0-d tensor), or a tuple of distinct
    dims in random order and signs."""
    kinds = (["none"] if allow_none else []) + ["int"] + (["tuple"] if allow_tuple and ndim else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1))
    picked = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(p - ndim if draw(st.booleans()) else p for p in picked)


def np_axis(dim, ndim: int) -> tuple[int, ...]:
    if ndim == 0:
        return ()
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted(d % ndim for d in dim))


def reduced_numel(shape, axis) -> int:
    return int(np.prod([shape[a] for a in axis], dtype=np.int64))


def _abs_sum(a, axis, keepdim):
    with np.errstate(all="ignore"):
        x = np.abs(a.astype(np.float64))
        x = np.where(np.isfinite(x), x, 0)
        return np.sum(x, axis=axis, keepdims=keepdim)


def _call(fn, t, dim, keepdim, **kw):
    """Exercise both spellings: positional dim and the keyword, method and function."""
    if dim is None and not keepdim:
        return fn(t, **kw)
    return fn(t, dim, keepdim, **kw) if kw else fn(t, dim=dim, keepdim=keepdim)


# -- sum, prod, mean ---------------------------------------------------------------------------------

ACC = {"sum": np.sum, "prod": np.prod}


@pytest.mark.parametrize("name", ["sum", "prod"])
@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans())
def test_sum_prod(name, d, data, keepdim):
    domain = "small" if (d.is_half or name == "prod") else "any"
    if name == "prod" and d.is_floating_point:
        domain = "unit"
    p = data.draw(tensors(d, domain=domain, **RSHAPES))
    dim = data.draw(dims_for(p.a.ndim))
    axis = np_axis(dim, p.a.ndim)
    fn = braze.sum if name == "sum" else braze.prod
    got = fn(p.t, dim, keepdim) if dim is not None or keepdim else getattr(p.t, name)()
    out = d if d.is_floating_point else braze.int64
    if d.is_floating_point:
        expected = oracle(lambda x: ACC[name](x, axis=axis, keepdims=keepdim), [p.a], d)
        scale = _abs_sum(p.a, axis, keepdim) if name == "sum" else None
        assert_close(got, expected, out, "reduce", scale=scale)
    else:
        expected = ACC[name](p.a.astype(np.int64), axis=axis, keepdims=keepdim)
        assert_close(got, expected, braze.int64)


@pytest.mark.parametrize("d", FLOATS, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans())
def test_mean(d, data, keepdim):
    p = data.draw(tensors(d, domain="small" if d.is_half else "any", **RSHAPES))
    dim = data.draw(dims_for(p.a.ndim))
    axis = np_axis(dim, p.a.ndim)
    n = reduced_numel(p.a.shape, axis)

    def ref(x):
        s = np.sum(x, axis=axis, keepdims=keepdim)
        return s / n if n else np.full_like(s, np.nan)
    got = braze.mean(p.t, dim, keepdim) if dim is not None or keepdim else p.t.mean()
    scale = _abs_sum(p.a, axis, keepdim) / max(n, 1)
    assert_close(got, oracle(ref, [p.a], d), d, "reduce", scale=scale)


@pytest.mark.parametrize("d", INTS + BOOL, ids=ids)
def test_float_only_reductions_reject_ints(d):
    x = small(d)
    for fn in (braze.mean, braze.var, braze.std, lambda t: braze.softmax(t, -1), lambda t: braze.log_softmax(t, -1)):
        with pytest.raises(DtypeMismatch):
            fn(x)
    # PyTorch's logsumexp takes integers, in the default float dtype
    want = np.log(np.exp(x.numpy().astype(np.float64)).sum(-1))
    assert_close(braze.logsumexp(x, -1), want.astype(np.float32), braze.float32, "transc")


def test_sum_dtype_argument_and_bool_sum():
    x = braze.tensor([[True, False, True], [True, True, True]])
    s = x.sum(1)
    assert s.dtype is braze.int64 and s.tolist() == [2, 3]
    y = braze.tensor([[1, 2], [3, 4]], dtype=braze.int8)
    assert braze.sum(y, dtype=braze.float32).dtype is braze.float32
    assert braze.sum(y).tolist() == 10 and braze.sum(y).dtype is braze.int64
    assert braze.prod(y).tolist() == 24 and braze.prod(y).dtype is braze.int64


# -- max/min/amax/amin/argmax/argmin --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans(), domain=st.sampled_from(["any", "ties"]))
def test_amax_amin(name, d, data, keepdim, domain):
    p = data.draw(tensors(d, domain=domain, **RSHAPES))
    dim = data.draw(dims_for(p.a.ndim))
    axis = np_axis(dim, p.a.ndim)
    fn = getattr(braze, name)
    if any(p.a.shape[a] == 0 for a in axis) or (p.a.size == 0 and dim is None):
        with pytest.raises(ShapeMismatch):
            _call(fn, p.t, dim, keepdim)
        return
    npfn = np.max if name == "amax" else np.min
    expected = oracle(lambda x: npfn(x, axis=axis, keepdims=keepdim), [p.a], d)
    assert_close(_call(fn, p.t, dim, keepdim), expected, d)


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans(), domain=st.sampled_from(["any", "ties"]))
def test_max_min(name, d, data, keepdim, domain):
    """With dim: (values, indices), ties give the first index, NaN wins; without: a value."""
    p = data.draw(tensors(d, domain=domain, **RSHAPES))
    a = p.a
    npfn, argfn = (np.max, np.argmax) if name == "max" else (np.min, np.argmin)
    dim = data.draw(st.none() | st.integers(-max(a.ndim, 1), max(a.ndim, 1) - 1))
    fn = getattr(braze, name)
    method = getattr(p.t, name)
    if dim is None:
        if a.size == 0:
            with pytest.raises(ShapeMismatch):
                fn(p.t)
            return
        assert_close(method(), oracle(npfn, [a], d), d)
        return
    if a.ndim and a.shape[dim] == 0:
        with pytest.raises(ShapeMismatch):
            fn(p.t, dim)
        return
    r = method(dim, keepdim) if keepdim else fn(p.t, dim=dim)
    values, indices = r
    assert r.values is values and r.indices is indices
    if a.ndim == 0:
        assert_close(values, a, d)
        assert_close(indices, np.zeros((), np.int64), braze.int64)
        return
    assert_close(values, oracle(lambda x: npfn(x, axis=dim, keepdims=keepdim), [a], d), d)
    assert_close(indices, argfn(up(a, d), axis=dim, keepdims=keepdim), braze.int64)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans(), domain=st.sampled_from(["any", "ties"]))
def test_argmax_argmin(name, d, data, keepdim, domain):
    p = data.draw(tensors(d, domain=domain, **RSHAPES))
    a = p.a
    dim = data.draw(st.none() | st.integers(-max(a.ndim, 1), max(a.ndim, 1) - 1))
    fn = getattr(braze, name)
    argfn = np.argmax if name == "argmax" else np.argmin
    empty = a.size == 0 if dim is None else (a.ndim > 0 and a.shape[dim] == 0)
    if empty:
        with pytest.raises(ShapeMismatch):
            fn(p.t, dim, keepdim)
        return
    got = fn(p.t, dim, keepdim)
    if dim is None or a.ndim == 0:
        expected = argfn(up(a, d).reshape(-1))
        expected = np.reshape(expected, (1,) * a.ndim if keepdim else ())
    else:
        expected = argfn(up(a, d), axis=dim, keepdims=keepdim)
    assert_close(got, expected, braze.int64)


def test_argmax_ties_and_nan():
    x = braze.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0]])
    assert x.argmax(1).tolist() == [1, 0]
    assert x.argmin(1).tolist() == [0, 0]
    v, i = x.max(1)
    assert math.isnan(v.tolist()[1]) and i.tolist() == [1, 0]
    assert math.isnan(x.max().item()) and math.isnan(x.amin().item())
    assert braze.tensor([2, 7, 7, 1]).argmax().item() == 1


# -- var, std ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("d", FLOATS, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans(), correction=st.sampled_from([0, 1]), unbiased_kw=st.booleans())
def test_var_std(name, d, data, keepdim, correction, unbiased_kw):
    p = data.draw(tensors(d, domain="small" if d.is_half else "any", **RSHAPES))
    dim = data.draw(dims_for(p.a.ndim))
    axis = np_axis(dim, p.a.ndim)
    n = reduced_numel(p.a.shape, axis)

    def ref(x):
        x = x.astype(np.float64)
        m = np.mean(x, axis=axis, keepdims=True) if n else 0.0
        v = np.sum((x - m) ** 2, axis=axis, keepdims=keepdim) / max(n - correction, 0)
        return np.sqrt(v) if name == "std" else v
    fn = getattr(braze, name)
    if unbiased_kw:
        got = fn(p.t, dim, keepdim, unbiased=bool(correction))
    else:
        got = fn(p.t, dim, keepdim, correction=correction)
    assert_close(got, oracle(ref, [p.a], d), d, "reduce")


# -- any, all ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans())
def test_any_all(name, d, data, keepdim):
    p = data.draw(tensors(d, domain="ties", **RSHAPES))
    dim = data.draw(dims_for(p.a.ndim))
    axis = np_axis(dim, p.a.ndim)
    npfn = np.any if name == "any" else np.all
    expected = npfn(up(p.a, d), axis=axis, keepdims=keepdim)
    assert_close(_call(getattr(braze, name), p.t, dim, keepdim), expected, braze.bool_)


# -- logsumexp, softmax, log_softmax ----------------------------------------------------------------------

def _lse64(x, axis, keepdims):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if reduced_numel(x.shape, axis) == 0:
            return np.full(np.sum(x, axis=axis, keepdims=keepdims).shape, -np.inf)
        m = np.max(x, axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
        return out if keepdims else np.squeeze(out, axis=axis)


@pytest.mark.parametrize("d", FLOATS, ids=ids)
@FAST
@given(data=st.data(), keepdim=st.booleans())
def test_logsumexp(d, data, keepdim):
    p = data.draw(tensors(d, **RSHAPES))
    dim = data.draw(dims_for(p.a.ndim, allow_none=False))
    axis = np_axis(dim, p.a.ndim)
    got = braze.logsumexp(p.t, dim, keepdim)
    with np.errstate(all="ignore"):
        scale = np.max(np.abs(np.where(np.isfinite(p.a.astype(np.float64)), p.a.astype(np.float64), 0)),
                       initial=0.0)
    assert_close(got, oracle(lambda x: _lse64(x, axis, keepdim), [p.a], d), d, "reduce", scale=scale)


def test_logsumexp_infinities():
    x = braze.tensor([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 0.0], [0.0, 0.0]])
    got = braze.logsumexp(x, 1).numpy()
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2])
    assert abs(got[3] - math.log(2)) < 1e-6


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("d", FLOATS, ids=ids)
@FAST
@given(data=st.data(), domain=st.sampled_from(["any", "finite", "small"]))
def test_softmax(name, d, data, domain):
    p = data.draw(tensors(d, domain=domain, **RSHAPES))
    a = p.a
    dim = data.draw(st.integers(-max(a.ndim, 1), max(a.ndim, 1) - 1))
    axis = np_axis(dim, a.ndim)

    def ref(x):
        # PyTorch's formulas, in float64: shift by the max (nan/inf propagate as they do there)
        x = x.astype(np.float64)
        if x.size == 0:
            return x
        s = x - np.max(x, axis=axis, keepdims=True)
        e = np.exp(s)
        return e / np.sum(e, axis=axis, keepdims=True) if name == "softmax" else \
            s - np.log(np.sum(e, axis=axis, keepdims=True))
    fn = getattr(braze, name)
    got = fn(p.t, dim) if data.draw(st.booleans()) else getattr(p.t, name)(dim)
    with np.errstate(all="ignore"):
        # half types round after each primitive (x - max, exp, sum, divide): a few ulp of |x|
        mag = np.abs(np.where(np.isfinite(a.astype(np.float64)), a.astype(np.float64), 0))
        scale = np.max(mag, axis=axis, keepdims=True, initial=0.0) if name == "log_softmax" else None
    assert_close(got, oracle(ref, [a], d), d, "reduce", scale=scale)


@pytest.mark.parametrize("d", [braze.float16, braze.bfloat16], ids=ids)
def test_softmax_dtype_argument(d):
    x = small(braze.float32, (3, 5))
    got = braze.softmax(x, -1, dtype=d)
    assert got.dtype is d
    e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
    np.testing.assert_allclose(got.numpy().astype(np.float32), e / e.sum(-1, keepdims=True), rtol=2e-2, atol=2e-2)


# -- cumsum ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data())
def test_cumsum(d, data):
    p = data.draw(tensors(d, domain="small" if d.is_half else "any", **RSHAPES))
    a = p.a
    dim = data.draw(st.integers(-max(a.ndim, 1), max(a.ndim, 1) - 1))
    got = braze.cumsum(p.t, dim) if data.draw(st.booleans()) else p.t.cumsum(dim)
    if a.ndim == 0:
        expected = a
    elif d.is_floating_point:
        expected = oracle(lambda x: np.cumsum(x, axis=dim), [a], d)
    else:
        expected = np.cumsum(a.astype(np.int64), axis=dim)
    out = d if d.is_floating_point else braze.int64
    scale = np.cumsum(np.abs(np.nan_to_num(a.astype(np.float64), posinf=0, neginf=0)), axis=dim) if a.ndim \
        and d.is_floating_point else None
    assert_close(got, expected, out, "reduce", scale=scale)


# -- sort, argsort, topk -------------------------------------------------------------------------------

def _stable_order(a: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """Python's stable sort row by row: NaN is larger than everything (last ascending,
    first descending), equal elements keep their order."""
    x = np.moveaxis(up(a, _dt_of(a)), dim, -1)
    rows = x.reshape(-1, x.shape[-1]) if x.size else np.zeros((0, x.shape[-1]))
    out = []
    for row in rows.tolist():
        def key(i):
            v = row[i]
            nan = isinstance(v, float) and math.isnan(v)
            if descending:
                return (0 if nan else 1, 0 if nan else -v)
            return (1 if nan else 0, 0 if nan else v)
        out.append(sorted(range(len(row)), key=key))
    idx = np.array(out, dtype=np.int64).reshape(x.shape)
    return np.moveaxis(idx, -1, dim)


def _dt_of(a):
    for d in ALL:
        if d.np == a.dtype:
            return d
    raise AssertionError(a.dtype)


@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), descending=st.booleans(), domain=st.sampled_from(["any", "ties"]))
def test_sort_argsort(d, data, descending, domain):
    p = data.draw(tensors(d, domain=domain, **RSHAPES))
    a = p.a
    dim = data.draw(st.integers(-max(a.ndim, 1), max(a.ndim, 1) - 1))
    values, indices = braze.sort(p.t, dim, descending=descending) if data.draw(st.booleans()) \
        else p.t.sort(dim=dim, descending=descending)
    if a.ndim == 0:
        assert_close(values, a, d)
        assert_close(indices, np.zeros((), np.int64), braze.int64)
        return
    order = _stable_order(a, dim, descending)
    assert_close(indices, order, braze.int64)
    assert_close(values, np.take_along_axis(a, order, axis=dim), d)
    assert_close(braze.argsort(p.t, dim, descending=descending), order, braze.int64)


def test_sort_descending_stable_nan_first():
    x = braze.tensor([1.0, float("nan"), 3.0, 1.0, float("nan"), 3.0])
    v, i = x.sort(descending=True)
    assert i.tolist() == [1, 4, 2, 5, 0, 3]
    v, i = x.sort()
    assert i.tolist() == [0, 3, 2, 5, 1, 4]


@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), largest=st.booleans(), domain=st.sampled_from(["any", "ties"]))
def test_topk(d, data, largest, domain):
    p = data.draw(tensors(d, domain=domain, min_dims=1, **RSHAPES))
    a = p.a
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    k = data.draw(st.integers(0, a.shape[dim]))
    values, indices = braze.topk(p.t, k, dim, largest=largest)
    order = np.take(_stable_order(a, dim, largest), np.arange(k), axis=dim)
    assert_close(indices, order, braze.int64)
    assert_close(values, np.take_along_axis(a, order, axis=dim), d)
    with pytest.raises(ShapeMismatch):
        braze.topk(p.t, a.shape[dim] + 1, dim)
