"""Decoding attention's narrow chain kernel (``codegen/chain.py``): a few query rows per
KV head (GQA groups of 1, 3, 4, 8) against a preallocated cache whose keys past the
step's position are masked. On two threads the live keys (``live_keys``: up to the last
tile that is not all masked) are split between the threads when the heads would not
share them evenly; tiles past the position are still walked and skipped. Every case
against the reference executor, at odd positions and across the key tile (96)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze import plan
from braze.runtime.cpu import compiler_available, get_num_threads, set_num_threads

pytestmark = pytest.mark.skipif(not compiler_available(), reason="needs a C compiler")

HKV, M, D = 3, 640, 64  # 640 keys: 7 tiles, the last one partial


def _run(fn: Callable[..., braze.Tensor], arrays: list[np.ndarray], threads: int,
         monkeypatch: Any) -> tuple[np.ndarray, np.ndarray]:
    """(fused result on ``threads`` threads, reference result)."""
    old = get_num_threads()
    set_num_threads(threads)
    try:
        plan.clear()
        got = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
    finally:
        set_num_threads(old)
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
    return got, ref


def _qkv(group: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, HKV * group, 1, D)).astype(np.float32)
    k, v = (rng.standard_normal((1, HKV, M, D)).astype(np.float32) for _ in range(2))
    k[0, 1] *= 4  # one head with larger scores: the running max moves across tiles
    return [q, k, v]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pos", [1, 95, 96, 97, 301, 577, 640])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decoding_against_a_masked_cache(group: int, pos: int, threads: int, monkeypatch: Any) -> None:
    def step(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
        mask = braze.arange(M)[None, :] < pos  # the positions written so far
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got, ref = _run(step, _qkv(group, pos), threads, monkeypatch)
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_decoding_with_a_mask_per_head(threads: int, monkeypatch: Any) -> None:
    """A mask read from memory, different per query head (per KV head the live keys
    differ: each task's are scanned), one head with every key masked (nan, as the
    reference gives), one whose keys end at a tile boundary."""
    group = 3
    lengths = np.array([0, 96, 97, 5, 640, 300, 577, 1, 200])
    mask = np.arange(M)[None, None, None, :] < lengths[None, :, None, None]

    def step(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor, m: braze.Tensor) -> braze.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    got, ref = _run(step, [*_qkv(group, 3), mask], threads, monkeypatch)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[0, 0]).all() and not np.isnan(got[0, 1:]).any()
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pos", [1, 15, 17, 97, 640])
@pytest.mark.parametrize("d", [24, 64])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decoding_reads_a_half_cache_where_it_lies(dtype: str, d: int, pos: int, threads: int,
                                                   monkeypatch: Any) -> None:
    """A float16 or bfloat16 cache (``braze generate``'s is float16), its first ``pos``
    positions cast to float32 as the model reads them: the narrow kernel multiplies by its rows where they lie, a few
    rows at a time converted (``braze_mm_nt_h``, ``braze_mm_h``; chunks of 16 rows, so
    positions around 16 and a head dim that is not a multiple of 16 reach every tail),
    and gives the float32 attention of the rounded cache, as the reference does."""
    group = 3
    rng = np.random.default_rng(pos + d)
    q = rng.standard_normal((1, HKV * group, 1, d)).astype(np.float32)
    half = getattr(braze, dtype)
    k, v = (braze.from_numpy(rng.standard_normal((1, HKV, M, d)).astype(np.float32)).to(half).numpy()
            for _ in range(2))

    def step(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:  # as KVCache.append reads
        k, v = (c[:, :, :pos].to(braze.float32) for c in (k, v))
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got, ref = _run(step, [q, k, v], threads, monkeypatch)
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)
