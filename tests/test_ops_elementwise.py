"""Element-wise ops against numpy: unary maths, binary arithmetic and comparisons with
broadcasting and Python scalars on either side, where, clamp; on random strided views of
every dtype each op supports, and DtypeMismatch for every dtype it does not.

Tolerances and the half-type oracle (float32, rounded back) are in ``strategies.py``.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import braze
from braze import DtypeMismatch, Unsupported

from strategies import (ALL, BOOL, FAST, FLOATS, INTS, NUMERIC, assert_close, broadcast_pair, build_view, ids,
                        make_values, oracle, scalar_for, small, tensors)

# -- unary -----------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f64(fn):
    """Composite ops ("precise" in braze) are specified by their float64 formula."""
    return lambda x: fn(x.astype(np.float64))


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


def _int_identity(fn):
    """floor/ceil/round of an integer is the integer itself (PyTorch, array API)."""
    return lambda x: x if x.dtype.kind in "iu" else fn(x)


# name -> (braze call, numpy oracle on the compute dtype, supported dtypes, value domain, tol class, out dtype)
UNARY = {
    "neg": (braze.neg, np.negative, FLOATS + [braze.int8, braze.int16, braze.int32, braze.int64], "any", "simple", None),
    "abs": (braze.abs, np.abs, NUMERIC, "any", "simple", None),
    "exp": (braze.exp, np.exp, FLOATS, "any", "transc", None),
    "log": (braze.log, np.log, FLOATS, "any", "transc", None),
    "sqrt": (braze.sqrt, np.sqrt, FLOATS, "any", "transc", None),
    "rsqrt": (braze.rsqrt, _f64(lambda x: 1.0 / np.sqrt(x)), FLOATS, "any", "transc", None),
    "reciprocal": (braze.reciprocal, lambda x: 1 / x, FLOATS, "any", "simple", None),
    "sin": (braze.sin, np.sin, FLOATS, "any", "transc", None),
    "cos": (braze.cos, np.cos, FLOATS, "any", "transc", None),
    "tanh": (braze.tanh, np.tanh, FLOATS, "any", "transc", None),
    "sigmoid": (braze.sigmoid, _f64(_sigmoid64), FLOATS, "any", "transc", None),
    "erf": (braze.erf, _f64(_erf), FLOATS, "any", "transc", None),
    "relu": (braze.relu, lambda x: np.maximum(x, x.dtype.type(0)), FLOATS + [braze.int8, braze.int16, braze.int32,
                                                                             braze.int64], "any", "simple", None),
    "gelu": (braze.gelu, _f64(lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))), FLOATS, "any", "transc", None),
    "gelu_tanh": (lambda t: braze.gelu(t, approximate="tanh"),
                  _f64(lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
                  FLOATS, "any", "transc", None),
    "silu": (braze.silu, _f64(lambda x: x * _sigmoid64(x)), FLOATS, "any", "transc", None),
    "floor": (braze.floor, _int_identity(np.floor), NUMERIC, "any", "simple", None),
    "ceil": (braze.ceil, _int_identity(np.ceil), NUMERIC, "any", "simple", None),
    "round": (braze.round, _int_identity(np.round), NUMERIC, "any", "simple", None),
    "sign": (braze.sign, np.sign, NUMERIC, "any", "simple", None),
    "logical_not": (braze.logical_not, np.logical_not, ALL, "any", "simple", braze.bool_),
    "isnan": (braze.isnan, np.isnan, ALL, "any", "simple", braze.bool_),
    "isinf": (braze.isinf, np.isinf, ALL, "any", "simple", braze.bool_),
    "isfinite": (braze.isfinite, np.isfinite, ALL, "any", "simple", braze.bool_),
}

UNARY_OK = [(n, d) for n, spec in UNARY.items() for d in spec[2]]
UNARY_BAD = [(n, d) for n, spec in UNARY.items() for d in ALL if d not in spec[2]]


@pytest.mark.parametrize("name,d", UNARY_OK, ids=[f"{n}-{d.name}" for n, d in UNARY_OK])
@FAST
@given(data=st.data())
def test_unary(name, d, data):
    fn, ref, _, domain, cls, out = UNARY[name]
    p = data.draw(tensors(d, domain=domain))
    expected = oracle(ref, [p.a], d, out)
    assert_close(fn(p.t), expected, out or d, cls)


@pytest.mark.parametrize("name,d", UNARY_BAD, ids=[f"{n}-{d.name}" for n, d in UNARY_BAD])
def test_unary_rejects_dtype(name, d):
    with pytest.raises(DtypeMismatch):
        UNARY[name][0](small(d))


def test_unary_methods_match_functions():
    x = small(braze.float32)
    for name in UNARY:
        if name == "gelu_tanh":
            continue
        np.testing.assert_array_equal(getattr(x, name)().numpy(), getattr(braze, name)(x).numpy())
    np.testing.assert_array_equal((-x).numpy(), braze.neg(x).numpy())
    np.testing.assert_array_equal(abs(x).numpy(), braze.abs(x).numpy())


def test_erf_extremes_vs_math_erf():
    xs = np.array([0.0, -0.0, 1e-30, 1e-8, 0.5, 0.9999, 1.0, 1.0001, 2.5, 5.9, 6.0, 6.1, 30.0, np.inf,
                   -1e-8, -1.0, -3.0, -np.inf, np.nan])
    got = braze.erf(braze.tensor(xs)).numpy()
    want = np.array([math.erf(v) if not math.isnan(v) else np.nan for v in xs])
    np.testing.assert_allclose(got, want, rtol=3e-14, atol=1e-300)
    assert np.signbit(got[1]) and got[0] == 0.0


# -- binary ----------------------------------------------------------------------------------------

def _int_zero_safe(fn):
    def ref(a, b):
        if a.dtype.kind in "iu":
            z = b == 0
            return np.where(z, 0, fn(a, np.where(z, 1, b))).astype(a.dtype)
        return fn(a, b)
    return ref


def _true_div(a, b):
    if a.dtype.kind in "iub":
        return a.astype(np.float64) / b.astype(np.float64)
    return a / b


def _powi(a, b):
    """PyTorch's integer power: b < 0 gives 1 for a == 1, +-1 for a == -1, else 0."""
    if a.dtype.kind not in "iu":
        return np.power(a, b)
    a, b = np.broadcast_arrays(a, b)
    out = np.power(a, np.where(b < 0, 0, b))
    neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 != 0, -1, 1), 0))
    return np.where(b < 0, neg, out).astype(a.dtype)


ARITH = FLOATS + INTS
CMP = ALL
# name -> (python/braze call, oracle, supported dtypes, output dtype rule, lhs domain, rhs domain)
BINARY = {
    "add": (operator.add, np.add, ARITH, None, "any", "any"),
    "sub": (operator.sub, np.subtract, ARITH, None, "any", "any"),
    "mul": (operator.mul, np.multiply, ARITH, None, "any", "any"),
    "div": (operator.truediv, _true_div, ARITH, "div", "any", "any"),
    "floor_divide": (operator.floordiv, _int_zero_safe(np.floor_divide), ARITH, None, "any", "any"),
    "remainder": (operator.mod, _int_zero_safe(np.remainder), ARITH, None, "any", "any"),
    "pow": (operator.pow, _powi, ARITH, None, "small", "small"),
    "maximum": (braze.maximum, np.maximum, ALL, None, "any", "any"),
    "minimum": (braze.minimum, np.minimum, ALL, None, "any", "any"),
    "eq": (operator.eq, np.equal, CMP, "bool", "ties", "ties"),
    "ne": (operator.ne, np.not_equal, CMP, "bool", "ties", "ties"),
    "lt": (operator.lt, np.less, CMP, "bool", "ties", "ties"),
    "le": (operator.le, np.less_equal, CMP, "bool", "ties", "ties"),
    "gt": (operator.gt, np.greater, CMP, "bool", "ties", "ties"),
    "ge": (operator.ge, np.greater_equal, CMP, "bool", "ties", "ties"),
    "logical_and": (braze.logical_and, np.logical_and, ALL, "bool", "ties", "ties"),
    "logical_or": (braze.logical_or, np.logical_or, ALL, "bool", "ties", "ties"),
    "logical_xor": (braze.logical_xor, np.logical_xor, ALL, "bool", "ties", "ties"),
    "and_": (operator.and_, np.logical_and, BOOL, "bool", "ties", "ties"),
    "or_": (operator.or_, np.logical_or, BOOL, "bool", "ties", "ties"),
    "xor": (operator.xor, np.logical_xor, BOOL, "bool", "ties", "ties"),
}


def _out(rule, d):
    if rule == "bool":
        return braze.bool_
    if rule == "div":
        return d if d.is_floating_point else braze.float32
    return d


def _cls(name, d):
    # int / int: braze divides in float64 and rounds once; pow in half types is a transcendental
    return "transc" if name == "pow" else "simple"


BINARY_OK = [(n, d) for n, spec in BINARY.items() for d in spec[2]]
BINARY_BAD = [(n, d) for n, spec in BINARY.items() for d in ALL if d not in spec[2]]


@pytest.mark.parametrize("name,d", BINARY_OK, ids=[f"{n}-{d.name}" for n, d in BINARY_OK])
@FAST
@given(data=st.data(), shapes=broadcast_pair())
def test_binary_broadcast(name, d, data, shapes):
    fn, ref, _, rule, dom_a, dom_b = BINARY[name]
    a = data.draw(tensors(d, shapes[0], domain=dom_a), label="a")
    b = data.draw(tensors(d, shapes[1], domain=dom_b), label="b")
    expected = oracle(ref, [a.a, b.a], d, _out(rule, d))
    assert_close(fn(a.t, b.t), expected, _out(rule, d), _cls(name, d))


@pytest.mark.parametrize("name,d", BINARY_OK, ids=[f"{n}-{d.name}" for n, d in BINARY_OK])
@FAST
@given(data=st.data(), seed=st.integers(0, 2**31), left=st.booleans())
def test_binary_scalar(name, d, data, seed, left):
    """A Python scalar of the tensor's category, on either side, takes the tensor's dtype."""
    fn, ref, _, rule, dom_a, dom_b = BINARY[name]
    p = data.draw(tensors(d, domain=dom_a if left else dom_b))
    s = scalar_for(d, seed, "ties" if dom_b == "ties" else "small")
    if name == "pow" and d.is_integer and left:
        s = abs(s)  # int ** negative scalar is an error, tested below
    sa = np.asarray(s).astype(d.np)
    out = _out(rule, d)
    if left:
        got, expected = fn(p.t, s), oracle(ref, [p.a, sa], d, out)
    else:
        got, expected = fn(s, p.t), oracle(ref, [sa, p.a], d, out)
    assert_close(got, expected, out, _cls(name, d))


@pytest.mark.parametrize("name,d", BINARY_BAD, ids=[f"{n}-{d.name}" for n, d in BINARY_BAD])
def test_binary_rejects_dtype(name, d):
    fn = BINARY[name][0]
    x = small(d)
    with pytest.raises((DtypeMismatch, Unsupported)):
        fn(x, x)


# Mixed dtypes (tensor with tensor, zero-dim tensor or scalar of another category) are
# PyTorch's type promotion: tests/test_promotion.py.

@pytest.mark.parametrize("d", INTS + BOOL, ids=ids)
@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
                                operator.mod, operator.pow, operator.eq, operator.lt, braze.maximum])
def test_float_scalar_promotes_int_and_bool_tensors(d, op):
    """An int or bool tensor with a float scalar computes in float32 (the default dtype);
    subtraction with a bool tensor is refused, as PyTorch does."""
    x = small(d)
    xf = x.numpy().astype(np.float32)
    f = {operator.add: np.add, operator.sub: np.subtract, operator.mul: np.multiply, operator.truediv: np.divide,
         operator.floordiv: np.floor_divide, operator.mod: np.remainder, operator.pow: np.power,
         operator.eq: np.equal, operator.lt: np.less, braze.maximum: np.maximum}[op]
    if op is operator.sub and d is braze.bool_:
        with pytest.raises(DtypeMismatch):
            op(x, 1.5)
        return
    out = braze.bool_ if op in (operator.eq, operator.lt) else braze.float32
    cls = "transc" if op is operator.pow else "simple"
    with np.errstate(all="ignore"):
        assert_close(op(x, 1.5), f(xf, np.float32(1.5)).astype(out.np), out, cls)
        assert_close(op(1.5, x), f(np.float32(1.5), xf).astype(out.np), out, cls)


@pytest.mark.parametrize("d", INTS, ids=ids)
def test_integral_float_scalar_still_promotes(d):
    x = small(d, (3,), "nonneg")
    assert_close(x + 2.0, x.numpy().astype(np.float32) + 2, braze.float32)
    assert_close(2.0 * x, x.numpy().astype(np.float32) * 2, braze.float32)


@pytest.mark.parametrize("d", INTS, ids=ids)
def test_int_division(d):
    a = braze.tensor(np.array([7, 0, 5, 0, 3], dtype=d.np))
    b = braze.tensor(np.array([2, 0, 0, 3, 5], dtype=d.np))
    q = a / b
    assert q.dtype is braze.float32
    np.testing.assert_array_equal(q.numpy(), np.array([3.5, np.nan, np.inf, 0.0, 0.6], np.float32))
    assert (a // b).tolist() == [3, 0, 0, 0, 0]
    assert (a % b).tolist() == [1, 0, 0, 0, 3]
    assert (a // 0).tolist() == [0] * 5 and (a % 0).tolist() == [0] * 5


@pytest.mark.parametrize("d", INTS, ids=ids)
@pytest.mark.parametrize("exponent", [-1, -2])  # a float exponent promotes (test_promotion.py)
def test_int_pow_negative_scalar_unsupported(d, exponent):
    with pytest.raises(Unsupported):
        small(d) ** exponent
    with pytest.raises(Unsupported):
        braze.pow(small(d), exponent)


def test_bool_arithmetic_rejected():
    x = small(braze.bool_)
    for op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
               operator.pow):
        with pytest.raises(DtypeMismatch):
            op(x, x)
        with pytest.raises(DtypeMismatch):
            op(x, True)


@pytest.mark.parametrize("d", [braze.int8, braze.uint8, braze.int32, braze.float32], ids=ids)
def test_bitwise_operators_need_bool(d):
    """``&``, ``|``, ``^`` are logical on bool tensors; on numbers PyTorch means bitwise,
    which braze does not have, so it refuses rather than answer a different question."""
    x = small(d)
    for op in (operator.and_, operator.or_, operator.xor):
        with pytest.raises((Unsupported, DtypeMismatch)):
            op(x, x)


def test_scalar_out_of_range_for_dtype():
    with pytest.raises(DtypeMismatch):
        small(braze.int8) + 300
    with pytest.raises(DtypeMismatch):
        small(braze.uint8) + (-1)


@pytest.mark.parametrize("d", [braze.float32, braze.float16, braze.bfloat16, braze.float64], ids=ids)
def test_nan_propagates_through_maximum_minimum(d):
    a = braze.tensor(np.array([np.nan, 1.0, np.nan, -np.inf], np.float32)).to(d)
    b = braze.tensor(np.array([0.0, np.nan, np.nan, 2.0], np.float32)).to(d)
    for fn in (braze.maximum, braze.minimum):
        got = fn(a, b).numpy().astype(np.float64)
        assert np.isnan(got[:3]).all()
    assert braze.clamp(a, 0.0, 1.0).numpy().astype(np.float64)[0] != 0.0


# -- where, clamp ----------------------------------------------------------------------------------

@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data(), which=st.sampled_from(["tt", "ts", "st"]))
def test_where(d, data, which):
    sh = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=0,
                                                     max_side=4)).input_shapes
    c = data.draw(tensors(braze.bool_, sh[0]))
    a = data.draw(tensors(d, sh[1]))
    b = data.draw(tensors(d, sh[2]))
    s = scalar_for(d, data.draw(st.integers(0, 2**31)))
    sv = np.asarray(s).astype(d.np)
    if which == "tt":
        got, expected = braze.where(c.t, a.t, b.t), np.where(c.a, a.a, b.a)
    elif which == "ts":
        got, expected = braze.where(c.t, a.t, s), np.where(c.a, a.a, sv)
    else:
        got, expected = braze.where(c.t, s, b.t), np.where(c.a, sv, b.a)
    assert_close(got, expected.astype(d.np), d)


def test_where_rules():
    x = small(braze.float32)
    with pytest.raises(DtypeMismatch):
        braze.where(small(braze.int64), x, x)
    c, y = small(braze.bool_), small(braze.float64)
    assert_close(braze.where(c, x, y), np.where(c.numpy(), x.numpy().astype(np.float64), y.numpy()), braze.float64)
    i = small(braze.int32)
    assert_close(braze.where(c, i, 0.5), np.where(c.numpy(), i.numpy(), 0.5).astype(np.float32), braze.float32)


CLAMP_DTYPES = FLOATS + INTS


@pytest.mark.parametrize("d", CLAMP_DTYPES, ids=ids)
@FAST
@given(data=st.data(), kind=st.sampled_from(["ss", "s-", "-s", "tt", "t-"]))
def test_clamp(d, data, kind):
    p = data.draw(tensors(d, max_dims=3))
    lo_s, hi_s = sorted([scalar_for(d, data.draw(st.integers(0, 2**31))) for _ in range(2)])
    if kind in ("tt", "t-"):
        lo = data.draw(tensors(d, p.a.shape[1:] if p.a.ndim else ()))
        hi = data.draw(tensors(d, p.a.shape[1:] if p.a.ndim else ())) if kind == "tt" else None
        got = braze.clamp(p.t, lo.t, hi.t if hi else None)
        expected = np.maximum(p.a, lo.a)
        if hi is not None:
            expected = np.minimum(expected, hi.a)
    else:
        lo = lo_s if kind[0] == "s" else None
        hi = hi_s if kind[1] == "s" else None
        got = p.t.clamp(lo, hi) if kind == "ss" else braze.clamp(p.t, min=lo, max=hi)
        expected = p.a
        if lo is not None:
            expected = np.maximum(expected, np.asarray(lo).astype(d.np))
        if hi is not None:
            expected = np.minimum(expected, np.asarray(hi).astype(d.np))
    assert_close(got, np.asarray(expected).astype(d.np), d)


def test_clamp_needs_a_bound_and_promotes_to_a_float_bound():
    with pytest.raises(Unsupported):
        braze.clamp(small(braze.float32))
    i = small(braze.int32)
    assert_close(braze.clamp(i, 0.5), np.maximum(i.numpy().astype(np.float32), 0.5), braze.float32)


# -- the view strategy itself -----------------------------------------------------------------------

@pytest.mark.parametrize("d", ALL, ids=ids)
@FAST
@given(data=st.data())
def test_views_match_numpy(d, data):
    """The strategy's braze view and numpy view agree (and copies stay equal)."""
    p = data.draw(tensors(d))
    assert_close(p.t, p.a, d)
    assert_close(p.t.contiguous(), p.a, d)
    assert_close(p.t.clone(), p.a, d)
    _ = make_values, build_view


@pytest.mark.parametrize("op", ["remainder", "floor_divide"])
def test_integer_division_of_the_most_negative_value_by_minus_one(op: str) -> None:
    """INT64_MIN // -1 overflows: C's division traps (SIGFPE killed the process), numpy
    wraps; the kernel gives numpy's answer."""
    a = np.array([np.iinfo(np.int64).min, 7, -7], np.int64)
    got = getattr(braze, op)(braze.from_numpy(a), -1).numpy()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, getattr(np, op)(a, np.int64(-1)))
