"""What the braze.nn tests share (``test_nn_module.py``, ``test_nn_layers.py``,
``test_nn_attention.py``): seeded float32 inputs and the comparison with numpy oracles.

Every oracle computes in float64 from the same float32 inputs braze sees; braze computes
in float32. Tolerances: elementwise layers (norms, rotary, embedding) rtol/atol 1e-5;
layers with sums over a dim of <= 64 terms (Linear, attention, MLP) rtol/atol 1e-4;
comparing two braze float32 paths that sum in different orders (cached decode vs one
call) atol 1e-5.
"""

from __future__ import annotations

import numpy as np

import braze

RTOL_ELEM = ATOL_ELEM = 1e-5
RTOL_SUM = ATOL_SUM = 1e-4


def seeded(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def randf32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def as_tensor(a: np.ndarray) -> braze.Tensor:
    return braze.tensor(a)


def assert_close(got: braze.Tensor | np.ndarray, want: np.ndarray, rtol: float = RTOL_SUM,
                 atol: float = ATOL_SUM) -> None:
    g = got.numpy() if isinstance(got, braze.Tensor) else got
    assert g.shape == want.shape, (g.shape, want.shape)
    np.testing.assert_allclose(g.astype(np.float64), want, rtol=rtol, atol=atol)
