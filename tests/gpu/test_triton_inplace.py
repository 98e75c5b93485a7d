"""In-place writes stored by the group computing what they write, in Triton kernels
(row kernels held in registers and walked in blocks), against the reference executor."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import braze

from test_inplace_fused import CASES  # the programs of the CPU tests (tests/ is on the path)

#: the programs whose writes the Triton target stores in place, or refuses to (a copy)
NAMES = ["masked_write_given", "masked_write_pending", "masked_fill_given", "iadd_pending", "read_before_write_given",
         "repeated_writes", "two_views", "overlapping_views_given", "shifted_read", "shifted_read_given",
         "row_value_into_read_target", "row_value_in_place", "softmax_plus_old", "max_after_masked_write",
         "two_targets", "gather_after_write", "cumsum_in_place", "half_masked_write", "scalar_in_place"]


@pytest.fixture(params=["held", "walked"])
def rows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from braze.codegen import triton as render
    from braze.runtime import cuda as runtime
    if request.param == "walked":
        monkeypatch.setattr(render, "PERSISTENT_MAX", 0)
    runtime.clear()
    yield
    runtime.clear()


def _results(fn: object, arrays: list[np.ndarray], device: str) -> list[np.ndarray]:
    ts = [braze.tensor(a.copy(), device=device) for a in arrays]
    out = fn(*ts)  # type: ignore[operator]
    outs = list(out) if isinstance(out, tuple) else [out]
    return [o.numpy() for o in outs] + [t.numpy() for t in ts]


@pytest.mark.parametrize("name", NAMES)
def test_in_place_writes(monkeypatch: pytest.MonkeyPatch, name: str, rows: None) -> None:
    fn, _, arrays, _ = CASES[name]
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = _results(fn, arrays, "cpu")
    monkeypatch.setenv("BRAZE_FUSION", "1")
    got = _results(fn, arrays, "cuda")
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)
