"""braze.nn's Linear, Embedding, RMSNorm, LayerNorm, normalize and SwiGLU against numpy
formulas written here (``nn_oracle.py``: inputs, tolerances)."""

from __future__ import annotations

import numpy as np
import pytest

import braze
import braze.nn as nn
import braze.nn.functional as F
from nn_oracle import ATOL_ELEM, RTOL_ELEM, as_tensor, assert_close, randf32, seeded


# =========================================================================================
# Linear, Embedding, norms
# =========================================================================================

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
def test_linear(bias: bool, shape: tuple[int, ...]) -> None:
    rng = seeded(3)
    lin = nn.Linear(8, 6, bias=bias)
    assert lin.weight.shape == (6, 8)
    w, b = randf32(rng, 6, 8), randf32(rng, 6)
    sd = {"weight": as_tensor(w)}
    if bias:
        sd["bias"] = as_tensor(b)
    else:
        assert lin.bias is None
        assert [n for n, _ in lin.named_parameters()] == ["weight"]
    lin.load_state_dict(sd)
    x = randf32(rng, *shape)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    if bias:
        want = want + b
    assert_close(lin(as_tensor(x)), want)


def test_linear_from_weights() -> None:
    rng = seeded(4)
    w, b = randf32(rng, 7, 5), randf32(rng, 7)
    wt, bt = as_tensor(w), as_tensor(b)
    lin = nn.Linear.from_weights(wt, bt)
    assert lin.weight is wt and lin.bias is bt
    assert (lin.in_features, lin.out_features) == (5, 7)
    x = randf32(rng, 2, 4, 5)
    assert_close(lin(as_tensor(x)), x.astype(np.float64) @ w.T.astype(np.float64) + b)
    nobias = nn.Linear.from_weights(wt)
    assert_close(nobias(as_tensor(x)), x.astype(np.float64) @ w.T.astype(np.float64))
    assert [n for n, _ in nobias.named_parameters()] == ["weight"]


def test_embedding() -> None:
    rng = seeded(5)
    w = randf32(rng, 11, 4)
    emb = nn.Embedding(11, 4)
    emb.load_state_dict({"weight": as_tensor(w)})
    ids = np.array([[0, 3, 10], [7, 7, 1]], dtype=np.int64)
    out = emb(braze.tensor(ids))
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out.numpy(), np.take(w, ids, axis=0))
    ids1 = np.array([2, 9], dtype=np.int64)
    np.testing.assert_array_equal(nn.Embedding.from_weights(as_tensor(w))(braze.tensor(ids1)).numpy(), w[ids1])


def _rms_np(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _ln_np(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm(eps: float) -> None:
    rng = seeded(6)
    x, w = randf32(rng, 2, 3, 16, scale=0.3), randf32(rng, 16)
    norm = nn.RMSNorm(16, eps=eps)
    assert_close(norm(as_tensor(x)), _rms_np(x, np.ones(16), eps), RTOL_ELEM, ATOL_ELEM)
    norm.load_state_dict({"weight": as_tensor(w)})
    assert_close(norm(as_tensor(x)), _rms_np(x, w, eps), RTOL_ELEM, ATOL_ELEM)
    assert_close(nn.RMSNorm.from_weights(as_tensor(w), eps)(as_tensor(x)), _rms_np(x, w, eps), RTOL_ELEM, ATOL_ELEM)


def test_rms_norm_eps_matters() -> None:
    # small inputs: eps dominates mean(x^2), so the two results differ a lot
    x = np.full((1, 4), 1e-3, np.float32)
    a = nn.RMSNorm(4, eps=1e-12)(as_tensor(x)).numpy()
    b = nn.RMSNorm(4, eps=1.0)(as_tensor(x)).numpy()
    assert_close(a, _rms_np(x, np.ones(4), 1e-12), RTOL_ELEM, ATOL_ELEM)
    assert_close(b, _rms_np(x, np.ones(4), 1.0), RTOL_ELEM, ATOL_ELEM)
    assert abs(a[0, 0] - 1.0) < 1e-4 and b[0, 0] < 2e-3


@pytest.mark.parametrize("eps", [1e-5, 0.25])
def test_layer_norm(eps: float) -> None:
    rng = seeded(7)
    x, w, b = randf32(rng, 3, 5, 12, scale=2.0) + 1.0, randf32(rng, 12), randf32(rng, 12)
    norm = nn.LayerNorm(12, eps=eps)
    assert_close(norm(as_tensor(x)), _ln_np(x, None, None, eps), RTOL_ELEM, ATOL_ELEM)
    norm.load_state_dict({"weight": as_tensor(w), "bias": as_tensor(b)})
    assert_close(norm(as_tensor(x)), _ln_np(x, w, b, eps), RTOL_ELEM, ATOL_ELEM)
    nb = nn.LayerNorm(12, eps=eps, bias=False)
    assert nb.bias is None
    assert_close(nb(as_tensor(x)), _ln_np(x, None, None, eps), RTOL_ELEM, ATOL_ELEM)
    assert_close(nn.LayerNorm.from_weights(as_tensor(w), None, eps)(as_tensor(x)), _ln_np(x, w, None, eps), RTOL_ELEM, ATOL_ELEM)


def test_normalize() -> None:
    rng = seeded(8)
    x = randf32(rng, 4, 6)
    x[1] = 0.0  # the clamp keeps an all-zero row at zero (no NaN), as torch
    xd = x.astype(np.float64)
    want = xd / np.maximum(np.linalg.norm(xd, axis=-1, keepdims=True), 1e-12)
    assert_close(F.normalize(as_tensor(x)), want, RTOL_ELEM, ATOL_ELEM)
    want0 = xd / np.maximum(np.linalg.norm(xd, axis=0, keepdims=True), 1e-12)
    assert_close(F.normalize(as_tensor(x), dim=0), want0, RTOL_ELEM, ATOL_ELEM)
    np.testing.assert_array_equal(F.normalize(as_tensor(x)).numpy()[1], np.zeros(6, np.float32))


# =========================================================================================
# SwiGLU
# =========================================================================================

def test_swiglu() -> None:
    rng = seeded(23)
    mlp = nn.SwiGLU(8, 20)
    names = [n for n, _ in mlp.named_parameters()]
    assert names == ["gate.weight", "up.weight", "down.weight"]
    sd = {k: as_tensor(randf32(rng, *v.shape, scale=0.5)) for k, v in mlp.state_dict().items()}
    mlp.load_state_dict(sd)
    x = randf32(rng, 2, 3, 8)
    w = {k: v.numpy().astype(np.float64) for k, v in sd.items()}
    xd = x.astype(np.float64)
    g = xd @ w["gate.weight"].T
    want = ((g / (1 + np.exp(-g))) * (xd @ w["up.weight"].T)) @ w["down.weight"].T
    assert_close(mlp(as_tensor(x)), want)
    mlp2 = nn.SwiGLU.from_layers(*(nn.Linear.from_weights(sd[f"{n}.weight"]) for n in ("gate", "up", "down")))
    assert_close(mlp2(as_tensor(x)), want)
    biased = nn.SwiGLU(8, 20, bias=True)
    assert [n for n, _ in biased.named_parameters()] == [
        "gate.weight", "gate.bias", "up.weight", "up.bias", "down.weight", "down.bias"]
