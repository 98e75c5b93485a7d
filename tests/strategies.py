"""Shared pieces of the op property tests: the tolerance table, the numpy oracle helpers
and the hypothesis strategies that build a braze tensor and the identical numpy view.

Tolerances (one table, per dtype and per class of op)
----------------------------------------------------
The oracle is numpy. For float16/bfloat16 it computes in float32 and rounds the result
back to the half type, which is braze's documented semantics (as PyTorch on the CPU), so
the half rows only absorb the one final rounding plus float32 noise. Integer and bool
results are compared exactly; NaN must match NaN and +-inf must match exactly everywhere.

==========  ====================  ====================  ====================
dtype       "simple" (+,*,abs..)  "transc" (exp,erf..)  "reduce" (sum,@,..)
==========  ====================  ====================  ====================
float64     rtol 1e-12 atol 1e-12 rtol 1e-12 atol 1e-12 rtol 1e-9  atol 1e-9
float32     rtol 1e-6  atol 1e-6  rtol 4e-6  atol 1e-6  rtol 1e-5  atol 1e-5
float16     rtol 1e-3  atol 1e-3  rtol 2e-3  atol 2e-3  rtol 1e-2  atol 1e-2
bfloat16    rtol 1e-2  atol 1e-2  rtol 1.6e-2 atol 1.6e-2 rtol 4e-2 atol 4e-2
ints, bool  exact                 exact                 exact
==========  ====================  ====================  ====================

"reduce" atol is scaled by the magnitude of the data (sum of |x|) where a result is a
sum of many terms whose order the oracle cannot know.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import braze
from braze import dtypes as bdt
from braze.dtypes import DType

# -- dtypes ----------------------------------------------------------------------------------

ALL = list(bdt.ALL)
FLOATS = list(bdt.FLOATS)
INTS = list(bdt.INTS)
BOOL = [braze.bool_]
NUMERIC = FLOATS + INTS
HALF = [braze.float16, braze.bfloat16]


def ids(d: DType) -> str:
    return d.name


TOL: dict[str, dict[str, tuple[float, float]]] = {
    #            simple          transc           reduce
    "float64": {"simple": (1e-12, 1e-12), "transc": (1e-12, 1e-12), "reduce": (1e-9, 1e-9)},
    "float32": {"simple": (1e-6, 1e-6), "transc": (4e-6, 1e-6), "reduce": (1e-5, 1e-5)},
    "float16": {"simple": (1e-3, 1e-3), "transc": (2e-3, 2e-3), "reduce": (1e-2, 1e-2)},
    "bfloat16": {"simple": (1e-2, 1e-2), "transc": (1.6e-2, 1.6e-2), "reduce": (4e-2, 4e-2)},
}

# Moderate example counts: the three files run in about a minute with ``-n 2``. Set
# BRAZE_TEST_EXAMPLES (e.g. 200) for a deeper search before a release.
FAST = settings(max_examples=int(os.environ.get("BRAZE_TEST_EXAMPLES", "8")), deadline=None,
                suppress_health_check=list(HealthCheck))


# -- oracle helpers ----------------------------------------------------------------------------

def compute_dtype(d: DType) -> np.dtype:
    """What the oracle computes ``d`` in: float32 for half types, else ``d`` itself."""
    return np.dtype(np.float32) if d.is_half else d.np


def up(a: np.ndarray, d: DType) -> np.ndarray:
    """An input array in the oracle's compute dtype."""
    return np.asarray(a).astype(compute_dtype(d))


def oracle(fn: Callable[..., Any], arrays: Sequence[np.ndarray], d: DType, out: DType | None = None) -> np.ndarray:
    """``fn`` on the inputs in the compute dtype of ``d``, cast to ``out`` (default ``d``)."""
    with np.errstate(all="ignore"):
        r = np.asarray(fn(*[up(a, d) for a in arrays]))
        return r.astype((out or d).np)


def assert_close(t: Any, expected: np.ndarray, dtype: DType, cls: str = "simple", *, scale: Any = None,
                 shape: tuple[int, ...] | None = None) -> None:
    """``t`` (a braze Tensor) has ``dtype``, ``expected``'s shape and its values within the
    tolerance of ``cls`` (exact for integers and bools; NaN and inf positions exact)."""
    assert isinstance(t, braze.Tensor), type(t)
    assert t.dtype is dtype, (t.dtype, dtype)
    expected = np.asarray(expected)
    want_shape = expected.shape if shape is None else shape
    assert t.shape == want_shape, (t.shape, want_shape)
    got = t.numpy()
    assert got.shape == want_shape
    assert got.dtype == dtype.np, (got.dtype, dtype.np)
    if not dtype.is_floating_point:
        np.testing.assert_array_equal(got, expected.astype(dtype.np))
        return
    g = got.astype(np.float64)
    e = expected.astype(dtype.np).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(e), err_msg="NaN positions differ")
    inf = np.isinf(e) | np.isinf(g)
    np.testing.assert_array_equal(g[inf], e[inf], err_msg="inf positions differ")
    rtol, atol = TOL[dtype.name][cls]
    if scale is not None:
        atol = atol * np.maximum(np.asarray(scale, dtype=np.float64), 1.0)
        atol = np.broadcast_to(atol, e.shape)[~(np.isnan(e) | inf)]
    fin = ~(np.isnan(e) | inf)
    g, e = g[fin], e[fin]
    bad = np.abs(g - e) > atol + rtol * np.abs(e)
    if bad.any():
        k = int(np.argmax(bad))
        raise AssertionError(f"{int(bad.sum())}/{bad.size} values differ beyond rtol={rtol} (atol {cls}); "
                             f"first: got {g[k]!r}, expected {e[k]!r}\ngot      {got!r}\nexpected {expected!r}")


# -- values ---------------------------------------------------------------------------------------

#: Value domains a test may ask for: ``any`` (normal floats, sometimes with nan/inf/-0),
#: ``finite``, ``pos`` (> 0), ``unit`` ([-1, 1]), ``small`` (|x| <= 4), ``ties`` (few
#: distinct small integers, to exercise ties and stable orders).
DOMAINS = ("any", "finite", "pos", "unit", "small", "ties", "nonneg")


def int_range(d: DType, domain: str) -> tuple[int, int]:
    info = np.iinfo(d.np)
    if domain == "ties":
        return (max(info.min, -2), 3)
    if domain in ("small", "unit"):
        return (max(info.min, -4), min(info.max, 5))
    if domain in ("pos",):
        return (1, min(info.max, 100) + 1)
    if domain == "nonneg":
        return (0, min(info.max, 100) + 1)
    return (int(info.min), int(info.max) + 1)


def make_values(seed: int, d: DType, n: int, domain: str = "any") -> np.ndarray:
    """``n`` values of dtype ``d`` from ``domain`` (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    if d is braze.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if d.is_integer:
        lo, hi = int_range(d, domain)
        if domain == "any" and n and rng.random() < 0.5:
            # mostly small values, with the extremes of the type now and then
            v = rng.integers(-50, 51, n)
            v = np.clip(v, lo, hi - 1)
            ext = rng.random(n) < 0.1
            v = np.where(ext, rng.choice([lo, hi - 1], n), v)
            return v.astype(d.np)
        return rng.integers(lo, hi - 1, n, dtype=d.np, endpoint=True)
    if domain == "ties":
        v = rng.integers(-2, 3, n).astype(np.float64)
    elif domain == "unit":
        v = rng.uniform(-1, 1, n)
    elif domain == "small":
        v = rng.uniform(-4, 4, n)
    elif domain == "pos":
        v = np.exp(rng.uniform(-4, 4, n))
    elif domain == "nonneg":
        v = np.abs(rng.standard_normal(n)) * 3
    else:
        scale = rng.choice([1.0, 10.0, 100.0])
        v = rng.standard_normal(n) * scale
        if domain == "any" and n and rng.random() < 0.4:
            special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0])
            pick = rng.random(n) < 0.2
            v = np.where(pick, rng.choice(special, n), v)
    return v.astype(d.np)


# -- shapes ------------------------------------------------------------------------------------------

def shapes(min_dims: int = 0, max_dims: int = 4, min_side: int = 0, max_side: int = 5) -> st.SearchStrategy:
    """Shapes including 0-d, size-0 and size-1 dims."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcast_pair(min_dims: int = 0, max_dims: int = 4, min_side: int = 0, max_side: int = 4) -> st.SearchStrategy:
    return hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=min_dims, max_dims=max_dims,
                                             min_side=min_side, max_side=max_side).map(lambda r: r.input_shapes)


# -- tensors as random views ----------------------------------------------------------------------

class Pair:
    """A braze tensor and the numpy array with the same shape and values."""

    __slots__ = ("t", "a", "how")

    def __init__(self, t: braze.Tensor, a: np.ndarray, how: str) -> None:
        self.t, self.a, self.how = t, a, how

    def __repr__(self) -> str:
        return f"Pair({self.how}, shape={self.a.shape}, strides={self.t.stride()}, offset={self.t.storage_offset()})"


def build_view(draw: Any, shape: tuple[int, ...], d: DType, domain: str, allow_expand: bool = True) -> Pair:
    """A tensor of ``shape`` reached by a random chain of views from a bigger storage
    (offset into the storage, a selected-away dim, steps, expands, a permutation), and the
    identical numpy view of identical data."""
    seed = draw(st.integers(0, 2**32 - 1))
    how = draw(st.sampled_from(["contiguous", "view", "view", "view", "from_numpy"]))
    n = len(shape)
    if how == "contiguous":
        a = make_values(seed, d, int(np.prod(shape, dtype=np.int64)), domain).reshape(shape)
        return Pair(braze.tensor(a), a, how)
    perm = draw(st.permutations(range(n))) if n > 1 else list(range(n))
    # Output dim i is pre-permutation dim perm[i].
    pre_shape = [0] * n
    for i, p in enumerate(perm):
        pre_shape[p] = shape[i]
    steps, starts, tails, expanded = [], [], [], []
    for size in pre_shape:
        exp = allow_expand and size > 1 and draw(st.integers(0, 3)) == 0
        expanded.append(exp)
        steps.append(draw(st.integers(1, 3)))
        starts.append(draw(st.integers(0, 2)))
        tails.append(draw(st.integers(0, 1)))
    base_shape = []
    for size, stp, s0, tl, exp in zip(pre_shape, steps, starts, tails, expanded):
        if exp:
            base_shape.append(1 + s0 + tl)
        elif size == 0:
            base_shape.append(s0 + tl)
        else:
            base_shape.append(s0 + (size - 1) * stp + 1 + tl)
    extra = draw(st.integers(0, 1))  # a leading dim of size 2, selected away by an int index
    sel = draw(st.integers(0, 1))
    full_shape = ([2] if extra else []) + base_shape
    prefix = draw(st.integers(0, 3))
    numel = int(np.prod(full_shape, dtype=np.int64))
    flat = make_values(seed, d, prefix + numel, domain)
    idx = tuple(slice(s0, s0 + 1) if exp else slice(s0, s0 + (size - 1) * stp + 1 if size else s0, stp)
                for size, stp, s0, exp in zip(pre_shape, steps, starts, expanded))
    if how == "from_numpy":
        a = flat[prefix:].reshape(full_shape)
        if extra:
            a = a[sel, ...]
        a = a[idx + (Ellipsis,)]
        t = braze.from_numpy(a)  # strided numpy view wrapped as is
        a = a.copy()
        t = t.expand(pre_shape) if any(expanded) else t
        a = np.broadcast_to(a, pre_shape)
    else:
        t = braze.tensor(flat)[prefix:].view(full_shape)
        a = flat[prefix:].reshape(full_shape)
        if extra:
            t, a = t[sel], a[sel, ...]
        t, a = t[idx], a[idx + (Ellipsis,)]
        t = t.expand(pre_shape)
        a = np.broadcast_to(a, pre_shape)
    if n > 1:
        t = t.permute(perm)
        a = a.transpose(perm)
    assert t.shape == tuple(shape) == a.shape, (t.shape, shape, a.shape)
    return Pair(t, np.array(a), how)


@st.composite
def tensors(draw: Any, d: DType, shape: Any = None, domain: str = "any", allow_expand: bool = True,
            **shape_kw: Any) -> Pair:
    """A Pair with dtype ``d``; ``shape`` is a fixed shape, a strategy, or None (random)."""
    if shape is None:
        shape = draw(shapes(**shape_kw))
    elif isinstance(shape, st.SearchStrategy):
        shape = draw(shape)
    return build_view(draw, tuple(shape), d, domain, allow_expand)


def small(d: DType, shape: tuple[int, ...] = (2, 3), domain: str = "small") -> braze.Tensor:
    """A plain tensor for dtype-rule checks (no hypothesis)."""
    return braze.tensor(make_values(0, d, int(np.prod(shape)), domain).reshape(shape))


def scalar_for(d: DType, rng_seed: int, domain: str = "small") -> Any:
    """A Python scalar that fits ``d`` (bool for bool, int for ints, float for floats)."""
    v = make_values(rng_seed, d, 1, domain)[0]
    if d is braze.bool_:
        return bool(v)
    if d.is_integer:
        return int(v)
    return float(np.float32(v)) if d.is_half else float(v)


_ = ml_dtypes  # bfloat16 arrays come from ml_dtypes through braze.bfloat16.np
