"""braze.nn against numpy formulas written here.

Every oracle computes in float64 from the same float32 inputs braze sees; braze computes
in float32. Tolerances: elementwise layers (norms, rotary, embedding) rtol/atol 1e-5;
layers with sums over a dim of <= 64 terms (Linear, attention, MLP) rtol/atol 1e-4;
comparing two braze float32 paths that sum in different orders (cached decode vs one
call) atol 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import braze
import braze.nn as nn
import braze.nn.functional as F
from braze.errors import ShapeMismatch, StateDictMismatch

RTOL_ELEM = ATOL_ELEM = 1e-5
RTOL_SUM = ATOL_SUM = 1e-4


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _t(a: np.ndarray) -> braze.Tensor:
    return braze.tensor(a)


def _close(got: braze.Tensor | np.ndarray, want: np.ndarray, rtol: float = RTOL_SUM, atol: float = ATOL_SUM) -> None:
    g = got.numpy() if isinstance(got, braze.Tensor) else got
    assert g.shape == want.shape, (g.shape, want.shape)
    np.testing.assert_allclose(g.astype(np.float64), want, rtol=rtol, atol=atol)


# =========================================================================================
# Module
# =========================================================================================

class Leaf(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.w = braze.zeros(n, n)
        self.b = braze.zeros(n)

    def forward(self, x: braze.Tensor) -> braze.Tensor:
        return x @ self.w.T + self.b


class Tree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = braze.ones(3)
        self.leaf = Leaf()
        self.layers = nn.ModuleList([Leaf(), Leaf()])
        self.count = braze.zeros(1, dtype=braze.int64)
        self.register_buffer("stat", braze.zeros(3))
        self.register_buffer("tmp", braze.zeros(4), persistent=False)
        self.note = "not a tensor"

    def forward(self, x: braze.Tensor) -> braze.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.leaf(x) * self.scale


PARAM_NAMES = ["scale", "count", "leaf.w", "leaf.b", "layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b"]


def _fresh_state(m: nn.Module) -> dict[str, braze.Tensor]:
    rng = _rng(1)
    out = {}
    for k, v in m.state_dict().items():
        if v.dtype.is_floating_point:
            out[k] = braze.tensor(rng.standard_normal(v.shape).astype(np.float32))
        else:
            out[k] = braze.tensor(np.arange(v.numel(), dtype=np.int64).reshape(v.shape))
    return out


def test_module_registers_parameters_and_submodules() -> None:
    m = Tree()
    assert set(m._modules) == {"leaf", "layers"}
    assert "note" not in m._parameters and m.note == "not a tensor"
    assert isinstance(m.leaf, Leaf)
    assert isinstance(m.layers[1], Leaf) and len(m.layers) == 2
    assert [n for n, _ in m.named_parameters()] == PARAM_NAMES
    params = list(m.parameters())
    assert len(params) == len(PARAM_NAMES)
    assert params[2] is m.leaf.w and params[6] is m.layers[1].w
    # buffers are not parameters
    assert not any(p is m.stat for p in params)
    # re-assigning a name to a non-tensor unregisters it
    m.leaf.b = None
    assert [n for n, _ in m.leaf.named_parameters()] == ["w"]
    assert m.leaf.b is None
    # named_modules and children
    assert [n for n, _ in m.named_modules()] == ["", "leaf", "layers", "layers.0", "layers.1"]
    assert list(m.children()) == [m.leaf, m.layers]


def test_module_requires_super_init() -> None:
    class Bad(nn.Module):
        def __init__(self) -> None:
            self.w = braze.zeros(2)

    with pytest.raises(AttributeError):
        Bad()


def test_reassigning_a_plain_attribute_to_a_tensor_registers_it() -> None:
    # regression: ``self.bias = None`` stored a plain attribute that shadowed a tensor
    # assigned later under the same name (the getter returned None)
    lin = nn.Linear(3, 2, bias=False)
    b = braze.ones(2)
    lin.bias = b
    assert lin.bias is b
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    x = np.ones((1, 3), np.float32)
    _close(lin(_t(x)), np.ones((1, 2)))
    m = Tree()
    m.note = None
    m.register_buffer("note", braze.zeros(2))
    assert isinstance(m.note, braze.Tensor) and "note" in m.state_dict()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear.from_weights(self.embed.weight)


def test_tied_weights_counted_once_and_stay_tied() -> None:
    m = Tied()
    # as PyTorch: parameters() lists a shared tensor once, state_dict() under every name
    assert [n for n, _ in m.named_parameters()] == ["embed.weight"]
    assert list(m.state_dict()) == ["embed.weight", "head.weight"]
    # regression: to() cast each name separately, untying the weights and doubling memory
    m.to(braze.float64)
    assert m.head.weight is m.embed.weight and m.embed.weight.dtype is braze.float64


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError):
        Tree().nope  # noqa: B018


def test_state_dict_persistent_buffers() -> None:
    m = Tree()
    sd = m.state_dict()
    assert list(sd) == PARAM_NAMES[:2] + ["stat"] + PARAM_NAMES[2:]
    assert "tmp" not in sd
    assert sd["stat"] is m.stat
    assert sd["layers.0.w"] is m.layers[0].w


def test_load_state_dict_binds_without_copy() -> None:
    m = Tree()
    new = _fresh_state(m)
    missing, unexpected = m.load_state_dict(new)
    assert missing == [] and unexpected == []
    for k, v in m.state_dict().items():
        assert v is new[k], k
        assert v.shares_storage(new[k])
    assert m.layers[1].w is new["layers.1.w"]
    assert m.stat is new["stat"]
    # a write through the loaded tensor shows in the module (same memory)
    new["leaf.b"][0] = 42.0
    assert m.leaf.b.numpy()[0] == 42.0
    # the non-persistent buffer is untouched
    assert m.tmp.shape == (4,)


def test_load_state_dict_reports_every_problem_at_once() -> None:
    m = Tree()
    before = dict(m.state_dict())
    tmp_before = m.tmp
    bad = _fresh_state(m)
    del bad["leaf.w"]
    del bad["stat"]
    bad["extra.one"] = braze.zeros(1)
    bad["tmp"] = braze.zeros(4)  # a non-persistent buffer is not part of the state
    bad["layers.0.w"] = braze.zeros(3, 4)  # shape
    bad["layers.1.b"] = braze.zeros(3, dtype=braze.float64)  # dtype
    bad["scale"] = np.ones(3, np.float32)  # not a braze tensor
    with pytest.raises(StateDictMismatch) as info:
        m.load_state_dict(bad)
    err = info.value
    msg = str(err)
    assert isinstance(err, KeyError)
    assert sorted(err.missing) == ["leaf.w", "stat"]
    assert sorted(err.unexpected) == ["extra.one", "tmp"]
    for key in ["leaf.w", "stat", "extra.one", "tmp", "layers.0.w", "layers.1.b", "scale"]:
        assert key in msg, key
    assert "(3, 4)" in msg and "(3, 3)" in msg
    assert "float64" in msg and "float32" in msg
    assert len(err.mismatched) == 3
    assert any(s.startswith("layers.0.w") and "shape" in s for s in err.mismatched)
    assert any(s.startswith("layers.1.b") and "dtype" in s for s in err.mismatched)
    assert any(s.startswith("scale") for s in err.mismatched)
    # nothing was bound: even the keys that were fine
    after = m.state_dict()
    assert list(after) == list(before)
    for k in before:
        assert after[k] is before[k], k
    assert m.tmp is tmp_before


def test_load_state_dict_non_strict() -> None:
    m = Tree()
    new = _fresh_state(m)
    del new["leaf.w"]
    new["extra"] = braze.zeros(2)
    old_leaf_w = m.leaf.w
    missing, unexpected = m.load_state_dict(new, strict=False)
    assert missing == ["leaf.w"]
    assert unexpected == ["extra"]
    assert m.leaf.w is old_leaf_w
    assert m.leaf.b is new["leaf.b"]
    assert not hasattr(m, "extra")
    # shapes are still checked without strict, and nothing is bound on failure
    m2 = Tree()
    b_before = m2.leaf.b
    with pytest.raises(StateDictMismatch) as info:
        m2.load_state_dict({"leaf.w": braze.zeros(2, 2), "leaf.b": braze.ones(3), "zzz": braze.zeros(1)},
                           strict=False)
    assert "leaf.w" in str(info.value)
    assert info.value.missing == [] and info.value.unexpected == []
    assert m2.leaf.b is b_before


def test_to_casts_floating_only() -> None:
    m = Tree()
    out = m.to(braze.float64)
    assert out is m
    for name, p in m.named_parameters():
        want = braze.int64 if name == "count" else braze.float64
        assert p.dtype is want, name
    assert m.stat.dtype is braze.float64 and m.tmp.dtype is braze.float64
    x = braze.tensor(np.ones((2, 3)))
    assert m(x).dtype is braze.float64


def test_call_runs_forward_and_repr() -> None:
    m = Tree()
    m.load_state_dict(_fresh_state(m))
    x = _f32(_rng(2), 2, 3)
    sd = {k: v.numpy().astype(np.float64) for k, v in m.state_dict().items()}
    y = x.astype(np.float64)
    for i in range(2):
        y = y @ sd[f"layers.{i}.w"].T + sd[f"layers.{i}.b"]
    y = (y @ sd["leaf.w"].T + sd["leaf.b"]) * sd["scale"]
    _close(m(_t(x)), y)
    r = repr(m)
    assert r.startswith("Tree(") and "(leaf): Leaf()" in r and "(layers): ModuleList(" in r
    assert "(0): Leaf()" in r and r.endswith(")")
    assert repr(nn.Linear(4, 5)) == "Linear(in_features=4, out_features=5, bias=True)"

    class NoForward(nn.Module):
        pass

    with pytest.raises(NotImplementedError):
        NoForward()(1)


# =========================================================================================
# Linear, Embedding, norms
# =========================================================================================

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
def test_linear(bias: bool, shape: tuple[int, ...]) -> None:
    rng = _rng(3)
    lin = nn.Linear(8, 6, bias=bias)
    assert lin.weight.shape == (6, 8)
    w, b = _f32(rng, 6, 8), _f32(rng, 6)
    sd = {"weight": _t(w)}
    if bias:
        sd["bias"] = _t(b)
    else:
        assert lin.bias is None
        assert [n for n, _ in lin.named_parameters()] == ["weight"]
    lin.load_state_dict(sd)
    x = _f32(rng, *shape)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    if bias:
        want = want + b
    _close(lin(_t(x)), want)


def test_linear_from_weights() -> None:
    rng = _rng(4)
    w, b = _f32(rng, 7, 5), _f32(rng, 7)
    wt, bt = _t(w), _t(b)
    lin = nn.Linear.from_weights(wt, bt)
    assert lin.weight is wt and lin.bias is bt
    assert (lin.in_features, lin.out_features) == (5, 7)
    x = _f32(rng, 2, 4, 5)
    _close(lin(_t(x)), x.astype(np.float64) @ w.T.astype(np.float64) + b)
    nobias = nn.Linear.from_weights(wt)
    _close(nobias(_t(x)), x.astype(np.float64) @ w.T.astype(np.float64))
    assert [n for n, _ in nobias.named_parameters()] == ["weight"]


def test_embedding() -> None:
    rng = _rng(5)
    w = _f32(rng, 11, 4)
    emb = nn.Embedding(11, 4)
    emb.load_state_dict({"weight": _t(w)})
    ids = np.array([[0, 3, 10], [7, 7, 1]], dtype=np.int64)
    out = emb(braze.tensor(ids))
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out.numpy(), np.take(w, ids, axis=0))
    ids1 = np.array([2, 9], dtype=np.int64)
    np.testing.assert_array_equal(nn.Embedding.from_weights(_t(w))(braze.tensor(ids1)).numpy(), w[ids1])


def _rms_np(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _ln_np(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm(eps: float) -> None:
    rng = _rng(6)
    x, w = _f32(rng, 2, 3, 16, scale=0.3), _f32(rng, 16)
    norm = nn.RMSNorm(16, eps=eps)
    _close(norm(_t(x)), _rms_np(x, np.ones(16), eps), RTOL_ELEM, ATOL_ELEM)
    norm.load_state_dict({"weight": _t(w)})
    _close(norm(_t(x)), _rms_np(x, w, eps), RTOL_ELEM, ATOL_ELEM)
    _close(nn.RMSNorm.from_weights(_t(w), eps)(_t(x)), _rms_np(x, w, eps), RTOL_ELEM, ATOL_ELEM)


def test_rms_norm_eps_matters() -> None:
    # small inputs: eps dominates mean(x^2), so the two results differ a lot
    x = np.full((1, 4), 1e-3, np.float32)
    a = nn.RMSNorm(4, eps=1e-12)(_t(x)).numpy()
    b = nn.RMSNorm(4, eps=1.0)(_t(x)).numpy()
    _close(a, _rms_np(x, np.ones(4), 1e-12), RTOL_ELEM, ATOL_ELEM)
    _close(b, _rms_np(x, np.ones(4), 1.0), RTOL_ELEM, ATOL_ELEM)
    assert abs(a[0, 0] - 1.0) < 1e-4 and b[0, 0] < 2e-3


@pytest.mark.parametrize("eps", [1e-5, 0.25])
def test_layer_norm(eps: float) -> None:
    rng = _rng(7)
    x, w, b = _f32(rng, 3, 5, 12, scale=2.0) + 1.0, _f32(rng, 12), _f32(rng, 12)
    norm = nn.LayerNorm(12, eps=eps)
    _close(norm(_t(x)), _ln_np(x, None, None, eps), RTOL_ELEM, ATOL_ELEM)
    norm.load_state_dict({"weight": _t(w), "bias": _t(b)})
    _close(norm(_t(x)), _ln_np(x, w, b, eps), RTOL_ELEM, ATOL_ELEM)
    nb = nn.LayerNorm(12, eps=eps, bias=False)
    assert nb.bias is None
    _close(nb(_t(x)), _ln_np(x, None, None, eps), RTOL_ELEM, ATOL_ELEM)
    _close(nn.LayerNorm.from_weights(_t(w), None, eps)(_t(x)), _ln_np(x, w, None, eps), RTOL_ELEM, ATOL_ELEM)


def test_normalize() -> None:
    rng = _rng(8)
    x = _f32(rng, 4, 6)
    x[1] = 0.0  # the clamp keeps an all-zero row at zero (no NaN), as torch
    xd = x.astype(np.float64)
    want = xd / np.maximum(np.linalg.norm(xd, axis=-1, keepdims=True), 1e-12)
    _close(F.normalize(_t(x)), want, RTOL_ELEM, ATOL_ELEM)
    want0 = xd / np.maximum(np.linalg.norm(xd, axis=0, keepdims=True), 1e-12)
    _close(F.normalize(_t(x), dim=0), want0, RTOL_ELEM, ATOL_ELEM)
    np.testing.assert_array_equal(F.normalize(_t(x)).numpy()[1], np.zeros(6, np.float32))


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
    x = _f32(_rng(9), 2, 3, t, d)
    got = rope(_t(x), offset) if offset else rope(_t(x))
    # the tables are float32 (cos/sin of float64 angles rounded once)
    _close(got, _rope_np(x, offset, interleaved=interleaved, **kw), RTOL_ELEM, ATOL_ELEM)
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
    x = _f32(_rng(10), 1, 1, 8)
    for inter in (True, False):
        np.testing.assert_allclose(nn.RotaryEmbedding(8, 4, interleaved=inter)(_t(x)).numpy(), x, rtol=0, atol=1e-7)


def test_rotary_layouts_agree_under_permutation() -> None:
    d, t, off = 16, 5, 3
    x = _f32(_rng(11), 2, t, d)
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # [0,2,4,...,1,3,5,...]
    inv = np.argsort(perm)
    inter = nn.RotaryEmbedding(d, 16, interleaved=True)(_t(x), off).numpy()
    half = nn.RotaryEmbedding(d, 16, interleaved=False)(_t(np.ascontiguousarray(x[..., perm])), off).numpy()
    np.testing.assert_allclose(half[..., inv], inter, rtol=1e-6, atol=1e-6)
    # and the layouts do differ on unpermuted input
    half_raw = nn.RotaryEmbedding(d, 16, interleaved=False)(_t(x), off).numpy()
    assert not np.allclose(half_raw, inter, atol=1e-3)


def test_rotary_tables_grow_with_the_positions_asked_for() -> None:
    """The tables start small and double up to max_positions; rotations past the first
    table are the same as from a table built whole."""
    d = 8
    rope = nn.RotaryEmbedding(d, 5000, interleaved=True)
    assert rope.cos.shape[0] == nn.RotaryEmbedding.MIN_ROWS
    x = _f32(_rng(12), 1, 2, 3, d)
    got = rope(_t(x), 700).numpy()  # positions 700..702: the table grows to 703 rows or more
    assert 703 <= rope.cos.shape[0] <= 5000
    _close(got, _rope_np(x, 700, interleaved=True), RTOL_ELEM, ATOL_ELEM)
    rope.reserve(10_000)  # capped at max_positions
    assert rope.cos.shape[0] == 5000


def test_rotary_beyond_max_positions_raises() -> None:
    # regression: a table slice shorter than T broadcast silently (T=2 against 1 row)
    rope = nn.RotaryEmbedding(4, 3)
    rope(_t(_f32(_rng(0), 1, 3, 4)))  # positions 0..2 fit
    rope(_t(_f32(_rng(0), 1, 1, 4)), 2)
    with pytest.raises(ShapeMismatch):
        rope(_t(_f32(_rng(0), 1, 2, 4)), 2)
    with pytest.raises(ShapeMismatch):
        rope(_t(_f32(_rng(0), 1, 4, 4)))


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
    return _f32(rng, b, hq, L, d), _f32(rng, b, hk, S, d), _f32(rng, b, hk, S, d)


def test_sdpa_plain_and_scale() -> None:
    q, k, v = _qkv(_rng(12), 2, 3, 3, 5, 7, 8)
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v)), _sdpa_np(q, k, v))
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v), scale=0.9), _sdpa_np(q, k, v, scale=0.9))


@pytest.mark.parametrize("L,S", [(5, 5), (3, 6), (6, 4)])
def test_sdpa_causal_top_left(L: int, S: int) -> None:
    # PyTorch's is_causal is tril(ones(L, S)): query i sees keys 0..i, whatever S is
    q, k, v = _qkv(_rng(13), 1, 2, 2, L, S, 4)
    got = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=True)
    _close(got, _sdpa_np(q, k, v, causal=True))
    if L == 3:  # row 0 sees only key 0
        np.testing.assert_allclose(got.numpy()[..., 0, :], v[..., 0, :], rtol=1e-6, atol=1e-6)


def test_sdpa_bool_and_float_masks() -> None:
    rng = _rng(14)
    q, k, v = _qkv(rng, 2, 2, 2, 4, 6, 8)
    mask = rng.random((4, 6)) < 0.6
    mask[:, 0] = True  # no fully masked row here
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=braze.tensor(mask)),
           _sdpa_np(q, k, v, mask))
    bmask = rng.random((2, 1, 4, 6)) < 0.5  # broadcast over heads
    bmask[..., 2] = True
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=braze.tensor(bmask)),
           _sdpa_np(q, k, v, bmask))
    add = _f32(rng, 4, 6)
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=_t(add)), _sdpa_np(q, k, v, add))
    # causal and a mask together: braze applies both (torch raises when both are given)
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=braze.tensor(mask), is_causal=True),
           _sdpa_np(q, k, v, mask, causal=True))


def test_sdpa_gqa() -> None:
    q, k, v = _qkv(_rng(15), 2, 8, 2, 5, 6, 4)
    got = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), enable_gqa=True)
    _close(got, _sdpa_np(q, k, v, gqa=True))
    # KV head j serves query heads 4j..4j+3: head 3 uses KV head 0, head 4 uses KV head 1
    g = got.numpy()
    _close(g[:, 3], _sdpa_np(q[:, 3:4], k[:, 0:1], v[:, 0:1])[:, 0])
    _close(g[:, 4], _sdpa_np(q[:, 4:5], k[:, 1:2], v[:, 1:2])[:, 0])
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(_t(q[:, :7]), _t(k), _t(v), enable_gqa=True)


@pytest.mark.parametrize("mask", [None, "causal", "bool_per_head", "float_keys"])
def test_sdpa_gqa_one_query(mask: str | None) -> None:
    """Decoding: with one query the group's heads become the query rows of one matrix
    per KV head (another formulation than longer queries); same results, masks of any
    broadcastable shape included, for 4-D and 3-D inputs."""
    rng = _rng(30)
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
        want_mask = _f32(rng, 7)
        kw["attn_mask"] = _t(want_mask)
    got = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), enable_gqa=True, **kw)
    assert got.shape == (2, 6, 1, 8)
    _close(got, _sdpa_np(q, k, v, want_mask, causal=mask == "causal", gqa=True))
    kw3 = {} if mask == "bool_per_head" else kw  # that mask has a batch dim
    got3 = F.scaled_dot_product_attention(_t(q[0]), _t(k[0]), _t(v[0]), enable_gqa=True, **kw3)
    _close(got3, _sdpa_np(q[0], k[0], v[0], want_mask if mask == "float_keys" else None,
                          causal=mask == "causal", gqa=True))


def test_sdpa_3d_inputs() -> None:
    rng = _rng(16)
    q, k, v = _f32(rng, 3, 5, 8), _f32(rng, 3, 7, 8), _f32(rng, 3, 7, 2)  # value head dim may differ
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v)), _sdpa_np(q, k, v))
    _close(F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=True), _sdpa_np(q, k, v, causal=True))
    # (H, L, D) with grouped KV heads (regression: only 4-D inputs were repeated)
    q8, k2, v2 = _f32(rng, 8, 5, 4), _f32(rng, 2, 6, 4), _f32(rng, 2, 6, 4)
    _close(F.scaled_dot_product_attention(_t(q8), _t(k2), _t(v2), enable_gqa=True), _sdpa_np(q8, k2, v2, gqa=True))
    # and 5-D (B, G, H, L, D)
    q5, k5, v5 = _f32(rng, 2, 2, 4, 3, 4), _f32(rng, 2, 2, 2, 5, 4), _f32(rng, 2, 2, 2, 5, 4)
    _close(F.scaled_dot_product_attention(_t(q5), _t(k5), _t(v5), enable_gqa=True), _sdpa_np(q5, k5, v5, gqa=True))


def test_sdpa_fully_masked_row_is_nan() -> None:
    # PyTorch's math SDPA gives NaN for a query whose keys are all masked (softmax of a
    # row of -inf is 0/0). braze does the same: the row is NaN, other rows are unaffected.
    q, k, v = _qkv(_rng(17), 1, 1, 1, 3, 4, 4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    got = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=braze.tensor(mask)).numpy()
    assert np.isnan(got[0, 0, 1]).all()
    _close(got[0, 0, [0, 2]], _sdpa_np(q, k, v)[0, 0, [0, 2]])


def test_sdpa_rejects_bad_arguments() -> None:
    q, k, v = _qkv(_rng(18), 1, 1, 1, 2, 3, 4)
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(_t(q), _t(k), _t(v), dropout_p=0.1)
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(_t(q), _t(k[..., :3]), _t(v))
    with pytest.raises(ShapeMismatch):
        F.scaled_dot_product_attention(_t(q), _t(k), _t(v[..., :2, :]))


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "scale", "gqa"])
def test_sdpa_vs_torch(case: str) -> None:
    torch = pytest.importorskip("torch")
    rng = _rng(19)
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
        m = _f32(rng, 5, 6)
        kw["attn_mask"], tkw["attn_mask"] = _t(m), torch.from_numpy(m)
    if case == "scale":
        kw["scale"] = tkw["scale"] = 0.3
    if case == "gqa":
        kw["enable_gqa"] = tkw["enable_gqa"] = True
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), **tkw).numpy()
    got = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), **kw).numpy()
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
    rng = _rng(20)
    cache = nn.KVCache(2, 3, 10, 4)
    k_store, v_store = cache.k._storage, cache.v._storage
    k_ptr = cache.k.numpy().__array_interface__["data"][0]
    ks, vs = [], []
    for t in (4, 1, 3):
        k, v = _f32(rng, 2, 3, t, 4), _f32(rng, 2, 3, t, 4)
        kt, vt = _t(k).realize(), _t(v).realize()
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
        cache.append(_t(_f32(rng, 2, 3, 3, 4)), _t(_f32(rng, 2, 3, 3, 4)))
    assert cache.length == 8
    ko, _ = cache.append(_t(_f32(rng, 2, 3, 2, 4)), _t(_f32(rng, 2, 3, 2, 4)))
    assert ko.shape == (2, 3, 10, 4)


def _attention(seed: int, dim: int, heads: int, kv_heads: int, rotary: nn.RotaryEmbedding | None,
               bias: bool = False) -> nn.Attention:
    att = nn.Attention(dim, heads, kv_heads, bias=bias, rotary=rotary)
    rng = _rng(seed)
    att.load_state_dict({k: _t(_f32(rng, *v.shape, scale=0.3)) for k, v in att.state_dict().items()})
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
    x = _f32(_rng(22), 2, T, dim)
    full = att(_t(x)).numpy()
    _close(full, _attention_np(att, x, interleaved))
    # token by token through the cache
    cache = nn.KVCache(2, kv_heads, 16, dim // heads)
    steps = [att(_t(np.ascontiguousarray(x[:, i:i + 1])), cache=cache).numpy() for i in range(T)]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-4, atol=1e-5)
    assert cache.length == T
    # prefill of 4 then decode the rest: the mask is offset by the cache length
    cache2 = nn.KVCache(2, kv_heads, 16, dim // heads)
    pre = att(_t(x[:, :4].copy()), cache=cache2).numpy()
    rest = att(_t(x[:, 4:].copy()), cache=cache2).numpy()
    np.testing.assert_allclose(np.concatenate([pre, rest], 1), full, rtol=1e-4, atol=1e-5)


# =========================================================================================
# SwiGLU
# =========================================================================================

def test_swiglu() -> None:
    rng = _rng(23)
    mlp = nn.SwiGLU(8, 20)
    names = [n for n, _ in mlp.named_parameters()]
    assert names == ["gate.weight", "up.weight", "down.weight"]
    sd = {k: _t(_f32(rng, *v.shape, scale=0.5)) for k, v in mlp.state_dict().items()}
    mlp.load_state_dict(sd)
    x = _f32(rng, 2, 3, 8)
    w = {k: v.numpy().astype(np.float64) for k, v in sd.items()}
    xd = x.astype(np.float64)
    g = xd @ w["gate.weight"].T
    want = ((g / (1 + np.exp(-g))) * (xd @ w["up.weight"].T)) @ w["down.weight"].T
    _close(mlp(_t(x)), want)
    mlp2 = nn.SwiGLU.from_layers(*(nn.Linear.from_weights(sd[f"{n}.weight"]) for n in ("gate", "up", "down")))
    _close(mlp2(_t(x)), want)
    biased = nn.SwiGLU(8, 20, bias=True)
    assert [n for n, _ in biased.named_parameters()] == [
        "gate.weight", "gate.bias", "up.weight", "up.bias", "down.weight", "down.bias"]


def test_rotary_follows_a_half_input() -> None:
    """The tables are float32; a float16 query is rotated in float16, not refused."""
    rope = nn.RotaryEmbedding(8, 16)
    x = braze.randn(1, 2, 3, 8)
    got = rope(x.half()).float().numpy()
    np.testing.assert_allclose(got, rope(x).numpy(), atol=5e-3)


def test_kv_cache_refuses_another_dtype() -> None:
    cache = nn.KVCache(1, 2, 8, 4)
    k = braze.randn(1, 2, 1, 4).half()
    with pytest.raises(braze.DtypeMismatch, match="KVCache.append"):
        cache.append(k, k)
    assert cache.length == 0
