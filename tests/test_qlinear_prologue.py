"""The group computing a quantized matmul's x (an RMSNorm, a LayerNorm) done by the
matmul kernel row by row at decoding's few rows (``schedule/prologue.py``): results
against float64 for several types, row counts and widths; a norm result read by more
than the matmul is still stored; a write between the norm and the matmul is not moved
across; fused, the norm is no kernel of its own. The suite runs fused and with
BRAZE_FUSION=0 (the reference executor)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
from braze import ir, plan
from braze.nn import functional as F
from braze.stream import fusion_enabled
from braze.creation import from_numpy
from braze.functions import qlinear
from test_qlinear import levels, tolerance
from test_qlinear_epilogue import launches, matrix, within

TYPES = ["Q4_1", "Q8_0", "Q4_K", "F16"]
EPS = 1e-5


def width(qtype: str) -> int:
    """k: not a multiple of 64 where the type's blocks allow (Q4_K's are 256 wide)."""
    return {"Q4_1": 96, "Q8_0": 160, "Q4_K": 768, "F16": 100}[qtype]


def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g


def layer(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + EPS) * g + b


def setup(qtype: str, m: int, n: int, seed: int) -> tuple[np.ndarray, braze.Tensor, np.ndarray, np.ndarray]:
    """x (m, k) float32, a weight (realized, so that counting kernels counts only the
    product's), its float64 values, and a gain."""
    k = width(qtype)
    w, wf = matrix(qtype, n, k, seed)
    w.realize()
    rng = np.random.default_rng(seed + 1)
    return rng.standard_normal((m, k)).astype(np.float32), w, wf, rng.uniform(0.5, 1.5, k).astype(np.float32)


def bound(qtype: str, wf: np.ndarray, xn: np.ndarray) -> np.ndarray:
    """The product's error bound at x = xn, plus the norm's own float32 rounding."""
    top = levels(qtype, xn.shape[0]) if fusion_enabled() else 0
    return tolerance(wf, xn, top) + 1e-5 * (np.abs(xn) @ np.abs(wf).T)


def fused_count(run: Callable[[], Any], want: int) -> None:
    if fusion_enabled():
        assert launches(run) == want


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_rms_norm_in_front(qtype: str, m: int) -> None:
    x, w, wf, g = setup(qtype, m, 37, seed=m)
    xn = rms(x.astype(np.float64), g)

    def run() -> np.ndarray:
        return qlinear(F.rms_norm(from_numpy(x), from_numpy(g), EPS), w).numpy()
    within(run(), xn @ wf.T, bound(qtype, wf, xn))
    fused_count(run, 1)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_layer_norm_in_front(qtype: str, m: int) -> None:
    x, w, wf, g = setup(qtype, m, 41, seed=10 + m)
    b = np.random.default_rng(5).standard_normal(x.shape[1]).astype(np.float32)
    xn = layer(x.astype(np.float64), g, b)

    def run() -> np.ndarray:
        return qlinear(F.layer_norm(from_numpy(x), from_numpy(g), from_numpy(b), EPS), w).numpy()
    within(run(), xn @ wf.T, bound(qtype, wf, xn))
    fused_count(run, 1)


@pytest.mark.parametrize("qtype", ["Q8_0", "F16"])
@pytest.mark.parametrize("m", [1, 3])
def test_residual_sum_is_stored_by_the_matmul(qtype: str, m: int) -> None:
    """A decoder layer's norm: the residual sum h = a + b (which Python keeps) is fused
    into the norm, stored as the group stored it, and the matmul's epilogue adds h."""
    a, w, wf, g = setup(qtype, m, width(qtype), seed=20 + m)  # square: the epilogue adds h
    b = np.random.default_rng(6).standard_normal(a.shape).astype(np.float32)
    h64 = a.astype(np.float64) + b
    xn = rms(h64, g)
    results: list[np.ndarray] = []

    def run() -> None:
        h = from_numpy(a) + from_numpy(b)
        y = h + qlinear(F.rms_norm(h, from_numpy(g), EPS), w)
        results[:] = [y.numpy(), h.numpy()]
    fused_count(run, 1)
    run()
    within(results[0], xn @ wf.T + h64, bound(qtype, wf, xn) + 1e-6 * np.abs(h64))
    np.testing.assert_allclose(results[1], h64, rtol=1e-6, atol=1e-6)


def test_several_matmuls_on_one_norm() -> None:
    """q, k and v: three widths, so three kernels, each computing the norm; the residual
    sum is stored once; gate and up, one kernel with both weights and an epilogue."""
    m = 1
    a, wq, fq, g = setup("Q4_1", m, 96, seed=30)
    wk, fk = matrix("Q4_1", 32, 96, 31)
    wv, fv = matrix("Q4_1", 32, 96, 32)
    wg, fg = matrix("Q4_1", 64, 96, 33)
    wu, fu = matrix("Q4_1", 64, 96, 34)
    for t in (wk, wv, wg, wu):
        t.realize()
    b = np.random.default_rng(7).standard_normal(a.shape).astype(np.float32)
    h64 = a.astype(np.float64) + b
    xn = rms(h64, g)
    results: list[np.ndarray] = []

    def record() -> tuple[braze.Tensor, ...]:  # x is not held by Python when they flush
        h = from_numpy(a) + from_numpy(b)
        xt = F.rms_norm(h, from_numpy(g), EPS)
        return qlinear(xt, wq), qlinear(xt, wk), qlinear(xt, wv), F.silu(qlinear(xt, wg)) * qlinear(xt, wu), h

    def run() -> None:
        results[:] = [t.numpy() for t in record()]
    fused_count(run, 4)
    run()
    for got, wf in zip(results[:3], (fq, fk, fv)):
        within(got, xn @ wf.T, bound("Q4_1", wf, xn))
    gate, up = xn @ fg.T, xn @ fu.T
    silu = gate / (1 + np.exp(-gate))
    within(results[3], silu * up, 1.1 * np.abs(up) * bound("Q4_1", fg, xn) + np.abs(silu) * bound("Q4_1", fu, xn))
    np.testing.assert_allclose(results[4], h64, rtol=1e-6, atol=1e-6)


def test_a_norm_read_elsewhere_is_stored() -> None:
    """The norm's result also feeds a row sum (a kernel of its own, reading it after the
    norm closed at the matmul): not folded, stored, still right."""
    x, w, wf, g = setup("Q8_0", 3, 37, seed=40)
    xn = rms(x.astype(np.float64), g)

    def run() -> np.ndarray:
        xt = F.rms_norm(from_numpy(x), from_numpy(g), EPS)
        return (qlinear(xt, w) + xt.sum(-1, keepdim=True)).numpy()
    fused_count(run, 3)  # the norm, the sum, the matmul with the add as its epilogue
    within(run(), xn @ wf.T + xn.sum(-1, keepdims=True), bound("Q8_0", wf, xn) + 1e-5)


def test_a_norm_python_keeps_is_stored() -> None:
    x, w, wf, g = setup("Q4_1", 1, 37, seed=45)
    xn = rms(x.astype(np.float64), g)
    xt = F.rms_norm(from_numpy(x), from_numpy(g), EPS)
    y = qlinear(xt, w)
    within(y.numpy(), xn @ wf.T, bound("Q4_1", wf, xn))
    np.testing.assert_allclose(xt.numpy(), xn, rtol=1e-5, atol=1e-6)


def test_a_write_between_keeps_the_norm_first() -> None:
    """The norm's input written in place after the matmul and before its consumer: the
    epilogue moves the matmul past the write, but the norm cannot follow it there."""
    x, w, wf, g = setup("Q4_1", 2, 37, seed=50)
    xn = rms(x.astype(np.float64), g)
    xt = from_numpy(x.copy())
    y = qlinear(F.rms_norm(xt, from_numpy(g), EPS), w)
    xt.add_(1.0)
    within((y + 1).numpy(), xn @ wf.T + 1, bound("Q4_1", wf, xn))


def test_many_rows_read_x_from_memory() -> None:
    """Prefill's rows (more than quant.FEW): the norm stays a kernel of its own (the
    matmul's kernel is generic in its rows)."""
    x, w, wf, g = setup("Q4_K", 9, 37, seed=60)
    xn = rms(x.astype(np.float64), g)

    def run() -> np.ndarray:
        return qlinear(F.rms_norm(from_numpy(x), from_numpy(g), EPS), w).numpy()
    within(run(), xn @ wf.T, bound("Q4_K", wf, xn))
    fused_count(run, 2)


def test_the_decoding_steps_norms_are_in_its_matmuls(smollm: Any) -> None:
    """SmolLM2's decoding step: every RMSNorm a matmul reads (two a layer, and the last)
    is part of the matmuls' kernels, but one a flush boundary leaves Python holding;
    greedy tokens are the reference executor's (test_models checks them too)."""
    if not fusion_enabled():
        pytest.skip("counts fused kernels")
    model = smollm.model
    hidden, layers = model.config.dim, model.config.n_layers
    caches = model.new_cache(64)
    model(braze.tensor([[1, 2, 3]]), caches, last_only=True).numpy()
    seen: list[Any] = []
    plan.observers.append(seen)
    try:
        from braze.generate import DecodeStep
        DecodeStep(model, caches, capture=False)(5)
    finally:
        plan.observers.remove(seen)
    kernels = [s.step.kernel for ran in seen for s in ran.plan.steps]
    norms = [k for k in kernels if isinstance(k, ir.Kernel) and k.inner == (hidden,)
             and any(isinstance(st, ir.Reduce) for st in k.stages)]
    fed = [k for k in kernels if isinstance(k, ir.QLinear) and k.prologue is not None]
    assert len(norms) <= 1, len(norms)
    # q, k, v (three widths: three kernels), gate and up (one), the output head
    assert len(fed) >= 4 * layers + 1 - 3, len(fed)
