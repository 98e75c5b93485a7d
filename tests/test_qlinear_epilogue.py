"""Element-wise work after a quantized matmul, done by the matmul kernel as it stores
(``schedule/epilogue.py``): a residual add, a bias, ``silu(gate) * up`` with both
weights in one kernel, on random blocks of several types, at decoding sizes (the
matrix-vector path) and prefill ones (the strips), against float64. The suite runs
fused and with BRAZE_FUSION=0 (the reference executor); fused, the kernel count must
drop as the fusion promises."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import braze
from braze.nn import functional as F
from braze.quant import GGMLType
from braze.stream import fusion_enabled
from braze.creation import from_numpy
from braze.functions import qlinear
from test_qlinear import levels, tolerance, weight

TYPES = ["Q4_1", "Q8_0", "Q4_K", "F16"]
SIZES = [1, 3, 9, 37]


def matrix(qtype: str, n: int, k: int, seed: int) -> tuple[braze.Tensor, np.ndarray]:
    """A weight of ``qtype`` and its values in float64."""
    if qtype == "F16":
        wf = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float16)
        return braze.tensor(wf.astype(np.float32)).to("float16"), wf.astype(np.float64)
    return weight(GGMLType[qtype], n, k, seed=seed)


def product(qtype: str, m: int, n: int, seed: int) -> tuple[braze.Tensor, braze.Tensor, np.ndarray, np.ndarray]:
    """x (m, k), a weight, and the float64 product with its error bound."""
    k = 512 if qtype.endswith("_K") else 96
    w, wf = matrix(qtype, n, k, seed)
    x = np.random.default_rng(seed + 1).standard_normal((m, k)).astype(np.float32)
    tol = tolerance(wf, x.astype(np.float64), levels(qtype, m) if fusion_enabled() else 0)
    return from_numpy(x), w, x.astype(np.float64) @ wf.T, tol


def within(got: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> None:
    err = np.abs(got - ref)
    bound = tol + 1e-6 * np.abs(ref)  # the epilogue's own float32 rounding
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(np.isfinite(got)) and np.all(err <= bound), f"error {err[worst]} > {bound[worst]} at {worst}"


def launches(run: Callable[[], object]) -> int:
    braze.reset_stats()
    run()
    return braze.stats()["kernel_launches"]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", SIZES)
def test_residual_add(qtype: str, m: int) -> None:
    x, w, ref, tol = product(qtype, m, 37, seed=m)
    r = np.random.default_rng(7).standard_normal((m, 37)).astype(np.float32)
    within((from_numpy(r) + qlinear(x, w)).numpy(), ref + r, tol)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", SIZES)
def test_bias_on_batched_input(qtype: str, m: int) -> None:
    """``F.linear`` with a bias on (1, m, k): the product reshaped, the bias broadcast over rows."""
    x, w, ref, tol = product(qtype, m, 45, seed=10 + m)
    b = np.random.default_rng(8).standard_normal(45).astype(np.float32)
    got = F.linear(x.reshape(1, m, -1), w, from_numpy(b)).numpy()
    assert got.shape == (1, m, 45)
    within(got[0], ref + b, tol)


def gated(qtype: str, m: int, n: int, seed: int) -> tuple[braze.Tensor, np.ndarray, np.ndarray]:
    """``silu(x @ wg.T) * (x @ wu.T)`` recorded, in float64, and its error bound (silu's
    slope is at most 1.1)."""
    x, wg, g, tg = product(qtype, m, n, seed)
    wu, uf = matrix(qtype, n, x.shape[1], seed + 1000)
    u = x.numpy().astype(np.float64) @ uf.T
    tu = tolerance(uf, x.numpy().astype(np.float64), levels(qtype, m) if fusion_enabled() else 0)
    sg = g / (1 + np.exp(np.minimum(-g, 700)))  # no overflow warning where g is very negative
    return F.silu(qlinear(x, wg)) * qlinear(x, wu), sg * u, 1.1 * np.abs(u) * tg + np.abs(sg) * tu + 1e-6


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", SIZES)
def test_silu_gate_times_up(qtype: str, m: int) -> None:
    """Two weights on the same x: one kernel, x quantized once."""
    got, ref, tol = gated(qtype, m, 41, seed=20 + m)
    within(got.numpy(), ref, tol)


@pytest.mark.skipif(not fusion_enabled(), reason="counts fused kernels")
@pytest.mark.parametrize("m", [1, 37])
def test_epilogues_are_no_kernels_of_their_own(m: int) -> None:
    x, wg, _, _ = product("Q4_K", m, 64, seed=40)
    _, wu, _, _ = product("Q4_K", m, 64, seed=41)
    r = from_numpy(np.ones((m, 64), np.float32))
    b = from_numpy(np.ones(64, np.float32))
    assert launches(lambda: (r + qlinear(x, wg)).numpy()) == 1
    assert launches(lambda: F.linear(x, wg, b).numpy()) == 1
    assert launches(lambda: (F.silu(qlinear(x, wg)) * qlinear(x, wu)).numpy()) == 1
    # different x: one matmul takes the epilogue, the other stays a kernel of its own; at
    # decoding's few rows, x + 1 is that kernel's prologue (test_qlinear_prologue.py)
    assert launches(lambda: (F.silu(qlinear(x, wg)) * qlinear(x + 1, wu)).numpy()) == (2 if m == 1 else 3)
    # a transposed read is not the matmul's [r, j]: refused, still right
    x2, w2, ref2, tol2 = product("Q8_0", 5, 5, seed=42)
    assert launches(lambda: (qlinear(x2, w2).T + 0.5).numpy()) == 2
    within((qlinear(x2, w2).T + 0.5).numpy(), ref2.T + 0.5, tol2.T)


@pytest.mark.parametrize("m", [2, 37])
def test_a_result_python_keeps_is_stored_too(m: int) -> None:
    x, w, ref, tol = product("Q4_1", m, 37, seed=50)
    y = qlinear(x, w)
    z = y * 2 + 1
    if fusion_enabled():
        assert launches(lambda: z.numpy()) == 1
    within(z.numpy(), 2 * ref + 1, 2 * tol)
    within(y.numpy(), ref, tol)


def test_a_result_read_elsewhere_is_stored_too() -> None:
    """y feeds the epilogue and a row sum (a reduction: another kernel, reading y)."""
    x, w, ref, tol = product("Q8_0", 3, 37, seed=60)
    y = qlinear(x, w)
    z = (y + 1).sum() + y.sum()
    np.testing.assert_allclose(z.numpy(), 2 * ref.sum() + 3 * 37, rtol=1e-4, atol=float(2 * tol.sum()) + 1e-3)


def test_a_write_between_keeps_the_matmul_first() -> None:
    """x written in place after the matmul and before its consumer: the product is of
    the x before the write (the matmul does not move past it)."""
    x, w, ref, tol = product("Q4_1", 2, 37, seed=70)
    y = qlinear(x, w)
    x.add_(1.0)
    z = y + 1
    within(z.numpy(), ref + 1, tol)


@pytest.mark.parametrize("qtype", ["Q4_K", "F16"])
@pytest.mark.parametrize("m", [2, 12])
def test_wide_results_in_blocks_across_threads(qtype: str, m: int) -> None:
    """Enough weight bytes for every thread, columns not a multiple of any block width."""
    got, ref, tol = gated(qtype, m, 1003, seed=80 + m)
    within((got + 1).numpy(), ref + 1, tol)
