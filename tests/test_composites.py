"""PyTorch names written from braze's primitives (braze/composites.py and the additions
to nn.functional): results against numpy, PyTorch's signatures and defaults, and typed
errors for what they refuse."""

from __future__ import annotations

import math

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze import DtypeMismatch, IndexOutOfRange, RankMismatch, ShapeMismatch, Unsupported

RNG = np.random.default_rng(11)


def _t(a: np.ndarray) -> braze.Tensor:
    return braze.from_numpy(a.copy())


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("eq, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("bi,i->b", [(3, 4), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ik,jk", [(3, 4), (5, 4)]),  # implicit output: "ij"
    ("bqhd,bkhd->bhqk", [(2, 5, 3, 4), (2, 6, 3, 4)]),
])
def test_einsum_matches_numpy(eq: str, shapes: list[tuple[int, ...]]) -> None:
    arrays = [_f32(*s) for s in shapes]
    got = braze.einsum(eq, *[_t(a) for a in arrays]).numpy()
    np.testing.assert_allclose(got, np.einsum(eq, *arrays), rtol=1e-5, atol=1e-5)
    got_list = braze.einsum(eq, [_t(a) for a in arrays]).numpy()  # operands as one list
    np.testing.assert_allclose(got_list, got, rtol=0, atol=0)


def test_einsum_refuses_what_it_does_not_do() -> None:
    a = _t(_f32(3, 3))
    with pytest.raises(Unsupported):
        braze.einsum("ii->i", a)
    with pytest.raises(Unsupported):
        braze.einsum("...i->i", a)
    with pytest.raises(ShapeMismatch):
        braze.einsum("ijk->i", a)
    with pytest.raises(ShapeMismatch):
        braze.einsum("ij,jk->ik", a, _t(_f32(4, 2)))
    with pytest.raises(ShapeMismatch):
        braze.einsum("ij->iz", a)


def test_matrix_products() -> None:
    a, b, c = _f32(2, 3, 4), _f32(2, 4, 5), _f32(2, 3, 5)
    np.testing.assert_allclose(braze.bmm(_t(a), _t(b)).numpy(), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(braze.baddbmm(_t(c), _t(a), _t(b), beta=0.5, alpha=2.0).numpy(),
                               0.5 * c + 2.0 * (a @ b), rtol=1e-5, atol=1e-5)
    nan = np.full_like(c, np.nan)
    got = braze.baddbmm(_t(nan), _t(a), _t(b), beta=0).numpy()  # beta=0 ignores input, nan included
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-6)
    m, n, bias = _f32(3, 4), _f32(4, 5), _f32(5)
    np.testing.assert_allclose(braze.addmm(_t(bias), _t(m), _t(n)).numpy(), bias + m @ n, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_t(m).mm(_t(n)).numpy(), m @ n, rtol=1e-5, atol=1e-6)
    u, v = _f32(3), _f32(4)
    np.testing.assert_allclose(braze.outer(_t(u), _t(v)).numpy(), np.outer(u, v), rtol=1e-6)
    with pytest.raises(RankMismatch):
        braze.bmm(_t(m), _t(n))
    with pytest.raises(RankMismatch):
        braze.outer(_t(m), _t(v))
    with pytest.raises(ShapeMismatch):
        braze.bmm(_t(a), _t(_f32(3, 4, 5)))


def test_flip_roll_repeat_interleave_stacks() -> None:
    x = _f32(3, 4, 5)
    np.testing.assert_array_equal(braze.flip(_t(x), [0, 2]).numpy(), np.flip(x, (0, 2)))
    np.testing.assert_array_equal(_t(x).flip(-1).numpy(), np.flip(x, -1))
    for shifts, dims in [(1, 0), (-2, 2), ((1, 3), (0, 1)), (7, None), (0, 1), (9, 1)]:
        np.testing.assert_array_equal(braze.roll(_t(x), shifts, dims).numpy(), np.roll(x, shifts, dims))
    np.testing.assert_array_equal(_t(x).repeat_interleave(3, dim=1).numpy(), np.repeat(x, 3, axis=1))
    np.testing.assert_array_equal(braze.repeat_interleave(_t(x), 2).numpy(), np.repeat(x, 2))
    np.testing.assert_array_equal(_t(x).repeat_interleave(0, dim=2).numpy(), np.repeat(x, 0, axis=2))
    with pytest.raises(Unsupported):
        _t(x).repeat_interleave(_t(np.array([1, 2, 3])), dim=0)
    with pytest.raises(ShapeMismatch):
        braze.roll(_t(x), (1, 2), 0)
    a, b = _f32(2, 3), _f32(2, 4)
    np.testing.assert_array_equal(braze.hstack([_t(a), _t(b)]).numpy(), np.hstack([a, b]))
    np.testing.assert_array_equal(braze.vstack([_t(a), _t(a)]).numpy(), np.vstack([a, a]))
    v = _f32(3)
    np.testing.assert_array_equal(braze.hstack([_t(v), _t(v)]).numpy(), np.hstack([v, v]))
    np.testing.assert_array_equal(braze.vstack([_t(v), _t(v)]).numpy(), np.vstack([v, v]))


def test_function_forms_of_movement_methods() -> None:
    x = _f32(2, 6, 3)
    assert [t.shape for t in braze.chunk(_t(x), 3, dim=1)] == [(2, 2, 3)] * 3
    assert [t.shape for t in braze.split(_t(x), [1, 5], dim=1)] == [(2, 1, 3), (2, 5, 3)]
    np.testing.assert_array_equal(braze.narrow(_t(x), 1, 2, 3).numpy(), x[:, 2:5])
    np.testing.assert_array_equal(braze.transpose(_t(x), 0, 2).numpy(), x.transpose(2, 1, 0))
    np.testing.assert_array_equal(braze.permute(_t(x), (1, 0, 2)).numpy(), x.transpose(1, 0, 2))
    np.testing.assert_array_equal(braze.flatten(_t(x), 1).numpy(), x.reshape(2, 18))
    np.testing.assert_array_equal(braze.reshape(_t(x), (6, 6)).numpy(), x.reshape(6, 6))
    assert braze.unsqueeze(_t(x), 0).shape == (1, 2, 6, 3)
    assert braze.squeeze(braze.unsqueeze(_t(x), 0)).shape == (2, 6, 3)
    assert len(braze.unbind(_t(x), 2)) == 3


def test_index_copy() -> None:
    cache, src = _f32(2, 6, 3), _f32(2, 2, 3)
    idx = np.array([4, 1])
    want = cache.copy()
    want[:, idx] = src
    np.testing.assert_array_equal(_t(cache).index_copy(1, _t(idx), _t(src)).numpy(), want)
    t = _t(cache)
    assert t.index_copy_(1, _t(idx), _t(src)) is t
    np.testing.assert_array_equal(t.numpy(), want)
    with pytest.raises(IndexOutOfRange):
        _t(cache).index_copy(1, _t(np.array([6, 0])), _t(src))
    with pytest.raises(ShapeMismatch):
        _t(cache).index_copy(1, _t(idx), _t(_f32(2, 3, 3)))
    with pytest.raises(DtypeMismatch):
        _t(cache).index_copy(1, _t(np.array([1.0, 2.0], np.float32)), _t(src))


def test_norm_and_clamps() -> None:
    x = _f32(4, 5)
    xd = x.astype(np.float64)
    np.testing.assert_allclose(_t(x).norm().numpy(), np.linalg.norm(xd), rtol=1e-5)
    np.testing.assert_allclose(braze.norm(_t(x), dim=1, keepdim=True).numpy(),
                               np.linalg.norm(xd, axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(_t(x).norm(p=1, dim=0).numpy(), np.abs(xd).sum(0), rtol=1e-5)
    np.testing.assert_allclose(_t(x).norm(p=math.inf, dim=1).numpy(), np.abs(xd).max(1), rtol=1e-6)
    np.testing.assert_allclose(_t(x).norm(p=3, dim=1).numpy(), (np.abs(xd) ** 3).sum(1) ** (1 / 3), rtol=1e-5)
    with pytest.raises(Unsupported):
        _t(x).norm(p="nuc")
    with pytest.raises(DtypeMismatch):
        _t(np.arange(3)).norm()
    np.testing.assert_array_equal(_t(x).clamp_min(0.0).numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(braze.clamp_max(_t(x), 0.5).numpy(), np.minimum(x, 0.5))


def test_finfo_iinfo() -> None:
    assert braze.finfo(braze.float32).min == float(np.finfo(np.float32).min)
    assert braze.finfo(braze.float16).max == 65504.0
    assert braze.finfo(braze.bfloat16).bits == 16
    assert braze.finfo().eps == float(np.finfo(np.float32).eps)
    assert braze.iinfo(braze.int64).max == 2 ** 63 - 1
    with pytest.raises(DtypeMismatch):
        braze.finfo(braze.int32)
    with pytest.raises(DtypeMismatch):
        braze.iinfo(braze.float32)


def test_type_as_new_like_and_in_place_unaries() -> None:
    x = _t(_f32(2, 3))
    h = x.half()
    assert x.type_as(h).dtype is braze.float16
    assert x.view_as(braze.zeros(3, 2)).shape == (3, 2)
    assert x.T.reshape_as(braze.zeros(6)).shape == (6,)
    z = h.new_zeros(2, 2)
    assert z.dtype is braze.float16 and z.shape == (2, 2) and not z.numpy().any()
    assert h.new_ones((3,)).numpy().tolist() == [1, 1, 1]
    assert x.new_full((2,), 7, dtype=braze.int64).numpy().tolist() == [7, 7]
    assert x.new_tensor([1.5, 2.5]).dtype is braze.float32
    assert x.new_empty(4).shape == (4,)
    a = np.abs(_f32(5)) + 0.5
    t = _t(a)
    assert t.rsqrt_() is t
    np.testing.assert_allclose(t.numpy(), 1 / np.sqrt(a), rtol=1e-6)
    t.exp_().neg_()
    np.testing.assert_allclose(t.numpy(), -np.exp(1 / np.sqrt(a)), rtol=1e-6)
    i = _t(np.arange(3))
    with pytest.raises(DtypeMismatch):  # sqrt of an int is a float: in place it would change the dtype
        i.sqrt_()


def test_functional_additions() -> None:
    x = _f32(4, 6) * 3
    xd = x.astype(np.float64)
    np.testing.assert_allclose(F.softplus(_t(x)).numpy(), np.logaddexp(0, xd), rtol=1e-5, atol=1e-6)
    big = np.array([30.0, -30.0, 0.5], np.float32)
    np.testing.assert_allclose(F.softplus(_t(big), beta=2.0, threshold=20).numpy(),
                               np.where(2 * big > 20, big, np.logaddexp(0, 2.0 * big) / 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.leaky_relu(_t(x), 0.2).numpy(), np.where(x >= 0, x, 0.2 * x), rtol=1e-6)
    np.testing.assert_allclose(F.elu(_t(x)).numpy(), np.where(x > 0, xd, np.expm1(xd)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.mish(_t(x)).numpy(), xd * np.tanh(np.logaddexp(0, xd)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.logsigmoid(_t(x)).numpy(), -np.logaddexp(0, -xd), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(F.hardtanh(_t(x)).numpy(), np.clip(x, -1, 1))
    np.testing.assert_array_equal(F.relu6(_t(x)).numpy(), np.clip(x, 0, 6))
    np.testing.assert_allclose(F.glu(_t(x)).numpy(), xd[:, :3] / (1 + np.exp(-xd[:, 3:])), rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeMismatch):
        F.glu(_t(_f32(4, 5)))
    assert F.dropout(_t(x), 0.5, training=False).numpy().tolist() == x.tolist()
    with pytest.raises(Unsupported):
        F.dropout(_t(x), 0.5)
    a, b = _f32(3, 8), _f32(3, 8)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    np.testing.assert_allclose(F.cosine_similarity(_t(a), _t(b)).numpy(), cos, rtol=1e-5)


def test_normalize_has_pytorchs_signature() -> None:
    """``F.normalize(input, p=2.0, dim=1, eps=1e-12)``: dim defaults to 1, p comes first."""
    x = _f32(2, 3, 4)
    xd = x.astype(np.float64)
    np.testing.assert_allclose(F.normalize(_t(x)).numpy(), xd / np.linalg.norm(xd, axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(F.normalize(_t(x), 1, -1).numpy(), xd / np.abs(xd).sum(-1, keepdims=True), rtol=1e-5)


def test_layer_norm_and_rms_norm_take_pytorchs_signature_and_braze_s() -> None:
    x, w, b = _f32(2, 3, 8), _f32(8), _f32(8)
    xd = x.astype(np.float64)
    mu = xd.mean(-1, keepdims=True)
    ln = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    for got in (F.layer_norm(_t(x), (8,), _t(w), _t(b), 1e-5), F.layer_norm(_t(x), 8, weight=_t(w), bias=_t(b)),
                F.layer_norm(_t(x), _t(w), _t(b), 1e-5), F.layer_norm(_t(x), normalized_shape=[8], weight=_t(w),
                                                                       bias=_t(b))):
        np.testing.assert_allclose(got.numpy(), ln, rtol=1e-5, atol=1e-5)
    flat = xd.reshape(2, 24)  # over the two trailing dims
    ln2 = (flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(F.layer_norm(_t(x), (3, 8)).numpy(), ln2.reshape(2, 3, 8), rtol=1e-5, atol=1e-5)
    rms = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6) * w
    for got in (F.rms_norm(_t(x), (8,), _t(w), 1e-6), F.rms_norm(_t(x), _t(w), 1e-6)):
        np.testing.assert_allclose(got.numpy(), rms, rtol=1e-5, atol=1e-5)
    eps = float(np.finfo(np.float32).eps)  # eps=None: the dtype's epsilon, as PyTorch
    np.testing.assert_allclose(F.rms_norm(_t(x), [8]).numpy(), xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + eps),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeMismatch):
        F.layer_norm(_t(x), (4,))
    with pytest.raises(Unsupported):
        F.layer_norm(_t(x), (8,), _t(w), weight=_t(w))
