"""Random programs in the shape of model code, fused against the reference executor.

Each program mixes, in one flush, element-wise work with broadcasting, reductions and
their indices, softmax, copies through views (a transpose made contiguous, a reshape
round trip, a clone) and in-place writes into given tensors and intermediates; every
value it made and every given tensor's final contents must be what the reference
executor (``BRAZE_FUSION=0``, op by op) gives. A differential fuzz campaign of this
kind found four old bugs of the fused executor at once (two silent wrong answers)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import braze

Step = tuple[int, int, int, float]
SHAPES = [(3, 4), (3, 4), (4,)]


def _program(steps: list[Step], given_: list[Any]) -> list[Any]:
    vals = list(given_)
    for kind, i, j, c in steps:
        x, y = vals[i % len(vals)], vals[j % len(vals)]
        full = x.shape == (3, 4)
        if kind == 0:
            vals.append(x + y * c)
        elif kind == 1:
            vals.append((x * c).exp() - y)
        elif kind == 2:
            vals.append(x.amax(0 if full and c > 0 else -1, keepdim=True) - y)
        elif kind == 3:
            vals.append(braze.softmax(x * c, -1))
        elif kind == 4 and full:
            vals.append(x.T.contiguous().T * c + y)
        elif kind == 5:
            vals.append(x.reshape(-1).reshape(x.shape).clone() - c)
        elif kind == 6 and full:
            vals.append(x.max(0)[1].to(braze.float32) * c + y)
        elif kind == 7:
            vals.append(braze.where(x > y, x, c))
        elif kind == 8 and full and len(np.broadcast_shapes(x.shape, y.shape)) == 2:
            x.add_(y * c)
        elif kind == 9 and full:
            x[1] = c
        else:
            vals.append(x.sum(-1, keepdim=True) * c + y)
    return vals


def _run(steps: list[Step], arrays: list[np.ndarray], fused: bool) -> list[np.ndarray]:
    old = os.environ.get("BRAZE_FUSION")
    os.environ["BRAZE_FUSION"] = "1" if fused else "0"
    try:
        given_ = [braze.tensor(a.copy()) for a in arrays]
        vals = _program(steps, given_)
        return [v.numpy().copy() for v in vals[len(given_):]] + [t.numpy().copy() for t in given_]
    finally:
        if old is None:
            del os.environ["BRAZE_FUSION"]
        else:
            os.environ["BRAZE_FUSION"] = old


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 10), st.integers(0, 12), st.integers(0, 12),
                                st.sampled_from([0.5, -1.0, 2.0])), min_size=1, max_size=8),
       seed=st.integers(0, 3))
def test_random_programs_fused_as_the_reference(steps: list[Step], seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    got = _run(steps, arrays, fused=True)
    want = _run(steps, arrays, fused=False)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, i
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, equal_nan=True, err_msg=f"value {i}")
