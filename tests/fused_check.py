"""One check that fused tests share: a program's step count fused, and its result against
the reference executor (and numpy, where the test has an oracle)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import braze


def check_fused(fn: Callable[..., braze.Tensor], arrays: list[np.ndarray], kernels: int, monkeypatch: Any,
                want: np.ndarray | None = None, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """``fn`` fused takes ``kernels`` steps (kernels and extern steps) and gives what the
    reference executor gives (and ``want``, with its shape, where given)."""
    braze.reset_stats()
    got = fn(*[braze.from_numpy(a.copy()) for a in arrays]).numpy().copy()
    assert braze.stats()["kernel_launches"] == kernels, braze.stats()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = fn(*[braze.from_numpy(a.copy()) for a in arrays]).numpy()
    if want is None:
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
        return
    assert got.dtype == ref.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=atol)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)
