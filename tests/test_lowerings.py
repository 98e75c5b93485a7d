"""Lowerings of what used to be extern steps: float->int casts, gathers (``gather``,
``take_along_dim``, ``index_select``, embeddings) with bounds-checked indices, ``cumsum``
along rows and ``topk`` of small k. Each is checked against the reference executor
(``BRAZE_FUSION=0``), at several shapes of one program (generic kernels), and for the
number of kernels it takes with a producer and a consumer.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
from braze.errors import IndexOutOfRange
from braze.runtime.cpu import compiler_available

needs_cc = pytest.mark.skipif(not compiler_available(), reason="no C compiler")


def both(fn: Callable[..., Any], *arrays: np.ndarray, monkeypatch: Any) -> tuple[list[np.ndarray], dict[str, int]]:
    """``fn`` fused (its outputs and stats) after checking it against the reference."""
    def go() -> tuple[list[np.ndarray], dict[str, int]]:
        braze.reset_stats()
        out = fn(*[braze.from_numpy(a) for a in arrays])
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.numpy().copy() for o in outs], braze.stats()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref, _ = go()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "1")
        got, st = go()
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)
    return got, st


# -- float -> int casts ----------------------------------------------------------------------

SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 2.5, -2.5, 127.9, -128.9, 255.5, 300, -1,
                    2147483647.0, 2147483648.0, -2147483649.0, 9.3e18, -9.3e18, 0.0, -0.0, 65504.0])


@pytest.mark.parametrize("src", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("to", ["int8", "uint8", "int16", "int32", "int64"])
def test_float_to_int_truncates_saturates_and_maps_nan_to_zero(src: str, to: str, monkeypatch: Any) -> None:
    s, d = getattr(braze, src), getattr(braze, to)
    got, st = both(lambda x: ((x.to(s) * 1.0).to(d) + 1), SPECIAL, monkeypatch=monkeypatch)
    info = np.iinfo(d.np)
    want = np.array([0, info.max, info.min], np.int64) + 1
    assert (got[0][:3].astype(np.int64) == want.astype(d.np).astype(np.int64)).all()
    if compiler_available():
        assert st["kernel_launches"] == 1, st  # the cast to float, the multiply, the cast to int and the add


@needs_cc
def test_a_float_to_int_cast_is_fused_at_every_shape(monkeypatch: Any) -> None:
    rng = np.random.default_rng(0)
    for shape in [(5, 7), (33, 100), (2, 3, 300)]:
        a = (rng.standard_normal(shape) * 100).astype(np.float32)
        _, st = both(lambda x: (x.abs() * 3 - 7).to(braze.int32) * 2, a, monkeypatch=monkeypatch)
        assert st["kernel_launches"] == 1
    # a strided view
    a = (rng.standard_normal((40, 30)) * 100).astype(np.float32)
    _, st = both(lambda x: x.T[::2].to(braze.int16), a, monkeypatch=monkeypatch)
    assert st["kernel_launches"] == 1
