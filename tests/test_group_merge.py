"""Groups that take more than their own shape (issue 15): element-wise work on a reshaped
view of a value joins the group computing it, at the two shapes' common refinement
(``schedule/reshape.py``). Each program is checked against numpy and the reference
executor, its kernels counted."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.layout import Layout
from braze.runtime.cpu import compiler_available
from braze.schedule import reshape
from fused_check import check_fused

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")


@pytest.fixture(autouse=True)
def fused(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")


def check(fn: Callable[..., braze.Tensor], arrays: list[np.ndarray], kernels: int, want: np.ndarray,
          monkeypatch: Any, tol: float = 1e-5) -> None:
    check_fused(fn, arrays, kernels, monkeypatch, want=want, rtol=tol, atol=tol)


@pytest.mark.parametrize("a, b, want", [
    ((16, 64), (2, 8, 64), (2, 8, 64)),
    ((2, 8, 64), (16, 64), (2, 8, 64)),
    ((6, 4), (2, 12), (2, 3, 4)),
    ((1, 12, 1), (3, 4), (1, 3, 4, 1)),
    ((6, 4), (4, 6), None),
    ((4, 4), (8, 3), None),
    ((0, 4), (4, 0), None),
])
def test_common_refinement(a: tuple[int, ...], b: tuple[int, ...], want: tuple[int, ...] | None) -> None:
    got = reshape.common(a, b)
    assert got == want
    if got is not None:  # both sides are cut into it, over the same elements
        for shape in (a, b):
            lay = reshape.split(Layout.contiguous(shape), got)
            assert lay is not None and lay.shape == got
            assert all(st == c for n, st, c in zip(got, lay.strides, Layout.contiguous(got).strides) if n != 1)


@pytest.mark.parametrize("lead, n", [((2, 8), 64), ((3, 5, 7), 12), ((1, 9), 40)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_output_read_in_its_lead_shape_joins_its_group(lead: tuple[int, ...], n: int, dtype: Any,
                                                              monkeypatch: Any) -> None:
    """BERT's output: ``F.linear`` computes (B * S, N) + bias; the residual add reads it as
    (B, S, N), and layer norm reduces that: the matmul and one kernel."""
    rng = np.random.default_rng(5)
    k = 24
    x, res = rng.standard_normal((*lead, k)).astype(dtype), rng.standard_normal((*lead, n)).astype(dtype)
    w, b = rng.standard_normal((n, k)).astype(dtype), rng.standard_normal(n).astype(dtype)
    h = x.astype(np.float64) @ w.T + b + res
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    check(lambda x, res, w, b: F.layer_norm(F.linear(x, w, b) + res, (n,), eps=1e-5), [x, res, w, b], 2, want,
          monkeypatch, tol=1e-4)


def test_gelu_of_a_reshaped_value_and_a_half_type(monkeypatch: Any) -> None:
    """nanoGPT's MLP: GELU of the linear's (B, T, 4C) view of its (B * T, 4C) result."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((24, 32)).astype(np.float16)
    b = rng.standard_normal(32).astype(np.float16)
    h = (x.astype(np.float32) + b.astype(np.float32)).astype(np.float16).astype(np.float64).reshape(2, 3, 4, 32)
    want = h * 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    check(lambda x, b: F.gelu((x + b).reshape(2, 3, 4, 32), approximate="tanh"), [x, b], 1, want, monkeypatch,
          tol=4e-3)


def test_a_coarser_view_of_a_group_with_rows_joins_it(monkeypatch: Any) -> None:
    """A softmax over (2, 8, 64) read as (16, 64) and scaled: the group keeps its rows,
    the node is cut to them."""
    rng = np.random.default_rng(7)
    x, s = rng.standard_normal((2, 8, 64)).astype(np.float32), rng.standard_normal((16, 64)).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)).reshape(16, 64) * s
    check(lambda x, s: x.softmax(-1).reshape(16, 64) * s, [x, s], 1, want, monkeypatch)


@pytest.mark.parametrize("shape", [(2, 3, 8, 16), (1, 4, 5, 32)])
def test_stacked_pairs_flattened_join_their_group(shape: tuple[int, ...], monkeypatch: Any) -> None:
    """GPT-J's rotate_every_two: ``stack((-x2, x1), -1).flatten(-2)`` read as x's shape."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape).astype(np.float32)
    c, s = rng.standard_normal(shape[-2:]).astype(np.float32), rng.standard_normal(shape[-2:]).astype(np.float32)
    rot = np.stack((-x[..., 1::2], x[..., ::2]), -1).reshape(shape)
    want = x.astype(np.float64) * c + rot * s

    def prog(x: braze.Tensor, c: braze.Tensor, s: braze.Tensor) -> braze.Tensor:
        return x * c + braze.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * s
    check(prog, [x, c, s], 1, want, monkeypatch)


def test_shapes_without_a_common_cut_stay_apart(monkeypatch: Any) -> None:
    """(6, 4) read as (4, 6): no shape cuts both, so two kernels (still right)."""
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)
    want = np.exp(x.astype(np.float64)).reshape(4, 6) + y
    check(lambda x, y: x.exp().reshape(4, 6) + y, [x, y], 2, want, monkeypatch)


def test_a_reshaped_read_of_a_value_of_coordinates(monkeypatch: Any) -> None:
    """``tril`` of a given x is read through (recomputed) at the reshaped add's own
    coordinates: one kernel."""
    rng = np.random.default_rng(10)
    x, y = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((2, 4, 8)).astype(np.float32)
    want = np.tril(x).reshape(2, 4, 8) + y
    check(lambda x, y: x.tril().reshape(2, 4, 8) + y, [x, y], 1, want, monkeypatch)


@pytest.mark.parametrize("shape, dim", [((6, 32), 1), ((5, 3, 40), -1), ((4, 7, 9), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_groups_over_the_same_rows_merge_for_a_node_reading_both(shape: tuple[int, ...], dim: int, dtype: Any,
                                                                 monkeypatch: Any) -> None:
    """Cosine similarity: |a| and |b| fold inputs no group shares (a fusion score of 0
    opened a group for each); the division reads both: one kernel."""
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64 * b64).sum(dim) / (np.linalg.norm(a64, axis=dim) * np.linalg.norm(b64, axis=dim))
    check(lambda a, b: F.cosine_similarity(a, b, dim=dim), [a, b], 1, want, monkeypatch)


def test_two_softmaxes_of_unrelated_logits_merge(monkeypatch: Any) -> None:
    """KL divergence of a student's and a teacher's logits: two row kernels' worth of
    folds (max, sum of exp, for each) and the final sum, one kernel."""
    rng = np.random.default_rng(12)
    s, t = rng.standard_normal((16, 50)).astype(np.float32), rng.standard_normal((16, 50)).astype(np.float32)

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    want = (np.exp(log_softmax(t)) * (log_softmax(t) - log_softmax(s))).sum(-1)
    check(lambda s, t: (t.softmax(-1) * (t.log_softmax(-1) - s.log_softmax(-1))).sum(-1), [s, t], 1, want,
          monkeypatch)


def test_an_element_wise_group_takes_the_rows_of_the_one_it_merges_with(monkeypatch: Any) -> None:
    """``x - x.mean(-1)`` (rows fixed) plus ``exp(y)`` (element-wise, free): one kernel."""
    rng = np.random.default_rng(13)
    x, y = rng.standard_normal((6, 40)).astype(np.float32), rng.standard_normal((6, 40)).astype(np.float32)
    want = (x - x.mean(-1, keepdims=True)).astype(np.float64) * np.exp(y.astype(np.float64))
    check(lambda x, y: (x - x.mean(-1, keepdim=True)) * y.exp(), [x, y], 1, want, monkeypatch)
    # y's group first, then the one with rows, in the other loop order (a transposed read)
    want = np.exp(y.astype(np.float64)).T * (x.T - x.T.mean(-1, keepdims=True))
    check(lambda x, y: y.exp().T * (x.T - x.T.mean(-1, keepdim=True)), [x, y], 1, want, monkeypatch)


def test_groups_over_other_rows_stay_apart(monkeypatch: Any) -> None:
    """Folds over different dims of (8, 8): no common row; two kernels, right values."""
    rng = np.random.default_rng(14)
    x, y = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    want = x.astype(np.float64).sum(0) * y.astype(np.float64).sum(1)
    check(lambda x, y: x.sum(0) * y.sum(1), [x, y], 2, want, monkeypatch)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_an_outer_product_matmul_is_a_fused_mul(batch: tuple[int, ...], dtype: Any, monkeypatch: Any) -> None:
    """``a[..., :, None] @ b[..., None, :]`` (a contracted size of 1) is element-wise: it
    joins the kernel that reads it (here with an add and an exp), no extern matmul."""
    rng = np.random.default_rng(15)
    a, b = (rng.integers(-3, 4, (*batch, n)).astype(dtype) for n in (5, 7))
    c = rng.integers(-3, 4, (*batch, 5, 7)).astype(dtype)
    want = a[..., :, None].astype(np.float64) * b[..., None, :] + c
    check(lambda a, b, c: a.unsqueeze(-1) @ b.unsqueeze(-2) + c, [a, b, c], 1, want, monkeypatch)


def test_hf_rotary_tables_from_position_ids_are_one_kernel(monkeypatch: Any) -> None:
    """LlamaRotaryEmbedding: ``(inv_freq[None, :, None] @ position_ids[:, None, :].float())
    .transpose(1, 2)``, ``cat((freqs, freqs))``, cos and sin: one kernel storing both."""
    pos = np.stack([np.arange(3, 15), np.arange(12)]).astype(np.int64)
    d = 16
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    emb = np.concatenate([pos[:, :, None] * inv] * 2, -1)

    def tables(p: braze.Tensor) -> braze.Tensor:
        inv_freq = 1.0 / (10000 ** (braze.arange(0, d, 2).float() / d))
        freqs = (inv_freq[None, :, None].expand(p.shape[0], -1, 1) @ p[:, None, :].float()).transpose(1, 2)
        e = braze.cat((freqs, freqs), dim=-1)
        return braze.stack((e.cos(), e.sin()))
    check(tables, [pos], 1, np.stack((np.cos(emb), np.sin(emb))), monkeypatch, tol=2e-5)


@pytest.mark.parametrize("dim, rows, shape, kernels", [
    (2, [0, 11], (2, 3, 12, 8), 1), (1, [2], (2, 3, 12, 8), 1), (0, [1, 0], (2, 3, 12, 8), 1),
    (2, [5, 300], (1, 8, 512, 32), 2)])
def test_index_copy_out_of_place_is_one_kernel(dim: int, rows: list[int], shape: tuple[int, ...], kernels: int,
                                               monkeypatch: Any) -> None:
    """``x.index_copy(dim, idx, src)``: the any() over each position's matches (an input
    of fewer dims than the group's, broadcast along its leading ones) folds beside the
    sum of the picked rows, in one kernel; in a large group that would repeat it more
    than ``FOLD_REPEAT`` times over (here B * H * D), in a kernel of its own."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal(shape).astype(np.float32)
    shape = list(x.shape)
    shape[dim] = len(rows)
    src = rng.standard_normal(shape).astype(np.float32)
    idx = np.array(rows, np.int64)
    want = x.astype(np.float64)
    np.moveaxis(want, dim, 0)[idx] = np.moveaxis(src, dim, 0)
    check(lambda x, i, s: x.index_copy(dim, i, s), [x, idx, src], kernels, want, monkeypatch)


def test_a_fold_of_an_input_of_fewer_dims_joins_the_group_that_loads_it(monkeypatch: Any) -> None:
    """``(x * w).sum(-1) / w.sum(-1)``, w (S, D) beside x (B, S, D): w's fold is the same
    in every batch row, so it joins the group: one kernel."""
    rng = np.random.default_rng(17)
    x, w = rng.standard_normal((3, 5, 40)).astype(np.float32), rng.random((5, 40)).astype(np.float32) + 0.5
    want = (x.astype(np.float64) * w).sum(-1) / w.astype(np.float64).sum(-1)
    check(lambda x, w: (x * w).sum(-1) / w.sum(-1), [x, w], 1, want, monkeypatch)


@pytest.mark.parametrize("shape, kernels", [((2, 4, 8, 16), 1), ((1, 8, 128, 64), 2)])
def test_a_costly_table_broadcast_over_a_large_flush_is_computed_once(shape: tuple[int, ...], kernels: int,
                                                                      monkeypatch: Any) -> None:
    """``x * sin(arange(S)[:, None] * f)``: recomputed where read in a small flush (one
    kernel), computed once and read back where x has 64K elements or more (the sin
    would otherwise be computed B * H times over)."""
    rng = np.random.default_rng(18)
    x = rng.standard_normal(shape).astype(np.float32)
    s, d = shape[-2:]
    want = x.astype(np.float64) * np.sin(np.arange(s, dtype=np.float32)[:, None] * np.float32(0.01)
                                         * np.arange(d, dtype=np.float32))
    check(lambda x: x * (braze.arange(s).float()[:, None] * 0.01 * braze.arange(d).float()).sin(), [x], kernels,
          want, monkeypatch, tol=1e-4)


@pytest.mark.parametrize("shape", [(1, 8, 128, 64), (2, 4, 96, 96)])
def test_a_cut_coordinate_read_divided_becomes_affine(shape: tuple[int, ...], monkeypatch: Any) -> None:
    """GPT-J's rotary with its tables made in the flush, at a size where they are stored
    (``recompute.COSTLY_READS``): ``sin.repeat_interleave(2, -1)`` is read through (column
    j reads j // 2) in a group cut to the stacked pairs' (..., D/2, 2), where j = 2 * i + p
    and j // 2 = i: affine, so x * cos joins the pairs' group. Four steps: inv_freq's
    kernel, the two tables' (the copy of sin closes the group computing it), the rope's."""
    rng = np.random.default_rng(19)
    x = rng.standard_normal(shape).astype(np.float32)
    s, d = shape[-2:]
    inv = np.float32(1) / np.float32(10000.0) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    ang = np.arange(s, dtype=np.float32)[:, None] * inv
    rot = np.stack((-x[..., 1::2], x[..., ::2]), -1).reshape(shape)
    want = x.astype(np.float64) * np.repeat(np.cos(ang), 2, -1) + rot * np.repeat(np.sin(ang), 2, -1)

    def prog(x: braze.Tensor) -> braze.Tensor:
        inv = 1.0 / (10000.0 ** (braze.arange(0, d, 2, dtype=braze.float32) / d))
        ang = braze.einsum("i,j->ij", braze.arange(s, dtype=braze.float32), inv)
        sin, cos = ang.sin().repeat_interleave(2, dim=-1), ang.cos().repeat_interleave(2, dim=-1)
        return x * cos + braze.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * sin
    check(prog, [x], 4, want, monkeypatch, tol=2e-4)
