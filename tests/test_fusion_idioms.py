"""Fusion of what the idiom corpus found split (issue 15): var/std as two folds in the
kernel, reductions and scans over a middle dim of element-wise work (the group's loops
reordered), values recomputed under a cat's or pad's guard, cats of values of the index
alone recomputed where they are read, and a pass-through view stored into its slice of a
cat by the group computing the other slice. Each program is checked against the
reference executor and its kernels counted."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.runtime.cpu import compiler_available
from fused_check import check_fused as check

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")


@pytest.fixture(autouse=True)
def fused(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")


@pytest.mark.parametrize("dims, correction", [(-1, 0), (-1, 1), (1, 2), ((0, 2), 1), (-1, 1.5)])
def test_var_is_two_folds_in_its_consumers_kernel(dims: Any, correction: float, monkeypatch: Any) -> None:
    def norm(x: braze.Tensor) -> braze.Tensor:
        v = x.var(dims, keepdim=True, correction=correction)
        return (x - x.mean(dims, keepdim=True)) / (v + 1e-5).sqrt()

    rng = np.random.default_rng(1)
    for shape in ((3, 7, 40), (5, 9, 24)):
        x = rng.standard_normal(shape).astype(np.float32)
        check(norm, [x], 1, monkeypatch)
        # far from 0, where a single pass of squares would cancel (1e-3 of the variance)
        check(lambda t: t.var(dims, correction=correction) * 2, [x + 100], 1, monkeypatch, rtol=1e-5)


def test_var_of_one_element_with_correction_is_nan_as_the_reference(monkeypatch: Any) -> None:
    check(lambda x: x.std(-1) * 2, [np.ones((4, 1), np.float32)], 1, monkeypatch)


def test_a_reduction_over_a_middle_dim_reorders_its_element_wise_group(monkeypatch: Any) -> None:
    """Mean pooling: ``(x * m).sum(1) / m.sum(1)`` over (B, S, D): the product's group runs
    (B, S) x D until the sum over S makes its rows (B, D) and S its row: one kernel."""
    def prog(x: braze.Tensor, mask: braze.Tensor) -> braze.Tensor:
        m = mask.unsqueeze(-1).expand(x.shape).float()
        return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)

    rng = np.random.default_rng(2)
    for b, s, d in ((3, 10, 32), (2, 17, 48)):
        check(prog, [rng.standard_normal((b, s, d)).astype(np.float32), (rng.random((b, s)) < 0.7).astype(np.int64)],
              1, monkeypatch)


def test_a_scan_over_a_middle_dim_of_element_wise_work(monkeypatch: Any) -> None:
    check(lambda x: (x * 2 + 1).cumsum(1), [np.random.default_rng(3).standard_normal((3, 6, 5)).astype(np.float32)],
          1, monkeypatch)


def test_a_stored_element_wise_value_keeps_its_elements_when_the_group_is_reordered(monkeypatch: Any) -> None:
    def prog(x: braze.Tensor) -> braze.Tensor:
        y = (x * 3).exp()
        return braze.cat([y.sum(1, keepdim=True), y[:, :1]], 1)  # y itself is read after its group

    check(prog, [np.random.default_rng(4).standard_normal((2, 5, 7)).astype(np.float32)], 2, monkeypatch)


@pytest.mark.parametrize("width", [16, 10])
def test_a_recomputed_input_of_a_cat_is_shifted_and_guarded(width: int, monkeypatch: Any) -> None:
    """``rotate_half`` of a tensor that exists before the flush: ``-x2`` is computed under
    the cat's guard in the consumer's kernel; a pad of a computed value too."""
    h = width // 2

    def rope(x: braze.Tensor, c: braze.Tensor, s: braze.Tensor) -> braze.Tensor:
        return x * c + braze.cat((-x[..., h:], x[..., :h]), dim=-1) * s

    def padded(x: braze.Tensor, c: braze.Tensor, s: braze.Tensor) -> braze.Tensor:
        return F.pad((x[..., 1:] * 2).exp(), (2, 1)) + c

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8, width)).astype(np.float32)
    c, s = rng.standard_normal((2, 8, width)).astype(np.float32)
    check(rope, [x, c, s], 1, monkeypatch)
    check(padded, [x, rng.standard_normal((8, width + 2)).astype(np.float32), s], 1, monkeypatch)


def test_a_cat_of_values_of_the_index_alone_is_recomputed_where_it_is_read(monkeypatch: Any) -> None:
    """Rotary tables ``cat((freqs, freqs))`` of an outer product of aranges, and the Llama
    reference's mask ``hstack([zeros, triu(full(-inf), 1)])``: computed in the kernel that
    reads them, each piece over its own range, nothing stored but the results."""
    def tables(x: braze.Tensor) -> braze.Tensor:
        inv = 1.0 / (10000 ** (braze.arange(0, 8, 2).float() / 8))
        freqs = braze.outer(braze.arange(x.shape[-2]).float(), inv)
        emb = braze.cat((freqs, freqs), dim=-1)
        return x * emb.cos() + x.flip(-1) * emb.sin()

    def mask(x: braze.Tensor) -> braze.Tensor:
        s = x.shape[-2] + 1
        m = braze.hstack([braze.zeros((s, 3)), braze.triu(braze.full((s, s), float("-inf")), diagonal=1)])[:, :8]
        return (x + m[1:]).softmax(-1)  # read through a slice: the pieces' ranges move

    rng = np.random.default_rng(6)
    check(tables, [rng.standard_normal((2, 5, 8)).astype(np.float32)], 1, monkeypatch)
    check(mask, [rng.standard_normal((2, 4, 8)).astype(np.float32)], 1, monkeypatch)


def test_a_cat_python_holds_stores_a_pass_through_view_with_the_computed_slice(monkeypatch: Any) -> None:
    """Partial rotary: ``cat((rotated, x[..., 8:]))``: the group computing the rotated half
    also copies the pass-through half into its slice, one kernel for the whole result."""
    def prog(x: braze.Tensor, c: braze.Tensor) -> braze.Tensor:
        return braze.cat(((x[..., :8] * 2 + c).exp() - x[..., :8].sum(-1, keepdim=True), x[..., 8:]), -1)

    rng = np.random.default_rng(7)
    check(prog, [rng.standard_normal((3, 4, 16)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)],
          1, monkeypatch)


def test_a_reduction_of_a_broadcast_input_joins_the_group_that_recomputes_it(monkeypatch: Any) -> None:
    """Mean pooling with the mask as (B, S, 1): ``m.sum(1)`` is the same fold in every row
    (b, d) of the masked sum's group, which recomputes m; the group that casts m only
    exists to be read that way, so it does not take the sum: one kernel."""
    def prog(x: braze.Tensor, mask: braze.Tensor) -> braze.Tensor:
        m = mask[..., None].to(x.dtype)
        return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9).sqrt()

    rng = np.random.default_rng(8)
    for b, s, d in ((3, 10, 32), (2, 5, 20)):
        check(prog, [rng.standard_normal((b, s, d)).astype(np.float32), (rng.random((b, s)) < 0.6).astype(np.int64)],
              1, monkeypatch)


def test_a_stack_of_computed_pairs_is_stored_interleaved_by_their_group(monkeypatch: Any) -> None:
    """The Llama reference's rotary in reals: ``stack([re * c - im * s, re * s + im * c],
    -1).flatten(3)``: the pieces' ``unsqueeze`` views are their values up to a dim of
    size 1, so their group stores each into its strided slice: one kernel."""
    def prog(x: braze.Tensor, c: braze.Tensor, s: braze.Tensor) -> braze.Tensor:
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        re, im = pairs[..., 0], pairs[..., 1]
        return braze.stack([re * c - im * s, re * s + im * c], dim=-1).flatten(2)

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    c, s = rng.standard_normal((2, 5, 8)).astype(np.float32)
    check(prog, [x, c, s], 1, monkeypatch)
