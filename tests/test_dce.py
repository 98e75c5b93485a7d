"""Dead code elimination: what nothing reads is not computed by the fused executor
(``schedule/dce.py``); results and errors of what is read are unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import braze
import braze.plan as planmod
from braze import from_numpy
from braze.stream import fusion_enabled

fused_only = pytest.mark.skipif(not fusion_enabled(), reason="the fused executor's plans (BRAZE_FUSION=0 runs everything)")


def _kinds() -> list[str]:
    return [f"extern {s.node}" if isinstance(s, planmod.ExternStep) else type(s.step.kernel).__name__
            for p in planmod.stored_plans() for s in p.steps]


def _softmax_np(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_max_values_softmax_is_one_kernel_without_the_argmax() -> None:
    a = np.random.default_rng(0).standard_normal((33, 70)).astype(np.float32)
    planmod.clear()

    def softmax(x: Any) -> Any:
        e = (x - x.max(dim=-1, keepdim=True)[0]).exp()
        return e / e.sum(-1, keepdim=True)

    got = softmax(from_numpy(a)).numpy()
    np.testing.assert_allclose(got, _softmax_np(a), rtol=1e-5, atol=1e-6)
    if fusion_enabled():
        assert _kinds() == ["Kernel"]


def test_attention_written_with_max_values_is_one_chain_kernel() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 40, 16)).astype(np.float32) for _ in range(3))

    def attention(q: Any, k: Any, v: Any) -> Any:  # its intermediates die with its frame
        s = q @ k.mT * 0.25
        p = (s - s.max(dim=-1, keepdim=True).values).exp()
        return (p / p.sum(-1, keepdim=True)) @ v

    planmod.clear()
    got = attention(from_numpy(q), from_numpy(k), from_numpy(v)).numpy()
    np.testing.assert_allclose(got, _softmax_np(q @ k.transpose(0, 2, 1) * 0.25) @ v, rtol=1e-4, atol=1e-5)
    if fusion_enabled():
        assert _kinds() == ["Kernel"]


@fused_only
def test_a_dropped_chain_of_values_runs_nothing() -> None:
    x = from_numpy(np.ones((8, 8), np.float32))
    keep = (x + 1) * 3
    y = (x * 2).exp()
    _ = (y + 1).argmax(-1)  # never read (an argmax has no kernel: it would be an extern step)
    del y, _
    planmod.clear()
    np.testing.assert_array_equal(keep.numpy(), np.full((8, 8), 6, np.float32))
    assert _kinds() == ["Kernel"]


def test_both_results_of_max_when_both_are_read() -> None:
    a = np.random.default_rng(2).standard_normal((5, 9)).astype(np.float32)
    vals, idx = from_numpy(a).max(dim=1)
    np.testing.assert_array_equal(vals.numpy(), a.max(1))
    np.testing.assert_array_equal(idx.numpy(), a.argmax(1))


def test_an_in_place_write_is_never_dead() -> None:
    buf = braze.zeros(4, 3)
    src = from_numpy(np.arange(3, dtype=np.float32))
    buf[2] = src * 2  # nothing reads the write in this flush, but buf outlives it
    np.testing.assert_array_equal(buf.numpy()[2], [0, 2, 4])
