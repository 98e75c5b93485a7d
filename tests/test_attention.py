"""Reduction fusion with repair terms: attention written as user code is one kernel.

Every variant Neptune evaluates is written here as ordinary tensor code (no per-variant
code in braze) and must (1) run as one chain kernel and (2) agree with the reference
executor. Tolerances: float32 attention outputs are averages of values of size ~1, and
the fused kernel sums in another order (tiles, FMA): 2e-5 absolute.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze import plan
from braze.runtime.cpu import compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")

ATOL = 2e-5
B, H, HKV, N, D = 1, 4, 2, 150, 32  # N not a multiple of the key tile; 2 query heads per KV head


@pytest.fixture(autouse=True)
def fused(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")


def _inputs(seed: int = 0, n_q: int = N, n_kv: int = N, hkv: int = H) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, H, n_q, D)).astype(np.float32),
            rng.standard_normal((B, hkv, n_kv, D)).astype(np.float32),
            rng.standard_normal((B, hkv, n_kv, D)).astype(np.float32)]


def _run(fn: Callable[..., braze.Tensor], arrays: list[np.ndarray], monkeypatch: Any) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(fused result, reference result, fused counters)."""
    braze.reset_stats()
    got = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
    st = braze.stats()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
    return got, ref, st


def _ij(n_q: int, n_kv: int) -> tuple[braze.Tensor, braze.Tensor]:
    return braze.arange(n_q)[:, None], braze.arange(n_kv)[None, :]


def plain(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    return braze.softmax(q @ k.mT / math.sqrt(D), -1) @ v


def causal(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def alibi(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    slopes = braze.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])[:, None, None]
    i, j = _ij(q.shape[-2], k.shape[-2])
    return braze.softmax(q @ k.mT * D ** -0.5 + slopes * (j - i).float(), -1) @ v


def gqa(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """Each KV head serves H // HKV query heads through views: (B, HKV, G, N, D) @ k^T."""
    g = q.shape[1] // k.shape[1]
    qg = q.reshape(B, k.shape[1], g, q.shape[-2], D)
    out = braze.softmax(qg @ k.unsqueeze(2).mT * D ** -0.5, -1) @ v.unsqueeze(2)
    return out.reshape(B, q.shape[1], q.shape[-2], D)


def gqa_sdpa(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)


def softcap(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    s = q @ k.mT * D ** -0.5
    return braze.softmax((s / 5.0).tanh() * 5.0, -1) @ v


def sliding_window(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    i, j = _ij(q.shape[-2], k.shape[-2])
    hidden = (j > i) | (i - j >= 16)
    return braze.softmax((q @ k.mT * D ** -0.5).masked_fill(hidden, -math.inf), -1) @ v


def bool_mask_input(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    keep = braze.from_numpy(np.random.default_rng(5).random((q.shape[-2], k.shape[-2])) < 0.7)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def additive_mask_input(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """Causal as Hugging Face models write it: an additive 0 / -inf mask input (N, N)."""
    mask = np.triu(np.full((q.shape[-2], k.shape[-2]), -np.inf, dtype=np.float32), 1)
    return braze.softmax(q @ k.mT * D ** -0.5 + braze.from_numpy(mask), -1) @ v


def additive_bias_and_padding(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """A finite bias per (query, key) plus -inf padding of the last keys, broadcast over
    heads (B, 1, N, N): every tile carries a bias, some are all -inf."""
    rng = np.random.default_rng(6)
    bias = rng.standard_normal((B, 1, q.shape[-2], k.shape[-2])).astype(np.float32)
    bias[..., -60:] = -np.inf
    return braze.softmax(braze.from_numpy(bias) + q @ k.mT / math.sqrt(D), -1) @ v


def per_head_windows(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """Sliding windows of a different width per head: a mask that depends on the head, so
    no tile's fill can be known from another head's."""
    width = braze.tensor([8.0, 30.0, 64.0, 150.0])[:, None, None]
    i, j = _ij(q.shape[-2], k.shape[-2])
    hidden = (j > i) | ((i - j).float() >= width)
    return braze.softmax((q @ k.mT * D ** -0.5).masked_fill(hidden, -math.inf), -1) @ v


def strided_keys_and_values(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """Keys and values whose head dim is not contiguous (transposed views): values packed
    rather than read in place, keys transposed element by element rather than by 8 x 8
    blocks."""
    k_t, v_t = (braze.from_numpy(np.ascontiguousarray(x.numpy().swapaxes(-1, -2))) for x in (k, v))
    return braze.softmax(q @ k_t / math.sqrt(D), -1) @ v_t.mT


VARIANTS = {"plain": (plain, H), "causal": (causal, H), "alibi": (alibi, H), "gqa": (gqa, HKV),
            "gqa_sdpa_causal": (gqa_sdpa, HKV), "softcap": (softcap, H), "sliding_window": (sliding_window, H),
            "bool_mask_input": (bool_mask_input, H), "additive_mask_input": (additive_mask_input, H),
            "additive_bias_and_padding": (additive_bias_and_padding, H), "strided_keys_and_values": (strided_keys_and_values, H),
            "per_head_windows": (per_head_windows, H)}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_is_one_kernel_and_agrees_with_the_reference(name: str, monkeypatch: Any) -> None:
    fn, hkv = VARIANTS[name]
    got, ref, st = _run(fn, _inputs(hkv=hkv), monkeypatch)
    assert st["kernel_launches"] == 1, st
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_rows_of_minus_inf_and_huge_scores_give_what_the_reference_gives(monkeypatch: Any) -> None:
    """Query 3 sees no key at all (nan, as the reference and PyTorch); scores of size
    1e4 overflow exp unless the running max is subtracted; a row with +inf scores gives
    nan. Rows that end with a non-finite max are recomputed without repairs."""
    q, k, v = _inputs(1)
    q[0, :, 5] *= 1e3  # scores ~ 1e4 / sqrt(D)
    q[0, 1, 7, 0] = np.inf

    def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
        i, j = _ij(N, N)
        hidden = (j > i) | (i == 3)
        return braze.softmax((q @ k.mT * D ** -0.5).masked_fill(hidden, -math.inf), -1) @ v

    got, ref, st = _run(prog, [q, k, v], monkeypatch)
    assert st["kernel_launches"] == 1
    assert np.isnan(ref[0, :, 3]).all() and np.isnan(got[0, :, 3]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_decode_one_query_against_a_long_cache(monkeypatch: Any) -> None:
    q, k, v = _inputs(2, n_q=1, n_kv=3000, hkv=HKV)
    got, ref, st = _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), [q, k, v],
                        monkeypatch)
    assert st["kernel_launches"] == 1, st
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_attention_never_allocates_the_score_matrix(monkeypatch: Any) -> None:
    """N = 4096: the (N x N) scores would be 64 MiB; the peak above the inputs is only
    the output."""
    n, d = 4096, 16
    rng = np.random.default_rng(3)
    q, k, v = (braze.from_numpy(rng.standard_normal((1, 1, n, d)).astype(np.float32)) for _ in range(3))
    braze.reset_stats()
    live = braze.stats()["live_bytes"]  # other tests' tensors share the worker (a server's KV pool)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).realize()
    st = braze.stats()
    assert st["kernel_launches"] == 1
    assert st["peak_bytes"] - st["live_bytes"] + out.numel() * 4 <= n * d * 4 * 2, st
    assert st["peak_bytes"] - live < n * n, st


def _hf_float32_softmax(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """Hugging Face's half-precision attention: the softmax in float32, cast back."""
    return braze.softmax(q @ k.mT * D ** -0.5, -1, dtype=braze.float32).to(q.dtype) @ v


def _additive_causal(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
    """An additive 0 / -inf mask in the inputs' dtype, made from index arithmetic."""
    i, j = _ij(q.shape[-2], k.shape[-2])
    mask = braze.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype).masked_fill(j > i, -math.inf)
    return braze.softmax(q @ k.mT * D ** -0.5 + mask, -1) @ v


HALF_VARIANTS = {"plain": (plain, H), "causal": (causal, H), "gqa_sdpa_causal": (gqa_sdpa, HKV),
                 "softcap": (softcap, H), "sliding_window": (sliding_window, H),
                 "hf_float32_softmax": (_hf_float32_softmax, H), "additive_causal": (_additive_causal, H)}


def _in_float64(arrays: list[np.ndarray], dtype: Any) -> list[np.ndarray]:
    """The inputs as the half type holds them, exactly, in float64."""
    return [braze.from_numpy(a).to(dtype).float().numpy().astype(np.float64) for a in arrays]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(HALF_VARIANTS))
def test_half_attention_is_one_kernel_computed_in_float32(name: str, dtype: str, monkeypatch: Any) -> None:
    """float16 and bfloat16 q, k, v: one chain kernel that converts the tiles as it loads
    them and computes everything between the matmuls in float32. The reference rounds
    every intermediate to the half type, so the two differ by about one half rounding
    of values of size ~1 (tolerance: 2e-3 for float16, 2e-2 for bfloat16, absolute);
    against float64 attention on the same half inputs the fused result is the closer
    one, on average, by the rounding it skips."""
    fn, hkv = HALF_VARIANTS[name]
    half = getattr(braze, dtype)
    arrays = _inputs(11, hkv=hkv)
    ts = [braze.from_numpy(a).to(half).realize() for a in arrays]
    braze.reset_stats()
    got = fn(*ts).numpy().astype(np.float64)
    st = braze.stats()
    assert st["kernel_launches"] == 1, st
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = fn(*ts).numpy().astype(np.float64)
        truth = fn(*[braze.from_numpy(a) for a in _in_float64(arrays, half)]).numpy()
    tol = {"float16": 2e-3, "bfloat16": 2e-2}[dtype]
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
    assert np.abs(got - truth).mean() < np.abs(ref - truth).mean()


def _one_kernel_and_reference(prog: Callable[..., braze.Tensor], ts: list[braze.Tensor],
                              monkeypatch: Any) -> tuple[np.ndarray, np.ndarray]:
    """``prog`` over realised inputs, fused (one kernel) and on the reference, in float64."""
    braze.reset_stats()
    got = prog(*ts).numpy().astype(np.float64)
    assert braze.stats()["kernel_launches"] == 1, braze.stats()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = prog(*ts).numpy().astype(np.float64)
    return got, ref


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_decode_and_fully_masked_rows(dtype: str, monkeypatch: Any) -> None:
    """One query against 1001 keys (GQA, SDPA) with a bool mask that hides every key
    from one head's row: nan there, as the reference gives, and the rest agrees."""
    half = getattr(braze, dtype)
    q, k, v = _inputs(12, n_q=1, n_kv=1001, hkv=HKV)
    keep = np.ones((B, H, 1, 1001), dtype=bool)
    keep[0, 1] = False

    def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor, keep: braze.Tensor) -> braze.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)

    ts = [braze.from_numpy(a).to(half).realize() for a in (q, k, v)] + [braze.from_numpy(keep)]
    got, ref = _one_kernel_and_reference(prog, ts, monkeypatch)
    assert np.isnan(got[0, 1]).all() and np.isnan(ref[0, 1]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, atol={"float16": 2e-3, "bfloat16": 2e-2}[dtype], rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_chain_inputs_keep_the_reference_rounding(dtype: str, monkeypatch: Any) -> None:
    """Only what reads the scores is computed in float32. A float32 padding mask of -1e9
    cast to the half type is -inf in the reference (float16 overflows), and must be here
    too: a fully padded row is nan in both, not a finite average; a fill made with
    ``full`` holds its rounded value."""
    half = getattr(braze, dtype)
    q, k, v = _inputs(13)
    pad = np.zeros((N, N), dtype=np.float32)
    pad[:, -20:] = -1e9
    pad[7] = -1e9  # query 7 sees nothing

    def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor, pad: braze.Tensor) -> braze.Tensor:
        fill = braze.full((N, N), -1e5, dtype=q.dtype)
        i, j = _ij(N, N)
        s = (q @ k.mT * D ** -0.5).masked_fill(j > i + 100, 0.0) + pad.to(q.dtype)
        return braze.softmax(braze.where(j == i + 120, fill, s), -1) @ v

    ts = [braze.from_numpy(a).to(half).realize() for a in (q, k, v)] + [braze.from_numpy(pad)]
    got, ref = _one_kernel_and_reference(prog, ts, monkeypatch)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert (dtype == "bfloat16") != np.isnan(ref[0, :, 7]).all()  # -1e9 is finite in bfloat16
    np.testing.assert_allclose(got, ref, atol={"float16": 2e-3, "bfloat16": 2e-2}[dtype], rtol=0)


def test_half_scores_beyond_the_half_range_stay_finite(monkeypatch: Any) -> None:
    """A documented difference: float16 scores |q.k| > 65504 overflow in the reference
    (inf - inf: nan rows), while the chain computes them in float32, as FlashAttention
    kernels do, and gives the attention of the float16 inputs."""
    q, k, v = _inputs(14)
    q *= 60.0
    k *= 60.0
    ts = [braze.from_numpy(a).to(braze.float16).realize() for a in (q, k, v)]
    got = plain(*ts).numpy().astype(np.float64)
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = plain(*ts).numpy()
        truth = plain(*[braze.from_numpy(a) for a in _in_float64([q, k, v], braze.float16)]).numpy()
    assert np.isnan(ref).any() and not np.isnan(got).any()
    np.testing.assert_allclose(got, truth, atol=2e-3, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_no_keys_give_zeros_as_the_reference_does(dtype: str, monkeypatch: Any) -> None:
    """An empty KV cache: ``softmax(q @ k.mT) @ v`` over no keys is a sum over nothing."""
    q = np.ones((1, 2, 3, 16), np.float32)
    k = np.ones((1, 2, 0, 16), np.float32)
    ts = [braze.from_numpy(a).to(getattr(braze, dtype)) for a in (q, k, k)]
    got = plain(*ts).numpy()
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref = plain(*ts).numpy()
    np.testing.assert_array_equal(got, ref)
    assert not np.isnan(got).any()


def test_no_repair_term_means_no_chain_and_says_why(monkeypatch: Any, capfd: Any, tmp_path: Any) -> None:
    """Weights ``(s - max)^2`` have no single-term repair (Neptune's negative case):
    the scheduler keeps the matmuls apart, says why, and the result is still right."""
    monkeypatch.setenv("BRAZE_DEBUG", "1")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))  # no stored plan: schedule afresh
    plan.clear()

    def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
        s = q @ k.mT * D ** -0.5
        c = s - s.amax(-1, keepdim=True)
        return (c * c) @ v

    got, ref, st = _run(prog, _inputs(6), monkeypatch)
    assert st["kernel_launches"] > 1
    assert "no repair term" in capfd.readouterr().err
    np.testing.assert_allclose(got, ref, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_chain_given_up_after_reading_through_a_cast_still_computes_it(dtype: str, monkeypatch: Any) -> None:
    """Half keys and values cast to float32, then row work with no repair term: the
    chain read the casts through before it was given up, and the matmuls scheduled
    instead still find the casts computed (their readers restored)."""
    q, k, v = _inputs(7, n_q=1, n_kv=40, hkv=H)  # (a decoding step's)
    kh, vh = (braze.from_numpy(a).to(getattr(braze, dtype)).realize() for a in (k, v))  # (before the flush)

    def prog() -> braze.Tensor:  # (the scores reachable from no Python name when it runs)
        s = braze.from_numpy(q) @ kh.float().mT
        return (s - s.amax(-1, keepdim=True)).abs() @ vh.float()

    got = prog().numpy().copy()
    monkeypatch.setenv("BRAZE_FUSION", "0")
    np.testing.assert_allclose(got, prog().numpy(), atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_and_logsumexp_over_long_rows_with_inf_rows(dtype: str, monkeypatch: Any) -> None:
    """One kernel each, float32 accumulation for half inputs, rows of -inf and huge
    magnitudes, against the reference executor."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 5000)) * 3).astype(np.float32)
    x[1] = -np.inf
    x[2] *= 1e4 if dtype != "float16" else 1e3  # float16 tops out at 65504
    x[3, ::7] = -np.inf
    x = x.astype(dtype if dtype != "bfloat16" else np.float32)
    tol = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 2e-2}[dtype]
    for fn in (lambda t: braze.softmax(t, -1), lambda t: braze.logsumexp(t, -1)):
        def prog(t: braze.Tensor) -> braze.Tensor:
            return fn(t.to(braze.bfloat16) if dtype == "bfloat16" else t)
        got, ref, st = _run(prog, [x], monkeypatch)
        assert st["kernel_launches"] <= 2, st  # bfloat16: the cast, then the softmax
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), np.isnan(ref.astype(np.float32)))
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), atol=tol, rtol=tol)


@pytest.mark.parametrize("heads", [1, 3])
def test_split_k_decode_with_more_threads_than_rows(heads: int, monkeypatch: Any) -> None:
    """One query row per head and fewer heads than threads: the keys are split into
    chunks done in parallel and combined with the repair term; same result. (Enough
    keys that the kernel goes parallel at all: ``PARALLEL_FLOPS``.)"""
    from braze.codegen.chain import PARALLEL_FLOPS
    from braze.runtime.cpu import get_num_threads, set_num_threads
    n_kv = 50_000
    assert 2 * heads * n_kv * 2 * D >= PARALLEL_FLOPS
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, heads, n, D)).astype(np.float32) for n in (1, n_kv, n_kv))
    k[0, 0, :700] = 0.0
    old = get_num_threads()
    set_num_threads(4)
    try:
        def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
            mask = braze.arange(n_kv)[None, :] >= 13_000  # the first of 4 chunks (12576 keys) is fully masked
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        plan.clear()
        got, ref, st = _run(prog, [q, k, v], monkeypatch)
    finally:
        set_num_threads(old)
    assert st["kernel_launches"] == 1
    assert not any(_serial(src, n_kv) for src in _chain_sources())
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_a_small_chain_kernel_runs_on_one_thread(monkeypatch: Any) -> None:
    """Decoding against a short cache is less work than even an awake OpenMP team
    costs: the kernel stays on the calling thread, whatever the thread count."""
    from braze.codegen.chain import PARALLEL_FLOPS_NARROW
    from braze.runtime.cpu import get_num_threads, set_num_threads
    q, k, v = _inputs(9, n_q=1, n_kv=200, hkv=HKV)
    assert 2 * H * 200 * 2 * D < PARALLEL_FLOPS_NARROW
    old = get_num_threads()
    set_num_threads(2)
    try:
        plan.clear()
        got, ref, st = _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), [q, k, v],
                            monkeypatch)
    finally:
        set_num_threads(old)
    assert st["kernel_launches"] == 1
    assert any(_serial(src, 200) for src in _chain_sources())
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_logsumexp_and_cross_entropy_over_long_rows_fold_in_one_pass(monkeypatch: Any) -> None:
    """Rows of 20000: max and sum of exp are one rolling pass (the sum repaired with
    ``exp(m - m')`` whenever the max moves); rows of -inf, nan, +inf and huge values are
    redone without repairs and match the reference."""
    from braze.codegen.c import kernel_source
    from braze.schedule import KernelStep
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 20000)) * 3).astype(np.float32)
    x[1] = -np.inf
    x[2] *= 1e4
    x[3, ::7] = -np.inf
    x[4, 5] = np.nan
    x[5, 9] = np.inf
    target = rng.integers(0, 20000, 6)

    def cross_entropy(t: braze.Tensor) -> braze.Tensor:
        picked = t.gather(1, braze.from_numpy(target).reshape(6, 1)).reshape(6)
        return braze.logsumexp(t, -1) - picked

    for fn in (lambda t: braze.logsumexp(t, -1), cross_entropy):
        plan.clear()
        got, ref, st = _run(fn, [x], monkeypatch)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=0)
        kernels = [s.step.kernel for p in plan.stored_plans() for s in p.steps if hasattr(s, "step")
                   and isinstance(s.step, KernelStep)]
        assert any("j0 +=" in kernel_source(k, "k") for k in kernels)  # the rolling walk


def _serial(src: str, live: int) -> bool:
    """Does a chain kernel of literal sizes run on one thread (its work, folded, below
    the threshold in ``if (work < threshold) nthreads = 1;``; a narrow kernel's work is
    counted over its ``live`` keys, given here)?"""
    import re
    m = re.search(r"if \((\d+) < (\d+)\) nthreads = 1;", src)
    if m is not None:
        return int(m.group(1)) < int(m.group(2))
    m = re.search(r"if \((\d+) \* live \* (\d+) < (\d+)\) nthreads = 1;", src)
    assert m is not None, "the chain kernel's thread choice"
    return int(m.group(1)) * live * int(m.group(2)) < int(m.group(3))


def _chain_sources() -> list[str]:
    from braze.codegen.c import kernel_source
    from braze.schedule import KernelStep
    return [kernel_source(s.step.kernel, "k") for p in plan.stored_plans() for s in p.steps
            if hasattr(s, "step") and isinstance(s.step, KernelStep)]


@pytest.mark.parametrize("name", ["plain", "causal", "sliding_window", "alibi", "additive_mask_input",
                                  "additive_bias_and_padding"])
def test_scaled_scores_and_their_max_come_from_the_gemm_where_a_tile_has_no_fill(name: str,
                                                                               monkeypatch: Any) -> None:
    """Scores that are the Dot times (or over) a row constant, where a tile has no mask
    fill, are scaled and max-folded by ``braze_mm_scaled_max`` while in registers (no
    loop over the tile for the max); ALiBi's bias varies along the row, so it keeps the
    loop. Softmax's sum, which is the sum of the weights, is summed from the tile row
    they are stored in. Rows of +inf, nan and huge scores in those tiles still give the
    reference's result, nan where it has nan."""
    fn, hkv = VARIANTS[name]
    q, k, v = _inputs(10, hkv=hkv)
    q[0, 0, 100] *= 1e4  # exp overflows unless the max from the GEMM is the true max
    q[0, 1, 110, 3] = np.nan
    q[0, 2, 120, 0] = np.inf
    k[0, 1, 40, 0] = -np.inf  # -inf * +-q: nan where q is 0, +-inf elsewhere
    plan.clear()
    got, ref, st = _run(fn, [q, k, v], monkeypatch)
    assert st["kernel_launches"] == 1, st
    assert any("braze_mm_scaled_max(" in src for src in _chain_sources()) == (name != "alibi")
    assert any("braze_row_sum(wt" in src for src in _chain_sources())  # softmax's sum: of the weights stored
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_a_scale_that_varies_by_row_and_a_fully_masked_row(monkeypatch: Any) -> None:
    """The GEMM's factor is per row (here a tensor of one scale per query, one of them
    0 and one inf); a row that sees no key is nan, as in the reference."""
    q, k, v = _inputs(11)
    scale = np.random.default_rng(12).random((N, 1)).astype(np.float32)
    scale[7] = 0.0
    scale[9] = np.inf

    def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
        i, j = _ij(N, N)
        hidden = (j > i) | (i == 130)
        return braze.softmax((q @ k.mT * braze.from_numpy(scale)).masked_fill(hidden, -math.inf), -1) @ v

    plan.clear()
    got, ref, st = _run(prog, [q, k, v], monkeypatch)
    assert st["kernel_launches"] == 1, st
    assert any("braze_mm_scaled_max(" in src for src in _chain_sources())
    assert np.isnan(ref[0, :, 130]).all() and np.isnan(got[0, :, 130]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def test_an_additive_mask_skips_a_tile_only_where_the_scores_are_finite(monkeypatch: Any) -> None:
    """``dot * s + mask`` is -inf where the mask is, but only for a finite dot: key 120
    is (3e38, 0, ...), so its dot with query 5 (whose first element is 2) is inf, and
    row 5's masked score inf + -inf is nan in the reference; the tile that holds it must
    not be skipped (the bound d * max|q| * max|k| rules it out), and row 5 is nan here
    too. (Each dot with that key is one product, so it overflows the same way in any
    order of summation.) A row whose every key is masked is nan as well."""
    q, k, v = _inputs(13)
    q[0, 0, 5, 0] = 2.0
    k[0, 0, 120] = 0.0
    k[0, 0, 120, 0] = 3e38  # key 120 > query 5: masked for row 5, in a tile the causal mask skips
    mask = np.triu(np.full((N, N), -np.inf, dtype=np.float32), 1)
    mask[9] = -np.inf

    def prog(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor) -> braze.Tensor:
        return braze.softmax(q @ k.mT * D ** -0.5 + braze.from_numpy(mask), -1) @ v

    got, ref, st = _run(prog, [q, k, v], monkeypatch)
    assert st["kernel_launches"] == 1, st
    assert np.isnan(ref[0, 0, 5]).all() and np.isnan(ref[0, :, 9]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_decodes_in_one_kernel_reading_keys_in_place(name: str, monkeypatch: Any) -> None:
    """One query per head (two per KV head for GQA) against 1001 keys (a last tile of 41:
    past every multiple the dot-product loops take): the few rows of a task read the
    keys where they are (``braze_mm_nt``), except keys whose head dim is strided, which
    are first copied into contiguous rows. Scores of a huge query, a nan and an inf in
    the keys give the reference's result, nan where it has nan."""
    fn, hkv = VARIANTS[name]
    q, k, v = _inputs(20, n_q=1, n_kv=1001, hkv=hkv)
    q[0, 0, 0] *= 1e4
    k[0, 1, 500, 3] = np.nan
    k[0, 0, 700, 0] = np.inf
    plan.clear()
    got, ref, st = _run(fn, [q, k, v], monkeypatch)
    assert st["kernel_launches"] == 1, st
    in_place = name != "strided_keys_and_values"
    assert any(("braze_mm_nt(" in src) and ((f"kt, {D}, st" in src) != in_place) for src in _chain_sources())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("group", [3, 4, 8])
def test_gqa_decode_with_keys_strided_in_a_fused_cache(group: int, monkeypatch: Any) -> None:
    """Keys and values as views of one (B, HKV, N, 2 * D) buffer, so a key row is D
    floats at a stride of 2 * D, read in place; groups of 3 (an odd last row), 4 and 8
    query heads per KV head; an additive padding mask over the last keys."""
    rng = np.random.default_rng(21)
    kv = rng.standard_normal((B, HKV, 777, 2 * D)).astype(np.float32)
    q = rng.standard_normal((B, HKV * group, 1, D)).astype(np.float32)
    pad = np.zeros((1, 777), np.float32)
    pad[:, 700:] = -np.inf

    def prog(q: braze.Tensor, kv: braze.Tensor) -> braze.Tensor:
        return F.scaled_dot_product_attention(q, kv[..., :D], kv[..., D:], attn_mask=braze.from_numpy(pad),
                                              enable_gqa=True)
    plan.clear()
    got, ref, st = _run(prog, [q, kv], monkeypatch)
    assert st["kernel_launches"] == 1, st
    assert any("braze_mm_nt_scaled_max(" in src for src in _chain_sources())
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
