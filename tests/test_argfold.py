"""argmax / argmin as a fold in the kernel (``codegen/argfold.py``): ties (the first
position), NaN (the first NaN), rows of the fold's identity (-inf for argmax: 0), rows
that are not a multiple of the fold's lanes, every dtype kind, keepdim, dims other than
the last, and the fusions it makes: ``softmax(x).argmax(-1)`` and ``x.max(dim)``'s
values and indices are one kernel. Each is checked against numpy and the reference
executor (``both``: BRAZE_FUSION=0, then fused)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import braze
from braze.codegen.argfold import LANES
from braze.errors import ShapeMismatch
from braze.runtime.cpu import compiler_available

from test_lowerings import both

rng = np.random.default_rng(11)

ROWS = [1, 3, LANES - 1, LANES, LANES + 1, 2 * LANES + 5, 1000]


def _np(op: str, a: np.ndarray, dim: int, keepdim: bool = False) -> np.ndarray:
    return (np.argmax if op == "argmax" else np.argmin)(a, axis=dim, keepdims=keepdim)


def _launches(st: dict[str, int], want: int) -> None:
    if compiler_available():
        assert st["kernel_launches"] == want, st


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("n", ROWS)
def test_ties_pick_the_first_position_at_every_row_length(op: str, n: int, monkeypatch: Any) -> None:
    a = rng.integers(-2, 3, (7, n)).astype(np.float32)  # many ties, the extreme often repeated
    a[3, n // 2:] = 5.0 if op == "argmax" else -5.0  # a run of the extreme from the middle on
    got, st = both(lambda x: getattr(x, op)(-1), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], _np(op, a, -1))
    _launches(st, 1)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("n", [5, LANES + 3, 700])
def test_nan_is_the_extreme_and_infinite_rows_give_zero(op: str, n: int, monkeypatch: Any) -> None:
    a = rng.standard_normal((6, n)).astype(np.float32)
    a[0, n - 1] = np.nan  # the last element
    a[1, [n // 3, n // 2]] = np.nan  # the first of two
    a[2] = -np.inf  # every element argmax's identity
    a[3] = np.inf  # every element argmin's identity
    a[4] = np.nan
    a[5, n // 2] = np.inf if op == "argmax" else -np.inf
    got, _ = both(lambda x: getattr(x, op)(-1), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], _np(op, a, -1))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_every_dtype(dtype: str, op: str, monkeypatch: Any) -> None:
    d = getattr(braze, dtype)
    if dtype == "bool":
        a = rng.random((5, 150)) < 0.1
        a[0] = False
        a[1] = True
    elif d.is_floating_point:
        a = (rng.standard_normal((5, 150)) * 4).astype(d.np)
    else:
        info = np.iinfo(d.np)
        a = rng.integers(max(info.min, -100), min(info.max, 100), (5, 150)).astype(d.np)
        a[0] = info.min  # the identity of argmax, and a row of it
        a[1] = info.max
        a[2, 77] = info.min
        a[2, 99] = info.max
    got, st = both(lambda x: getattr(x, op)(-1), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], _np(op, np.asarray(a, np.float64) if dtype == "bfloat16" else a, -1))
    _launches(st, 1)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_dims_other_than_the_last_and_keepdim(op: str, keepdim: bool, dim: int, monkeypatch: Any) -> None:
    a = rng.integers(-3, 4, (9, 70, 13)).astype(np.float32)
    a[2, 5, 7] = np.nan
    got, st = both(lambda x: getattr(x, op)(dim, keepdim=keepdim), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], _np(op, a, dim, keepdim))
    _launches(st, 1)
    # a view: transposed and sliced, and the whole tensor (flattened)
    got, _ = both(lambda x: getattr(x.permute(2, 0, 1)[:, 1:, ::3], op)(dim, keepdim=keepdim), a, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(got[0], _np(op, a.transpose(2, 0, 1)[:, 1:, ::3], dim, keepdim))
    got, _ = both(lambda x: getattr(x, op)(), a, monkeypatch=monkeypatch)
    assert got[0] == _np(op, a.reshape(-1), 0)


def test_softmax_then_argmax_is_one_kernel(monkeypatch: Any) -> None:
    a = (rng.standard_normal((16, 3000)) * 3).astype(np.float32)
    a[4] = -np.inf  # a row of nan probabilities: the first nan, 0
    a[5, 17] = np.nan  # a nan logit: every probability of the row nan too
    got, st = both(lambda x: (x / 0.7).softmax(-1).argmax(-1), a, monkeypatch=monkeypatch)
    _launches(st, 1)
    ok = np.arange(16) > 5
    np.testing.assert_array_equal(got[0][ok], a.argmax(-1)[ok])
    assert got[0][4] == got[0][5] == 0


@pytest.mark.parametrize("op", ["max", "min"])
def test_values_and_indices_are_one_kernel(op: str, monkeypatch: Any) -> None:
    a = rng.integers(-4, 5, (33, 500)).astype(np.float32)
    a[3, 200] = np.nan
    got, st = both(lambda x: tuple(getattr(x * 2, op)(dim=-1)), a, monkeypatch=monkeypatch)
    _launches(st, 1)
    want = (np.max if op == "max" else np.min)(a * 2, -1)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], _np("arg" + op, a, -1))
    # with a consumer of both
    got, st = both(lambda x: (lambda v, i: v * 2 + i.float())(*getattr(x, op)(dim=0, keepdim=True)), a, monkeypatch=monkeypatch)
    _launches(st, 1)
    pick = (np.max if op == "max" else np.min)(a, 0, keepdims=True)
    np.testing.assert_array_equal(got[0], pick * 2 + _np("arg" + op, a, 0, True).astype(np.float32))


def test_argmax_and_argmin_of_one_row_are_one_kernel(monkeypatch: Any) -> None:
    a = rng.integers(-9, 9, (5, 333)).astype(np.int16)
    got, st = both(lambda x: (x.argmax(-1), x.argmin(-1), (x * 2).argmax(-1, keepdim=True)), a, monkeypatch=monkeypatch)
    _launches(st, 1)
    np.testing.assert_array_equal(got[0], a.argmax(-1))
    np.testing.assert_array_equal(got[1], a.argmin(-1))
    np.testing.assert_array_equal(got[2], (a * 2).argmax(-1)[:, None])


def test_one_kernel_at_several_shapes_of_one_program(monkeypatch: Any) -> None:
    for shape in [(4, 100), (8, 1000), (3, 65)]:
        a = rng.standard_normal(shape).astype(np.float32)
        got, st = both(lambda x: (x.exp() - 1).argmax(-1) + 1, a, monkeypatch=monkeypatch)
        np.testing.assert_array_equal(got[0], np.argmax(a, -1) + 1)
        _launches(st, 1)


def test_an_empty_dim_is_a_typed_error() -> None:
    x = braze.zeros(3, 0)
    with pytest.raises(ShapeMismatch, match="cannot reduce over an empty dimension"):
        x.argmax(-1)
    with pytest.raises(ShapeMismatch):
        x.argmin(1)
    assert x.argmax(0).numpy().shape == (0,)  # no row to compute
