"""Attention written as user code on the cuda device: one Triton chain kernel
(``codegen/triton_chain.py``), run by Triton's interpreter, against the reference
executor. Sizes are odd on purpose (query rows, keys and head dims that are not
multiples of the interpreter's 32 x 32 tiles: masked edges, several row blocks and key
tiles), and small, as the interpreter is slow."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze import Tensor

from .conftest import ON_GPU, on_both

rng = np.random.default_rng(11)
B, H, HKV, N, D = 1, 2, 1, 70, 24  # N: three key tiles, the last partial; D: padded to 32
N_DECODE = 3000 if ON_GPU else 300  # keys of a decoding step: enough tiles to split (GPU tiles are wider)


def _x(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _qkv(n_q: int = N, n_kv: int = N, hkv: int = H, d: int = D) -> list[np.ndarray]:
    return [_x(B, H, n_q, d), _x(B, hkv, n_kv, d), _x(B, hkv, n_kv, d)]


def _ij(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    return braze.arange(q.shape[-2], device=q.device)[:, None], braze.arange(k.shape[-2], device=q.device)[None, :]


def plain(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return braze.softmax(q @ k.mT / math.sqrt(q.shape[-1]), -1) @ v


def sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def sdpa_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def masked_fill_triu(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal as nanoGPT writes it: a triu mask of bools, ``masked_fill`` with -inf."""
    hidden = braze.ones(q.shape[-2], k.shape[-2], device=q.device).triu(1) != 0
    return braze.softmax((q @ k.mT * q.shape[-1] ** -0.5).masked_fill(hidden, -math.inf), -1) @ v


def tril_eq_0(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """nanoGPT's ``masked_fill(tril == 0, -inf)``, the tril made in the step."""
    keep = braze.ones(q.shape[-2], k.shape[-2], device=q.device).tril()
    return braze.softmax((q @ k.mT * q.shape[-1] ** -0.5).masked_fill(keep == 0, -math.inf), -1) @ v


def mask_of_twos(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``where(j <= i, 2, 3) != 2``: causal, but seen as a band of ``j <= i`` only if
    ``2 != 2`` does not hold: the kernel finds it does when it runs, and masks every tile."""
    i, j = _ij(q, k)
    hidden = braze.where(j <= i, 2.0, 3.0) != 2.0
    return braze.softmax((q @ k.mT).masked_fill(hidden, -math.inf), -1) @ v


def sliding_window(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    i, j = _ij(q, k)
    hidden = (j > i) | (i - j >= 40)
    return braze.softmax((q @ k.mT * q.shape[-1] ** -0.5).masked_fill(hidden, -math.inf), -1) @ v


def additive_triu_input(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """An additive 0 / -inf mask made with numpy (Hugging Face's way): read, not a band."""
    mask = np.triu(np.full((q.shape[-2], k.shape[-2]), -np.inf, np.float32), 1)
    return braze.softmax(q @ k.mT * q.shape[-1] ** -0.5 + braze.tensor(mask, device=q.device), -1) @ v


def repeat_kv(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """GQA as Llama's code writes it: KV heads repeated by views, then causal sdpa."""
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, F.repeat_kv(k, g), F.repeat_kv(v, g), is_causal=True)


def gqa_sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)


def decode(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


VARIANTS: dict[str, tuple[Callable[..., Tensor], int]] = {
    "plain": (plain, H), "sdpa": (sdpa, H), "sdpa_causal": (sdpa_causal, H), "masked_fill_triu": (masked_fill_triu, H),
    "tril_eq_0": (tril_eq_0, H), "mask_of_twos": (mask_of_twos, H),
    "sliding_window": (sliding_window, H), "additive_triu_input": (additive_triu_input, H),
    "repeat_kv": (repeat_kv, HKV), "gqa_sdpa": (gqa_sdpa, HKV)}


def _as(x: Tensor, dtype: Any) -> Tensor:
    return x.to(dtype=dtype) if x.dtype.is_floating_point else x


def _one_chain(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Tensor], arrays: list[np.ndarray],
               launches: int = 1, dtype: Any = braze.float32) -> tuple[np.ndarray, np.ndarray]:
    """``fn`` over ``arrays`` as ``dtype`` on the reference executor and on the cuda
    device (as ``on_both``), the cuda run in ``launches`` kernels; both as float32."""
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = fn(*[_as(braze.tensor(a), dtype) for a in arrays]).numpy().astype(np.float32)
    monkeypatch.setenv("BRAZE_FUSION", "1")
    inputs = [_as(braze.tensor(a, device="cuda"), dtype) for a in arrays]
    braze.synchronize()
    before = braze.stats()["kernel_launches"]
    out = fn(*inputs)
    assert out.dtype is dtype
    got = out.numpy().astype(np.float32)
    n = braze.stats()["kernel_launches"] - before
    assert n == launches, f"{n} launches"
    return got, ref


@pytest.mark.parametrize("name", list(VARIANTS))
def test_attention_as_users_write_it_is_one_kernel(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fn, hkv = VARIANTS[name]
    got, ref = _one_chain(monkeypatch, fn, _qkv(hkv=hkv))
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


def test_bfloat16_inputs_go_straight_into_the_dots(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 queries, keys and values, a bfloat16 result: the kernel computes in
    float32 between the matmuls (as FlashAttention), the reference rounds every node to
    bfloat16; they agree within bfloat16's tolerance, and the kernel agrees more closely
    with float32 attention over the same (bfloat16) inputs."""
    arrays = _qkv(hkv=HKV)
    got, ref = _one_chain(monkeypatch, gqa_sdpa, arrays, dtype=braze.bfloat16)
    np.testing.assert_allclose(got, ref, atol=3e-2, rtol=0)
    monkeypatch.setenv("BRAZE_FUSION", "0")
    exact = gqa_sdpa(*(braze.tensor(a).to(dtype=braze.bfloat16).float() for a in arrays)).numpy()
    np.testing.assert_allclose(got, exact, atol=1.2e-2, rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_keys_and_values_cast_to_float32_stay_float32_attention(dtype: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Half keys and values cast to float32 (a float16 KV cache): the kernel reads them
    through the cast, and the second matmul stays a float32 one (its weights are not
    rounded to the values' half type, as a half chain's are): float32 attention of the
    half values."""
    half = getattr(braze, dtype)
    arrays = [a if i == 0 else braze.tensor(a).to(half).float().numpy() for i, a in enumerate(_qkv(hkv=HKV))]

    def cast(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return gqa_sdpa(q, k.to(half).float(), v.to(half).float())
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = cast(*(braze.tensor(a) for a in arrays)).numpy()
    monkeypatch.setenv("BRAZE_FUSION", "1")
    q, k, v = (braze.tensor(a, device="cuda") for a in arrays)
    k, v = k.to(half).realize(), v.to(half).realize()
    braze.synchronize()
    before = braze.stats()["kernel_launches"]
    got = gqa_sdpa(q, k.float(), v.float()).numpy()
    assert braze.stats()["kernel_launches"] - before == 1
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decoding_splits_the_keys_and_combines(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One query row per head against 300 keys (ten of the interpreter's tiles), GQA:
    the keys are split across programs and a second kernel combines their partial
    results (2 launches)."""
    got, ref = _one_chain(monkeypatch, decode, _qkv(n_q=1, n_kv=N_DECODE, hkv=HKV), 2, getattr(braze, dtype))
    np.testing.assert_allclose(got, ref, atol=2e-5 if dtype == "float32" else 2e-2, rtol=0)
    if dtype == "float32":  # a sliding window: each split walks its part of the band's tiles

        def window(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            mask = F.causal_mask(1, N_DECODE, offset=N_DECODE - 1, window=100, device=q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        got, ref = _one_chain(monkeypatch, window, _qkv(n_q=1, n_kv=N_DECODE, hkv=HKV), 2)
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


def test_rows_that_see_no_key_or_inf_scores_give_what_the_reference_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose every key is masked is nan (as the reference and PyTorch); a row with
    an inf score is nan; huge finite scores need the running max: the rows whose running
    values end non-finite are redone without repair terms, in the fused kernel and
    after a split's combine."""
    q, k, v = _qkv()
    q[0, 0, 5] *= 1e3  # scores ~ 1e3
    q[0, 1, 9, 0] = np.inf
    keep = rng.random((N, N)) < 0.8
    keep[17] = False

    def fn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=braze.tensor(keep, device=q.device))

    got, ref = _one_chain(monkeypatch, fn, [q, k, v])
    assert np.isnan(ref[0, :, 17]).all() and np.isnan(ref[0, 1, 9]).all() and np.isfinite(ref[0, 0, 5]).all()
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)
    q1, k1, v1 = _qkv(n_q=1, n_kv=N_DECODE)
    q1[0, 1, 0, 1] = -np.inf

    got, ref = _one_chain(monkeypatch, sdpa, [q1, k1, v1], launches=2)
    assert np.isnan(ref[0, 1]).all() and np.isfinite(ref[0, 0]).all()
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


def test_causal_blocks_skip_the_key_tiles_they_cannot_see(monkeypatch: pytest.MonkeyPatch) -> None:
    """A causal mask is a band: the first block of query rows (0-31) never reads the
    last key tile, as FlashAttention does not. A nan in the last key's value shows it:
    the reference multiplies it by a weight of 0 (nan for every row), the fused kernel
    gives the first rows' finite values, the rows that see the key nan."""
    q, k, v = _qkv()
    v[0, :, N - 1, 0] = np.nan
    got, ref = _one_chain(monkeypatch, masked_fill_triu, [q, k, v])
    assert np.isnan(ref).any(axis=-1).all()
    assert np.isfinite(got[:, :, :32]).all() and np.isnan(got[:, :, N - 1, 0]).all()
    monkeypatch.setenv("BRAZE_FUSION", "0")
    v[0, :, N - 1, 0] = 0.0
    want = masked_fill_triu(*(braze.tensor(x) for x in (q, k, v))).numpy()
    np.testing.assert_allclose(got[:, :, :32], want[:, :, :32], atol=2e-5, rtol=0)


def test_a_chain_the_renderer_lacks_runs_without_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys and values read through a block table (a gather inside the chain): not
    rendered as one kernel yet, so the flush is scheduled without chain kernels (a
    GEMM, the row kernels, a GEMM: more launches, counted), with the same results."""
    bs, blocks, nb = 8, 6, 3
    pool_k, pool_v = _x(blocks * bs, HKV, D), _x(blocks * bs, HKV, D)
    table = np.array([[4, 0, 2]], np.int64)
    q = _x(1, H, 2, D)

    def fn(q: Tensor, kp: Tensor, vp: Tensor, t: Tensor) -> Tensor:
        n = nb * bs
        k = kp.view(blocks, bs, HKV, D)[t].reshape(1, n, HKV, D).transpose(1, 2)
        v = vp.view(blocks, bs, HKV, D)[t].reshape(1, n, HKV, D).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with pytest.raises(AssertionError, match="launches"):
        _one_chain(monkeypatch, fn, [q, pool_k, pool_v, table])
    got, ref = on_both(monkeypatch, fn, q, pool_k, pool_v, table)
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=0)


@pytest.mark.requires_gpu
def test_gpu_tiles_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, shapes that cross its tiles (128 query rows x 64 keys at D = 128):
    causal GQA in float32 and bfloat16, a decoding step's split keys in bfloat16."""
    if not ON_GPU:
        pytest.skip("the interpreter was asked for (BRAZE_CUDA_INTERPRET)")
    for fn, arrays, dtype, launches, atol in (
            (gqa_sdpa, _qkv(n_q=300, n_kv=300, hkv=HKV, d=128), braze.float32, 1, 2e-5),
            (gqa_sdpa, _qkv(n_q=300, n_kv=300, hkv=HKV, d=128), braze.bfloat16, 1, 3e-2),
            (decode, _qkv(n_q=1, n_kv=3000, hkv=HKV, d=128), braze.bfloat16, 2, 3e-2)):
        got, ref = _one_chain(monkeypatch, fn, arrays, launches, dtype)
        np.testing.assert_allclose(got, ref, atol=atol, rtol=0)


def test_the_gpus_tiles_fit_its_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiles a GPU would run (``INTERPRETER = False``), rendered and run here: causal
    attention at D = 128 takes the 128 x 128 tile; beside a (rows x keys) mask tensor,
    loaded with each tile of keys, the keys per tile halve so that the pipelined stages
    fit an H100's shared memory (a tile over it compiles, then fails at launch)."""
    from braze.codegen import triton_chain
    monkeypatch.setattr(triton_chain, "INTERPRETER", False)
    metas: list[dict[str, int]] = []
    render = triton_chain.chain_kernels

    def spy(k: Any, name: str) -> Any:
        ks = render(k, name)
        metas.append(ks.main.meta)
        return ks
    monkeypatch.setattr(triton_chain, "chain_kernels", spy)
    n, d = 200, 128
    q, k, v = _qkv(n_q=n, n_kv=n, hkv=H, d=d)
    mask = np.where(np.tril(np.ones((n, n), bool)), 0.0, -np.inf).astype(np.float32)
    for fn, arrays, bn in ((masked_fill_triu, [q, k, v], 128),
                           (lambda q, k, v, m: braze.softmax(q @ k.mT / math.sqrt(d) + m, -1) @ v, [q, k, v, mask], 64)):
        metas.clear()
        got, ref = _one_chain(monkeypatch, fn, arrays, dtype=braze.float16)
        np.testing.assert_allclose(got, ref, atol=2e-2, rtol=0)
        (meta,) = metas
        assert (meta["BM"], meta["BN"], meta["num_stages"]) == (128, bn, 3)
        per_key = 2 * d * 2 + (meta["BM"] * 2 if len(arrays) == 4 else 0)
        assert meta["BM"] * d * 2 + meta["num_stages"] * meta["BN"] * per_key <= triton_chain.SHARED_BYTES
