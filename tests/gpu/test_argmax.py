"""argmax / argmin on the cuda device (a fold in the kernel: ``codegen/argfold.py``)
against the reference executor: rows longer than a block, ties (the first index), NaN
(the first NaN), infinities, integer and bool rows, strided views and every-dim
reductions; rows held in registers and walked in blocks; softmax then argmax, and
``max(dim)``'s values and indices, one kernel each."""

from __future__ import annotations

import numpy as np
import pytest

import braze

from .conftest import on_both
from .test_triton_kernels import _launches, rows  # noqa: F401  (rows: a fixture)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_match_the_reference(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (5, 2500)).astype(np.float32)  # many ties, a row of 3 blocks
    x[1, 1700] = np.nan
    x[1, 2100] = np.nan
    x[2] = -np.inf
    x[3, 2499] = np.inf if op == "argmax" else -np.inf
    # (along dim 0 a program per column: a few columns, the interpreter runs each in Python)
    for fn in (lambda t: getattr(t, op)(-1), lambda t: getattr(t[:, 1690:1720], op)(0, keepdim=True),
               lambda t: getattr(t, op)(), lambda t: getattr(t[:, 3::7], op)(1)):
        got, ref = on_both(monkeypatch, fn, x)
        np.testing.assert_array_equal(got, ref)
    for arr in (rng.integers(-5, 5, (3, 300)).astype(np.int64), rng.random((4, 9)) < 0.3,
                rng.standard_normal((2, 3, 70)).astype(np.float16)):
        got, ref = on_both(monkeypatch, lambda t: getattr(t, op)(-1), arr)
        np.testing.assert_array_equal(got, ref)


def test_greedy_pick_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = np.random.default_rng(1).standard_normal((1, 49152)).astype(np.float32)
    t = braze.tensor(logits, device="cuda")
    assert int(t.argmax(-1).numpy()[0]) == int(np.argmax(logits))


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_fold_fuses_with_its_producer(monkeypatch: pytest.MonkeyPatch, op: str, rows: None) -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, (6, 300)).astype(np.float32)
    x[1, 40] = np.nan
    x[2] = -np.inf
    x[3] = np.inf
    for fn in (lambda t: getattr((t * 0.5).softmax(-1), op)(-1), lambda t: getattr(t - 1, op)(0, keepdim=True),
               lambda t: getattr(t.exp(), op)(-1, keepdim=True)):
        got, ref = on_both(monkeypatch, fn, x)
        np.testing.assert_array_equal(got, ref)
    t = braze.tensor(x, device="cuda")
    assert _launches(lambda: getattr(t.softmax(-1), op)(-1).numpy()) == 1
    v, i = t.max(dim=-1) if op == "argmax" else t.min(dim=-1)
    assert _launches(lambda: (v.numpy(), i.numpy())) == 1
    np.testing.assert_array_equal(i.numpy(), getattr(np, op)(x, -1))
    got, ref = on_both(monkeypatch, lambda t: t.argmax(-1) * 1000 + t.argmin(-1), x)  # two folds, one kernel
    np.testing.assert_array_equal(got, ref)
