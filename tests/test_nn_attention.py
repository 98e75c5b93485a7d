"""braze.nn's rotary embedding, scaled dot-product attention, causal masks, the KV cache
and Attention (cached decoding against one call) against numpy formulas written here
(``nn_oracle.py``: inputs, tolerances)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import braze
import braze.nn as nn
import braze.nn.functional as F
from braze.errors import ShapeMismatch
from nn_oracle import ATOL_ELEM, RTOL_ELEM, as_tensor, assert_close, randf32, seeded


# =========================================================================================
# Rotary
# =========================================================================================

def _thetas(d: int, base: float, freq_factors: np.ndarray | None) -> np.ndarray:
    th = np.array([base ** (-2.0 * i / d) for i in range(d // 2)])
    if freq_factors is not None:
        th = th / np.asarray(freq_factors, np.float64)
    return th


def _rope_np(x: np.ndarray, offset: int, base: float = 10000.0, interleaved: bool = False, linear_scale: float = 1.0,
             freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotate each channel pair (a, b) by angle pos * theta_i: (a cos - b sin, a sin + b cos)."""
    x = x.astype(np.float64)
    t, d = x.shape[-2], x.shape[-1]
    th = _thetas(d, base, freq_factors)
    out = np.empty_like(x)
    for p in range(t):
        pos = (offset + p) / linear_scale
        for i in range(d // 2):
            ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
            c, s = math.cos(pos * th[i]), math.sin(pos * th[i])
            a, b = x[..., p, ia], x[..., p, ib]
            out[..., p, ia] = a * c - b * s
            out[..., p, ib] = a * s + b * c
    return out


ROPE_CASES = {
    "plain": dict(),
    "offset": dict(offset=5),
    "linear_scale": dict(offset=3, linear_scale=4.0),
    "freq_factors": dict(offset=2, freq_factors=np.array([1.0, 2.0, 4.0, 8.0])),
    "base": dict(offset=7, base=500.0, linear_scale=2.0, freq_factors=np.array([1.0, 1.5, 3.0, 0.5])),
}


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half_split"])
@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rotary(interleaved: bool, case: str) -> None:
    kw = dict(ROPE_CASES[case])
    offset = kw.pop("offset", 0)
    d, t = 8, 6
    rope = nn.RotaryEmbedding(d, 32, interleaved=interleaved, **kw)
    # non-persistent buffers: not in the state dict
    assert rope.state_dict() == {}
    x = randf32(seeded(9), 2, 3, t, d)
    got = rope(as_tensor(x), offset) if offset else rope(as_tensor(x))
    # the tables are float32 (cos/sin of float64 angles rounded once)
    assert_close(got, _rope_np(x, offset, interleaved=interleaved, **kw), RTOL_ELEM, ATOL_ELEM)
    # each rotated pair keeps its norm
    g = got.numpy().astype(np.float64)
    xd = x.astype(np.float64)
    if interleaved:
        pn_in, pn_out = xd[..., 0::2] ** 2 + xd[..., 1::2] ** 2, g[..., 0::2] ** 2 + g[..., 1::2] ** 2
    else:
        h = d // 2
        pn_in, pn_out = xd[..., :h] ** 2 + xd[..., h:] ** 2, g[..., :h] ** 2 + g[..., h:] ** 2
    np.testing.assert_allclose(pn_out, pn_in, rtol=1e-5, atol=1e-6)


def test_rotary_position_zero_is_identity() -> None:
    x = randf32(seeded(10), 1, 1, 8)
    for inter in (True, False):
        np.testing.assert_allclose(nn.RotaryEmbedding(8, 4, interleaved=inter)(as_tensor(x)).numpy(), x, rtol=0, atol=1e-7)


def test_rotary_layouts_agree_under_permutation() -> None:
    d, t, off = 16, 5, 3
    x = randf32(seeded(11), 2, t, d)
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # [0,2,4,...,1,3,5,...]
    inv = np.argsort(perm)
    inter = nn.RotaryEmbedding(d, 16, interleaved=True)(as_tensor(x), off).numpy()
    half = nn.RotaryEmbedding(d, 16, interleaved=False)(as_tensor(np.ascontiguousarray(x[..., perm])), off).numpy()
    np.testing.assert_allclose(half[..., inv], inter, rtol=1e-6, atol=1e-6)
    # and the layouts do differ on unpermuted input
    half_raw = nn.RotaryEmbedding(d, 16, interleaved=False)(as_tensor(x), off).numpy()
    assert not np.allclose(half_raw, inter, atol=1e-3)


def test_rotary_tables_grow_with_the_positions_asked_for() -> None:
    """The tables start small and double up to max_positions; rotations past the first
    table are the same as from a table built whole."""
    d = 8
    rope = nn.RotaryEmbedding(d, 5000, interleaved=True)
    assert rope.cos.shape[0] == nn.RotaryEmbedding.MIN_ROWS
    x = randf32(seeded(12), 1, 2, 3, d)
    got = rope(as_tensor(x), 700).numpy()  # positions 700..702: the table grows to 703 rows or more
    assert 703 <= rope.cos.shape[0] <= 5000
    assert_close(got, _rope_np(x, 700, interleaved=True), RTOL_ELEM, ATOL_ELEM)
    rope.reserve(10_000)  # capped at max_positions
    assert rope.cos.shape[0] == 5000


def test_rotary_beyond_max_positions_raises() -> None:
    # regression: a table slice shorter than T broadcast silently (T=2 against 1 row)
    rope = nn.RotaryEmbedding(4, 3)
    rope(as_tensor(randf32(seeded(0), 1, 3, 4)))  # positions 0..2 fit
    rope(as_tensor(randf32(seeded(0), 1, 1, 4)), 2)
    with pytest.raises(ShapeMismatch):
        rope(as_tensor(randf32(seeded(0), 1, 2, 4)), 2)
    with pytest.raises(ShapeMismatch):
        rope(as_tensor(randf32(seeded(0), 1, 4, 4)))


# =========================================================================================
# Attention
# =========================================================================================

def _softmax_np(s: np.ndarray) -> np.ndarray:
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(-1, keepdims=True)


def _sdpa_np(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, causal: bool = False,
             scale: float | None = None, gqa: bool = False) -> np.ndarray:
    q, k, v = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    if gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)  # head j -> rep*j .. rep*j+rep-1
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    L, S = s.shape[-2], s.shape[-1]
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    return _softmax_np(s) @ v


def _qkv(rng: np.random.Generator, b: int, hq: int, hk: int, L: int, S: int, d: int) -> tuple[np.ndarray, ...]:
    return randf32(rng, b, hq, L, d), randf32(rng, b, hk, S, d), randf32(rng, b, hk, S, d)


def test_sdpa_plain_and_scale() -> None:
    q, k, v = _qkv(seeded(12), 2, 3, 3, 5, 7, 8)
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v)), _sdpa_np(q, k, v))
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), scale=0.9), _sdpa_np(q, k, v, scale=0.9))


@pytest.mark.parametrize("L,S", [(5, 5), (3, 6), (6, 4)])
def test_sdpa_causal_top_left(L: int, S: int) -> None:
    # PyTorch's is_causal is tril(ones(L, S)): query i sees keys 0..i, whatever S is
    q, k, v = _qkv(seeded(13), 1, 2, 2, L, S, 4)
    got = F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), is_causal=True)
    assert_close(got, _sdpa_np(q, k, v, causal=True))
    if L == 3:  # row 0 sees only key 0
        np.testing.assert_allclose(got.numpy()[..., 0, :], v[..., 0, :], rtol=1e-6, atol=1e-6)


def test_sdpa_bool_and_float_masks() -> None:
    rng = seeded(14)
    q, k, v = _qkv(rng, 2, 2, 2, 4, 6, 8)
    mask = rng.random((4, 6)) < 0.6
    mask[:, 0] = True  # no fully masked row here
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), attn_mask=braze.tensor(mask)),
           _sdpa_np(q, k, v, mask))
    bmask = rng.random((2, 1, 4, 6)) < 0.5  # broadcast over heads
    bmask[..., 2] = True
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), attn_mask=braze.tensor(bmask)),
           _sdpa_np(q, k, v, bmask))
    add = randf32(rng, 4, 6)
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), attn_mask=as_tensor(add)), _sdpa_np(q, k, v, add))
    # causal and a mask together: braze applies both (torch raises when both are given)
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), attn_mask=braze.tensor(mask), is_causal=True),
           _sdpa_np(q, k, v, mask, causal=True))


def test_sdpa_gqa() -> None:
    q, k, v = _qkv(seeded(15), 2, 8, 2, 5, 6, 4)
    got = F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), enable_gqa=True)
    assert_close(got, _sdpa_np(q, k, v, gqa=True))
    # KV head j serves query heads 4j..4j+3: head 3 uses KV head 0, head 4 uses KV head 1
    g = got.numpy()
    assert_close(g[:, 3], _sdpa_np(q[:, 3:4], k[:, 0:1], v[:, 0:1])[:, 0])
    assert_close(g[:, 4], _sdpa_np(q[:, 4:5], k[:, 1:2], v[:, 1:2])[:, 0])
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(as_tensor(q[:, :7]), as_tensor(k), as_tensor(v), enable_gqa=True)


@pytest.mark.parametrize("mask", [None, "causal", "bool_per_head", "float_keys"])
def test_sdpa_gqa_one_query(mask: str | None) -> None:
    """Decoding: with one query the group's heads become the query rows of one matrix
    per KV head (another formulation than longer queries); same results, masks of any
    broadcastable shape included, for 4-D and 3-D inputs."""
    rng = seeded(30)
    q, k, v = _qkv(rng, 2, 6, 2, 1, 7, 8)
    kw: dict = {}
    want_mask = None
    if mask == "causal":
        kw["is_causal"] = True
    if mask == "bool_per_head":
        want_mask = rng.random((2, 6, 1, 7)) < 0.6
        want_mask[..., 0] = True
        kw["attn_mask"] = braze.tensor(want_mask)
    if mask == "float_keys":
        want_mask = randf32(rng, 7)
        kw["attn_mask"] = as_tensor(want_mask)
    got = F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), enable_gqa=True, **kw)
    assert got.shape == (2, 6, 1, 8)
    assert_close(got, _sdpa_np(q, k, v, want_mask, causal=mask == "causal", gqa=True))
    kw3 = {} if mask == "bool_per_head" else kw  # that mask has a batch dim
    got3 = F.scaled_dot_product_attention(as_tensor(q[0]), as_tensor(k[0]), as_tensor(v[0]), enable_gqa=True, **kw3)
    assert_close(got3, _sdpa_np(q[0], k[0], v[0], want_mask if mask == "float_keys" else None,
                          causal=mask == "causal", gqa=True))


def test_sdpa_3d_inputs() -> None:
    rng = seeded(16)
    q, k, v = randf32(rng, 3, 5, 8), randf32(rng, 3, 7, 8), randf32(rng, 3, 7, 2)  # value head dim may differ
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v)), _sdpa_np(q, k, v))
    assert_close(F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), is_causal=True), _sdpa_np(q, k, v, causal=True))
    # (H, L, D) with grouped KV heads (regression: only 4-D inputs were repeated)
    q8, k2, v2 = randf32(rng, 8, 5, 4), randf32(rng, 2, 6, 4), randf32(rng, 2, 6, 4)
    assert_close(F.scaled_dot_product_attention(as_tensor(q8), as_tensor(k2), as_tensor(v2), enable_gqa=True), _sdpa_np(q8, k2, v2, gqa=True))
    # and 5-D (B, G, H, L, D)
    q5, k5, v5 = randf32(rng, 2, 2, 4, 3, 4), randf32(rng, 2, 2, 2, 5, 4), randf32(rng, 2, 2, 2, 5, 4)
    assert_close(F.scaled_dot_product_attention(as_tensor(q5), as_tensor(k5), as_tensor(v5), enable_gqa=True), _sdpa_np(q5, k5, v5, gqa=True))


def test_sdpa_fully_masked_row_is_nan() -> None:
    # PyTorch's math SDPA gives NaN for a query whose keys are all masked (softmax of a
    # row of -inf is 0/0). braze does the same: the row is NaN, other rows are unaffected.
    q, k, v = _qkv(seeded(17), 1, 1, 1, 3, 4, 4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    got = F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), attn_mask=braze.tensor(mask)).numpy()
    assert np.isnan(got[0, 0, 1]).all()
    assert_close(got[0, 0, [0, 2]], _sdpa_np(q, k, v)[0, 0, [0, 2]])


def test_sdpa_rejects_bad_arguments() -> None:
    q, k, v = _qkv(seeded(18), 1, 1, 1, 2, 3, 4)
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), dropout_p=0.1)
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(as_tensor(q), as_tensor(k[..., :3]), as_tensor(v))
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v[..., :2, :]))


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "scale", "gqa"])
def test_sdpa_vs_torch(case: str) -> None:
    torch = pytest.importorskip("torch")
    rng = seeded(19)
    q, k, v = _qkv(rng, 2, 8, 2 if case == "gqa" else 8, 5, 6 if case != "causal" else 5, 4)
    kw: dict = {}
    tkw: dict = {}
    if case == "causal":
        kw["is_causal"] = tkw["is_causal"] = True
    if case == "bool_mask":
        m = rng.random((5, 6)) < 0.5
        m[:, 0] = True
        kw["attn_mask"], tkw["attn_mask"] = braze.tensor(m), torch.from_numpy(m)
    if case == "float_mask":
        m = randf32(rng, 5, 6)
        kw["attn_mask"], tkw["attn_mask"] = as_tensor(m), torch.from_numpy(m)
    if case == "scale":
        kw["scale"] = tkw["scale"] = 0.3
    if case == "gqa":
        kw["enable_gqa"] = tkw["enable_gqa"] = True
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), **tkw).numpy()
    got = F.scaled_dot_product_attention(as_tensor(q), as_tensor(k), as_tensor(v), **kw).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_causal_mask() -> None:
    def want(L: int, S: int, off: int) -> np.ndarray:
        return np.arange(S)[None, :] <= np.arange(L)[:, None] + off

    for L, S in [(4, 4), (1, 7), (3, 8), (5, 5)]:
        m = F.causal_mask(L, S)
        assert m.dtype is braze.bool_ and m.shape == (L, S)
        np.testing.assert_array_equal(m.numpy(), want(L, S, S - L))
    np.testing.assert_array_equal(F.causal_mask(3, 8, 0).numpy(), np.tril(np.ones((3, 8), bool)))
    np.testing.assert_array_equal(F.causal_mask(3, 5, 1).numpy(), want(3, 5, 1))
    # one decode step sees every key
    assert F.causal_mask(1, 9).numpy().all()


# =========================================================================================
# KV cache and Attention
# =========================================================================================

def test_kv_cache_is_zero_filled_at_allocation_without_recording() -> None:
    """The cache's zeros are written when it is made, not recorded (a recorded fill was
    a cold process's first compile), also over a pooled block that held other values."""
    from braze.device import CPU
    from braze.stream import stream_of
    big = braze.full((2, 3, 4096, 16), 7.0).realize()  # a pooled block, left dirty
    del big
    stream_of(CPU).flush()
    cache = nn.KVCache(2, 3, 4096, 16)
    assert not stream_of(CPU).nodes
    assert cache.k._storage.array is not None and cache.v._storage.array is not None
    assert not cache.k.numpy().any() and not cache.v.numpy().any()
    assert cache.k.dtype is braze.float32 and cache.k.shape == (2, 3, 4096, 16)


def test_kv_cache_append_in_place() -> None:
    rng = seeded(20)
    cache = nn.KVCache(2, 3, 10, 4)
    k_store, v_store = cache.k._storage, cache.v._storage
    k_ptr = cache.k.numpy().__array_interface__["data"][0]
    ks, vs = [], []
    for t in (4, 1, 3):
        k, v = randf32(rng, 2, 3, t, 4), randf32(rng, 2, 3, t, 4)
        kt, vt = as_tensor(k).realize(), as_tensor(v).realize()
        ks.append(k)
        vs.append(v)
        braze.reset_stats()
        ko, vo = cache.append(kt, vt)
        assert cache.k._storage is k_store and cache.v._storage is v_store
        assert ko.shares_storage(cache.k) and vo.shares_storage(cache.v)
        n = sum(x.shape[-2] for x in ks)
        assert cache.length == n and ko.shape == (2, 3, n, 4) and vo.shape == (2, 3, n, 4)
        np.testing.assert_array_equal(ko.numpy(), np.concatenate(ks, -2))
        np.testing.assert_array_equal(vo.numpy(), np.concatenate(vs, -2))
        assert braze.stats()["allocations"] == 0, "append allocated"
    assert cache.k.numpy().__array_interface__["data"][0] == k_ptr
    # the rest of the cache is still zero
    assert not cache.k.numpy()[:, :, 8:].any()
    with pytest.raises(ShapeMismatch):
        cache.append(as_tensor(randf32(rng, 2, 3, 3, 4)), as_tensor(randf32(rng, 2, 3, 3, 4)))
    assert cache.length == 8
    ko, _ = cache.append(as_tensor(randf32(rng, 2, 3, 2, 4)), as_tensor(randf32(rng, 2, 3, 2, 4)))
    assert ko.shape == (2, 3, 10, 4)


def _attention(seed: int, dim: int, heads: int, kv_heads: int, rotary: nn.RotaryEmbedding | None,
               bias: bool = False) -> nn.Attention:
    att = nn.Attention(dim, heads, kv_heads, bias=bias, rotary=rotary)
    rng = seeded(seed)
    att.load_state_dict({k: as_tensor(randf32(rng, *v.shape, scale=0.3)) for k, v in att.state_dict().items()})
    return att


def _attention_np(att: nn.Attention, x: np.ndarray, interleaved: bool | None) -> np.ndarray:
    sd = {k: v.numpy().astype(np.float64) for k, v in att.state_dict().items()}
    b, t, _ = x.shape
    hd = att.head_dim

    def proj(name: str, h: int) -> np.ndarray:
        y = x.astype(np.float64) @ sd[f"{name}.weight"].T
        if f"{name}.bias" in sd:
            y = y + sd[f"{name}.bias"]
        return y.reshape(b, t, h, hd).transpose(0, 2, 1, 3)

    q, k, v = proj("q", att.heads), proj("k", att.kv_heads), proj("v", att.kv_heads)
    if interleaved is not None:
        q, k = _rope_np(q, 0, interleaved=interleaved), _rope_np(k, 0, interleaved=interleaved)
    o = _sdpa_np(q, k, v, causal=True, gqa=True)
    return o.transpose(0, 2, 1, 3).reshape(b, t, -1) @ sd["o.weight"].T


@pytest.mark.parametrize("interleaved", [None, True, False], ids=["no_rope", "interleaved", "half_split"])
def test_attention_cached_decode_matches_full(interleaved: bool | None) -> None:
    dim, heads, kv_heads, T = 24, 6, 2, 7
    rope = nn.RotaryEmbedding(dim // heads, 32, interleaved=interleaved) if interleaved is not None else None
    att = _attention(21, dim, heads, kv_heads, rope, bias=True)
    x = randf32(seeded(22), 2, T, dim)
    full = att(as_tensor(x)).numpy()
    assert_close(full, _attention_np(att, x, interleaved))
    # token by token through the cache
    cache = nn.KVCache(2, kv_heads, 16, dim // heads)
    steps = [att(as_tensor(np.ascontiguousarray(x[:, i:i + 1])), cache=cache).numpy() for i in range(T)]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-4, atol=1e-5)
    assert cache.length == T
    # prefill of 4 then decode the rest: the mask is offset by the cache length
    cache2 = nn.KVCache(2, kv_heads, 16, dim // heads)
    pre = att(as_tensor(x[:, :4].copy()), cache=cache2).numpy()
    rest = att(as_tensor(x[:, 4:].copy()), cache=cache2).numpy()
    np.testing.assert_allclose(np.concatenate([pre, rest], 1), full, rtol=1e-4, atol=1e-5)


def test_rotary_follows_a_half_input() -> None:
    """The tables are float32; a float16 query is rotated in float16, not refused."""
    rope = nn.RotaryEmbedding(8, 16)
    x = braze.randn(1, 2, 3, 8)
    got = rope(x.half()).float().numpy()
    np.testing.assert_allclose(got, rope(x).numpy(), atol=5e-3)


def test_kv_cache_stores_its_dtype_and_gives_back_the_keys_dtype() -> None:
    """A float16 cache (llama.cpp's default cache type) keeps float32 keys rounded to
    float16 and gives them back as float32; keys and values of two dtypes, or not
    floating point, are refused and nothing is written."""
    cache = nn.KVCache(1, 2, 8, 4, dtype=braze.float16)
    k, v = braze.randn(1, 2, 3, 4), braze.randn(1, 2, 3, 4)
    ks, vs = cache.append(k, v)
    assert ks.dtype is braze.float32 and vs.dtype is braze.float32 and cache.k.dtype is braze.float16
    np.testing.assert_array_equal(ks.numpy(), k.numpy().astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(vs.numpy(), v.numpy().astype(np.float16).astype(np.float32))
    for a, b in ((k, v.half()), (k.to(braze.int32), v.to(braze.int32))):
        with pytest.raises(braze.DtypeMismatch, match="KVCache.append"):
            cache.append(a, b)
    assert cache.length == 3
