"""Generated Triton kernels, run by Triton's interpreter, against the reference executor."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze import Tensor

from .conftest import on_both

rng = np.random.default_rng(7)


def _x(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _launches(fn: object) -> int:
    before = braze.stats()["kernel_launches"]
    fn()  # type: ignore[operator]
    return braze.stats()["kernel_launches"] - before


def test_elementwise_chain_broadcasting(monkeypatch: pytest.MonkeyPatch) -> None:
    got, ref = on_both(monkeypatch, lambda x, b: ((x * 2.0 + b).exp() - 1.0) / (x.abs() + 1.0),
                       _x(5, 33), _x(1, 33))
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6)
    got, ref = on_both(monkeypatch, lambda x, b: x.T * b + x.T.relu(), _x(7, 3), _x(3, 1))  # a transposed view
    np.testing.assert_allclose(got, ref, rtol=4e-6)  # (a GPU fuses x * b + r into one rounding: an FMA)


def test_one_kernel_per_fused_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    x = braze.tensor(_x(4, 40), device="cuda")
    n = _launches(lambda: ((x - 1.0).sigmoid() * x).tanh().numpy())
    assert n == 1
    n = _launches(lambda: braze.softmax(x, -1).numpy())  # max, sum and the stores: one kernel
    assert n == 1


@pytest.fixture(params=["held", "walked"])
def rows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Row kernels both ways: the row held in registers (short rows), and walked in
    blocks, one walk per pass (rows past ``PERSISTENT_MAX``)."""
    from braze.codegen import triton as render
    from braze.runtime import cuda as runtime
    if request.param == "walked":
        monkeypatch.setattr(render, "PERSISTENT_MAX", 0)
    runtime.clear()
    yield
    runtime.clear()


@pytest.mark.parametrize("op", ["sum", "amax", "amin", "mean"])
def test_row_reductions(monkeypatch: pytest.MonkeyPatch, op: str, rows: None) -> None:
    a = _x(6, 1500)  # longer than one block of lanes
    a[2, 7] = np.nan
    got, ref = on_both(monkeypatch, lambda x: getattr(x, op)(-1, keepdim=True) * 2.0, a)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[2, 0]) and np.isnan(ref[2, 0])


def test_column_and_bool_reductions(monkeypatch: pytest.MonkeyPatch) -> None:
    got, ref = on_both(monkeypatch, lambda x: x.sum(0), _x(37, 5))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    got, ref = on_both(monkeypatch, lambda x: (x > 1.0).any(-1), _x(9, 20))
    np.testing.assert_array_equal(got, ref)
    got, ref = on_both(monkeypatch, lambda x: (x > -3.0).all(-1), _x(9, 20))
    np.testing.assert_array_equal(got, ref)


def test_softmax_and_log_softmax(monkeypatch: pytest.MonkeyPatch, rows: None) -> None:
    a = _x(3, 4, 70) * 5
    a[0, 0, :] = -np.inf  # an all-masked row: nan, as the reference
    a[1, 1, 3] = -np.inf
    got, ref = on_both(monkeypatch, lambda x: braze.softmax(x, -1), a)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    got, ref = on_both(monkeypatch, lambda x: braze.log_softmax(x, -1), a[1:])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_layer_norm_and_rms_norm(monkeypatch: pytest.MonkeyPatch, rows: None) -> None:
    w, b = _x(64), _x(64)
    got, ref = on_both(monkeypatch, lambda x, w, b: F.layer_norm(x, (64,), w, b, 1e-5), _x(5, 64) * 3 + 1, w, b)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    got, ref = on_both(monkeypatch, lambda x, w: F.rms_norm(x, (64,), w, 1e-6), _x(5, 64), w)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def _custom_gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + braze.erf(x / math.sqrt(2.0)))


@pytest.mark.parametrize("fn", [_custom_gelu, F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.silu,
                                lambda x: braze.tanh(x) + braze.sigmoid(x)], ids=["erf", "gelu", "tanh", "silu", "tanh2"])
def test_activations(monkeypatch: pytest.MonkeyPatch, fn: object) -> None:
    a = _x(3, 50) * 4
    a[0, :4] = [np.inf, -np.inf, 0.0, -0.0]
    got, ref = on_both(monkeypatch, fn, a)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)


def test_integer_ops_and_casts(monkeypatch: pytest.MonkeyPatch) -> None:
    i = np.array([[-7, -6, -1, 0, 1, 5, 7, 9]], np.int64)
    j = np.array([[2, -4, 3, 5, -2, 0, 7, -3]], np.int64)
    got, ref = on_both(monkeypatch, lambda a, b: a // b * 100 + a % b, i, j)
    np.testing.assert_array_equal(got, ref)
    f = np.array([np.nan, np.inf, -np.inf, 3.99, -3.99, 3e9, -3e9, 0.5], np.float32)
    got, ref = on_both(monkeypatch, lambda x: x.to(braze.int32), f)
    np.testing.assert_array_equal(got, ref)
    got, ref = on_both(monkeypatch, lambda x: braze.where(x > 0, x.round(), x.floor() - x.sign()), _x(40) * 3)
    np.testing.assert_array_equal(got, ref)
    got, ref = on_both(monkeypatch, lambda x: x ** 2 + x.abs() ** 0.5 + x ** 3.0, _x(40))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_creation_ops_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    x = braze.arange(10, device="cuda") * 3 + braze.full((10,), 2, device="cuda")
    assert x.device == braze.device("cuda")
    np.testing.assert_array_equal(x.numpy(), np.arange(10) * 3 + 2)
    z = braze.zeros(2, 3, device="cuda") + braze.linspace(0, 1, 3, device="cuda")
    np.testing.assert_allclose(z.numpy(), np.tile(np.linspace(0, 1, 3, dtype=np.float32), (2, 1)))


@pytest.mark.parametrize("dtype", [braze.float16, braze.bfloat16])
def test_half_types(monkeypatch: pytest.MonkeyPatch, dtype: object) -> None:
    def fn(x: Tensor, y: Tensor) -> Tensor:
        h = x.to(dtype) * y.to(dtype) + 1.0
        return braze.softmax(h, -1).to(braze.float32)
    got, ref = on_both(monkeypatch, fn, _x(4, 30), _x(4, 30))
    np.testing.assert_allclose(got, ref, rtol=1e-2 if dtype is braze.bfloat16 else 2e-3, atol=1e-3)
    got, ref = on_both(monkeypatch, lambda x, y: (x.to(dtype) @ y.to(dtype)).to(braze.float32), _x(20, 40), _x(40, 24))
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)  # (a half matmul: float32 sums, rounded once)


def test_matmul_mlp_and_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    def mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor) -> Tensor:
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2)
    got, ref = on_both(monkeypatch, mlp, _x(5, 24), _x(40, 24), _x(40), _x(7, 40))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return braze.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v
    got, ref = on_both(monkeypatch, attention, _x(2, 3, 9, 16), _x(2, 3, 11, 16), _x(2, 3, 11, 16))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    got, ref = on_both(monkeypatch, lambda a, b: a.to(braze.float16) @ b.to(braze.float16), _x(3, 20), _x(20, 6))
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2e-2, atol=2e-2)


def test_plans_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    x = braze.tensor(_x(3, 8), device="cuda")
    (x * 3.0 + 1.0).numpy()
    hits = braze.stats()["plan_hits"]
    y = braze.tensor(_x(3, 8), device="cuda")
    (y * 3.0 + 1.0).numpy()  # the same program on other data (and another scalar would be too)
    assert braze.stats()["plan_hits"] == hits + 1


def test_gathers_and_their_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _x(9, 6)
    ids = np.array([[0, 8, 3], [3, 1, 5]])
    got, ref = on_both(monkeypatch, lambda w, i: F.embedding(i, w) * 2.0 + 1.0, w, ids)
    np.testing.assert_array_equal(got, ref)
    got, ref = on_both(monkeypatch, lambda x, i: x.exp().gather(-1, i), w, rng.integers(0, 6, (9, 2)))
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    c = braze.tensor(w, device="cuda")
    for bad, named in (([0, 11, -3, 2], -3), ([1, 9, 12], 12)):  # the value the reference names
        with pytest.raises(braze.IndexOutOfRange, match=f"index {named} out of range for dimension 0 of size 9"):
            c.index_select(0, braze.tensor(np.array(bad), device="cuda")).numpy()


def test_in_place_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    def fn(x: Tensor) -> Tensor:
        y = x * 1.0
        y[1] = 5.0
        y[:, 2] += 1.0
        return y
    got, ref = on_both(monkeypatch, fn, _x(4, 6))
    np.testing.assert_array_equal(got, ref)
    c = braze.zeros(3, 4, device="cuda").realize()
    for i in range(3):  # a write at a moving position into a tensor that exists: one plan
        c[i] = float(i + 1)
    np.testing.assert_array_equal(c.numpy(), np.repeat(np.arange(1.0, 4.0)[:, None], 4, 1))


def test_masks_cat_pad_and_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    got, ref = on_both(monkeypatch, lambda q: F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True),
                       _x(1, 2, 5, 16))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    got, ref = on_both(monkeypatch, lambda x: braze.cat([x, x.exp()], 0).sum(-1) + F.pad(x, (1, 2)).mean(-1).sum(),
                       _x(4, 6))
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    got, ref = on_both(monkeypatch, lambda x: (x.to(braze.float64) ** 2).sum(-1).sqrt(), _x(4, 6))
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_cumsum(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _x(3, 1500)  # more than one block of lanes: the carry between blocks
    got, ref = on_both(monkeypatch, lambda x: x.cumsum(-1), a)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    got, ref = on_both(monkeypatch, lambda x: braze.softmax(x, -1).cumsum(-1) > 0.5, a[:, :50])
    np.testing.assert_array_equal(got, ref)


def test_a_fold_of_scanned_values_is_in_the_scan_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Top-p's renormalisation: a sum of values the scan masks, then the stores dividing by
    it (each walk scans again), and a max of the scan itself: one kernel each."""
    a = np.sort(np.abs(_x(3, 1500)), -1)[:, ::-1].copy() / 500  # more than one block: the carry

    def top_p(x: Tensor) -> Tensor:
        kept = x.masked_fill(x.cumsum(-1) - x > 0.9, 0.0)
        return kept / kept.sum(-1, keepdim=True)
    got, ref = on_both(monkeypatch, top_p, a)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    got, ref = on_both(monkeypatch, lambda x: x.cumsum(-1).amax(-1), a)
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    x = braze.tensor(a, device="cuda")
    assert _launches(lambda: top_p(x).numpy()) == 1


def test_empty_rows_and_sizes() -> None:
    z = braze.zeros(3, 0, device="cuda")
    np.testing.assert_array_equal(z.sum(-1).numpy(), np.zeros(3))  # a fold over no element: its identity
    assert (z * 2.0).numpy().shape == (3, 0) and braze.zeros(0, 4, device="cuda").sum(-1).numpy().shape == (0,)
    np.testing.assert_array_equal((braze.zeros(2, 0, device="cuda") @ braze.zeros(0, 4, device="cuda")).numpy(),
                                  np.zeros((2, 4)))


def test_contiguous_dims_collapse_into_one_coordinate(monkeypatch: pytest.MonkeyPatch) -> None:
    """An element-wise kernel over contiguous data computes one flat index (no division
    per dim per lane), and one over a transposed view keeps the dims its strides need."""
    from braze.codegen import loops, triton as render
    from braze import ir
    f32 = braze.float32
    k = ir.Kernel((), (4, 8, 16), [ir.Store(1, ir.Affine(0, (128, 16, 1)),
                                            ir.Load(0, ir.Affine(0, (128, 16, 1)), f32))], [(f32, False), (f32, True)])
    c = loops.collapsed(k)
    assert c.inner == (512,) and c.outer == ()
    rows = ir.Kernel((4,), (8, 16), k.stages, k.args)  # element stores only: no rows to keep apart
    assert loops.collapsed(rows).inner == (512,)
    t = ir.Kernel((), (4, 8, 16), [ir.Store(1, ir.Affine(0, (128, 16, 1)),
                                            ir.Load(0, ir.Affine(0, (16, 1, 8)), f32))], [(f32, False), (f32, True)])
    assert loops.collapsed(t).inner == (4, 8, 16)
    assert "%" not in render.kernel_source(k, "f").source.split("def f")[1]
    a = np.random.default_rng(0).standard_normal((4, 16, 8)).astype(np.float32)
    got, ref = on_both(monkeypatch, lambda x: x.transpose(1, 2) * 2.0 + 1.0, a)
    np.testing.assert_allclose(got, ref)


def test_identical_kernels_compile_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's layers run the same kernels over other buffers: each distinct kernel is
    compiled once per process, not once per place in the plan (a decoding step of
    SmolLM2 has ~540 kernels and ~30 distinct ones)."""
    a = _x(3, 37)
    x = braze.tensor(a, device="cuda")
    w = [braze.tensor(_x(37), device="cuda") for _ in range(4)]
    before, launched = braze.stats()["kernels_compiled"], braze.stats()["kernel_launches"]
    h = x
    for wi in w:  # four "layers": the same row kernel each time, and a matmul
        h = braze.softmax(h * wi, -1) @ braze.tensor(np.eye(37, dtype=np.float32), device="cuda")
    got = h.numpy()
    compiled = braze.stats()["kernels_compiled"] - before
    assert braze.stats()["kernel_launches"] - launched >= 4 and compiled <= 2, compiled
    ref = a
    for wi in w:
        e = np.exp(ref * wi.numpy() - (ref * wi.numpy()).max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_reshaped_views_and_merged_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """A linear's output read in its lead shape (``schedule/reshape.py``), GPT-J's stacked
    pairs, and two groups over the same rows merged (``schedule/merge.py``): one kernel
    each after the matmul, as on the CPU."""
    def bert_out(x: Tensor, w: Tensor, b: Tensor, r: Tensor) -> Tensor:
        return F.layer_norm(F.linear(x, w, b) + r, (24,), eps=1e-5)

    def gptj(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
        return x * c + braze.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * s

    cases: list[tuple[object, tuple[np.ndarray, ...], int]] = [
        (bert_out, (_x(2, 5, 16), _x(24, 16), _x(24), _x(2, 5, 24)), 2),
        (gptj, (_x(2, 3, 8, 16), _x(8, 16), _x(8, 16)), 1),
        (lambda a, b: F.cosine_similarity(a, b, dim=1), (_x(6, 40), _x(6, 40)), 1),
    ]
    for fn, arrays, kernels in cases:
        got, ref = on_both(monkeypatch, fn, *arrays)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        ts = [braze.tensor(a, device="cuda") for a in arrays]
        assert _launches(lambda: fn(*ts).numpy()) == kernels  # type: ignore[operator]
