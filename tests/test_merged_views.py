"""Views that merge dims no stride can express (``repeat_kv``'s expand and reshape, a
transpose flattened): the copy the reshape records is read through by its consumer at
an index with a floor division, never stored; a row coordinate so divided is split in
two loops (``schedule/split.py``), so attention over repeated KV heads is the same one
kernel as ``enable_gqa``."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.runtime.cpu import compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")


def repeat_kv(x: braze.Tensor, n: int) -> braze.Tensor:
    """As Hugging Face's Llama writes it."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def np_repeat_kv(x: np.ndarray, n: int) -> np.ndarray:
    return np.repeat(x, n, axis=1)


def _fused(fn: Callable[..., braze.Tensor], *arrays: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    braze.reset_stats()
    out = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
    return out, braze.stats()


K = np.random.default_rng(1).standard_normal((2, 3, 5, 4)).astype(np.float32)

CASES: list[tuple[str, Callable[[braze.Tensor], braze.Tensor], Callable[[np.ndarray], np.ndarray], int]] = [
    ("repeat_kv * 2 + 1", lambda x: repeat_kv(x, 2) * 2 + 1, lambda x: np_repeat_kv(x, 2) * 2 + 1, 1),
    ("repeat_kv sliced", lambda x: repeat_kv(x, 3)[:, 1:] - 1, lambda x: np_repeat_kv(x, 3)[:, 1:] - 1, 1),
    ("repeat_kv summed", lambda x: repeat_kv(x, 2).sum(-1), lambda x: np_repeat_kv(x, 2).sum(-1), 1),
    ("repeat_kv transposed", lambda x: repeat_kv(x, 2).transpose(1, 2) * 1.5,
     lambda x: np_repeat_kv(x, 2).transpose(0, 2, 1, 3) * 1.5, 1),
    ("transpose flattened", lambda x: x.transpose(1, 2).reshape(2, 5, 12) + 1,
     lambda x: x.transpose(0, 2, 1, 3).reshape(2, 5, 12) + 1, 1),
]


@pytest.mark.parametrize("name,fn,ref,kernels", CASES, ids=[c[0] for c in CASES])
def test_a_merged_view_is_read_through(name: str, fn: Any, ref: Any, kernels: int, monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")
    got, st = _fused(fn, K)
    np.testing.assert_allclose(got, ref(K.astype(np.float64)), rtol=1e-6, atol=1e-6)
    assert st["kernel_launches"] == kernels, st
    monkeypatch.setenv("BRAZE_FUSION", "0")
    np.testing.assert_allclose(_fused(fn, K)[0], got, rtol=1e-6, atol=1e-6)


def test_a_recomputed_value_read_through_a_merging_reshape(monkeypatch: Any) -> None:
    """A value of the index alone read as one long dim: each element from both of its
    coordinates (this read row 1's first elements as row 0's, silently, before)."""
    monkeypatch.setenv("BRAZE_FUSION", "1")
    x = np.arange(32, dtype=np.float32)

    def prog(x: braze.Tensor) -> braze.Tensor:
        m = (braze.arange(4)[:, None] * 10 + braze.arange(8)[None, :]).to(braze.float32)
        return m.reshape(32) + x

    got, st = _fused(prog, x)
    np.testing.assert_array_equal(got, (np.arange(4)[:, None] * 10 + np.arange(8)[None, :]).reshape(32) + x)
    assert st["kernel_launches"] == 1


def _hf_attention(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """Causal attention as Hugging Face's eager path writes it: repeat_kv, a mask
    from aranges, softmax with ``max(dim)[0]``."""
    n = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n), repeat_kv(v, n)
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1])
    s = s.masked_fill(braze.arange(S)[None, :] > braze.arange(L)[:, None] + (S - L), -math.inf)
    s = s - s.max(dim=-1, keepdim=True)[0]
    p = s.exp()
    return (p / p.sum(-1, keepdim=True)) @ v


def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    n = q.shape[1] // k.shape[1]
    k, v = np_repeat_kv(k, n), np_repeat_kv(v, n)
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    s = np.where(np.arange(S)[None, :] > np.arange(L)[:, None] + (S - L), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("q_len,kv_len", [(150, 150), (1, 300), (5, 77)])
def test_attention_with_repeat_kv_is_one_kernel(q_len: int, kv_len: int, monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")
    rng = np.random.default_rng(q_len)
    q = rng.standard_normal((1, 6, q_len, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, kv_len, 32)).astype(np.float32) for _ in range(2))
    got, st = _fused(_hf_attention, q, k, v)
    assert st["kernel_launches"] == 1, st
    # above what was live before (other tests' tensors too), only the output: no repeated
    # keys or values, no (queries x keys) scores
    assert st["peak_bytes"] - st["live_bytes"] <= got.nbytes, st
    np.testing.assert_allclose(got, _np_attention(q.astype(np.float64), k, v), atol=2e-5, rtol=0)
    if q_len in (1, kv_len):  # where SDPA's top-left causal mask is the same one
        gqa, _ = _fused(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=q_len > 1, enable_gqa=True),
                        q, k, v)
        np.testing.assert_allclose(got, gqa, atol=2e-5, rtol=0)


def test_repeat_kv_of_keys_made_in_the_flush(monkeypatch: Any) -> None:
    """Keys computed in the same flush (a projection's result, then rotated): read
    through where the producing kernel stored them."""
    monkeypatch.setenv("BRAZE_FUSION", "1")
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 4, 20, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 20, 16)).astype(np.float32) for _ in range(2))
    got, st = _fused(lambda q, k, v: _hf_attention(q, (k * 0.5).exp(), v + 1), q, k, v)
    np.testing.assert_allclose(got, _np_attention(q.astype(np.float64), np.exp(k * 0.5), v + 1), atol=2e-5, rtol=0)
    assert st["kernel_launches"] <= 3, st  # keys, values, attention: nothing repeated in memory
