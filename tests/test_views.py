"""Views are zero-copy: a movement op is Layout arithmetic over the same Storage.

Each view below must record no node and allocate nothing, share the source's storage,
and hold exactly the values numpy's same view holds. A reshape that strides cannot
express (flattening a transpose) is the one exception: a recorded copy, with its own
storage; ``view()`` refuses it with ShapeMismatch.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
from braze.stream import stream

SHAPE = (4, 6, 5)


def _source() -> tuple[np.ndarray, braze.Tensor]:
    a = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    x = braze.tensor(a).realize()
    return a, x


def _check_zero_copy(make: Callable[[Any], Any], make_np: Callable[[Any], Any], x: braze.Tensor,
                     a: np.ndarray) -> None:
    """Run ``make`` on braze and ``make_np`` on numpy; the braze side must be a pure view."""
    braze.synchronize()
    queued = len(stream("cpu").nodes)
    braze.reset_stats()
    out = make(x)
    st = braze.stats()
    assert st["nodes_recorded"] == 0, "a view recorded a node"
    assert st["allocations"] == 0, "a view allocated"
    assert len(stream("cpu").nodes) == queued
    want = make_np(a)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    wants = want if isinstance(want, (tuple, list)) else (want,)
    assert len(outs) == len(wants)
    for o, w in zip(outs, wants):
        assert o.shares_storage(x)
        assert o.shape == w.shape
        got = o.numpy()
        np.testing.assert_array_equal(got, w)
        if got.size:
            assert np.shares_memory(got, x.numpy())
    assert braze.stats()["allocations"] == 0


VIEWS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    # name: (braze, numpy)
    "reshape": (lambda t: t.reshape(24, 5), lambda a: a.reshape(24, 5)),
    "reshape_infer": (lambda t: t.reshape(-1, 10), lambda a: a.reshape(-1, 10)),
    "view": (lambda t: t.view(2, 2, 30), lambda a: a.reshape(2, 2, 30)),
    "view_tuple": (lambda t: t.view((120,)), lambda a: a.reshape(120)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    "permute_neg": (lambda t: t.permute((-1, 1, 0)), lambda a: a.transpose(2, 1, 0)),
    "transpose": (lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
    "T": (lambda t: t.T, lambda a: a.T),
    "mT": (lambda t: t.mT, lambda a: np.swapaxes(a, -1, -2)),
    "unsqueeze0": (lambda t: t.unsqueeze(0), lambda a: a[None]),
    "unsqueeze_last": (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    "unsqueeze_mid": (lambda t: t.unsqueeze(2), lambda a: np.expand_dims(a, 2)),
    "flatten": (lambda t: t.flatten(), lambda a: a.reshape(-1)),
    "flatten_range": (lambda t: t.flatten(1), lambda a: a.reshape(4, 30)),
    "flatten_front": (lambda t: t.flatten(0, 1), lambda a: a.reshape(24, 5)),
    "unflatten": (lambda t: t.unflatten(1, (2, 3)), lambda a: a.reshape(4, 2, 3, 5)),
    "unflatten_infer": (lambda t: t.unflatten(-1, (-1, 1)), lambda a: a.reshape(4, 6, 5, 1)),
    "expand": (lambda t: t[:, :1].expand(4, 3, 5), lambda a: np.broadcast_to(a[:, :1], (4, 3, 5))),
    "expand_new_dims": (lambda t: t.expand(2, -1, -1, -1), lambda a: np.broadcast_to(a, (2, *SHAPE))),
    "broadcast_to": (lambda t: t[0, :, :1].broadcast_to(3, 6, 4), lambda a: np.broadcast_to(a[0, :, :1], (3, 6, 4))),
    "narrow": (lambda t: t.narrow(1, 2, 3), lambda a: a[:, 2:5]),
    "narrow_neg": (lambda t: t.narrow(-1, -2, 2), lambda a: a[..., 3:5]),
    "select": (lambda t: t.select(1, 4), lambda a: a[:, 4]),
    "select_neg": (lambda t: t.select(-1, -1), lambda a: a[..., -1]),
    "split": (lambda t: t.split(4, 1), lambda a: np.split(a, [4], axis=1)),
    "split_sizes": (lambda t: t.split([1, 2, 3], 1), lambda a: np.split(a, [1, 3], axis=1)),
    "chunk": (lambda t: t.chunk(3, -1), lambda a: np.split(a, [2, 4], axis=-1)),
    "unbind": (lambda t: t.unbind(2), lambda a: [a[:, :, i] for i in range(5)]),
    "slice_steps": (lambda t: t[1:5:2, :, None, -1], lambda a: a[1:5:2, :, None, -1]),
    "slice_ellipsis": (lambda t: t[..., 1::3], lambda a: a[..., 1::3]),
    "slice_ellipsis_mid": (lambda t: t[-1, ..., None, 2], lambda a: a[-1, ..., None, 2]),
    "slice_negative_bounds": (lambda t: t[-3:-1, ::4, -4:], lambda a: a[-3:-1, ::4, -4:]),
    "slice_empty": (lambda t: t[3:1], lambda a: a[3:1]),
    "slice_clamped": (lambda t: t[2:100, -100:2], lambda a: a[2:100, -100:2]),
    "int_index": (lambda t: t[2], lambda a: a[2]),
    "none_only": (lambda t: t[None, None], lambda a: a[None, None]),
    "squeeze_all": (lambda t: t[:, :1, None, :1], lambda a: a[:, :1, None, :1]),
    "squeeze": (lambda t: t[:, :1, None, :1].squeeze(), lambda a: a[:, :1, None, :1].squeeze()),
    "squeeze_dim": (lambda t: t[:, :1].squeeze(1), lambda a: a[:, :1].squeeze(1)),
    "squeeze_non1_is_noop": (lambda t: t.squeeze(0), lambda a: a),
    # Views of views, and reshapes of non-contiguous but viewable layouts.
    "view_of_slice_rows": (lambda t: t[1:3].view(2, 30), lambda a: a[1:3].reshape(2, 30)),
    "view_of_col_slice": (lambda t: t[:, 1:4].reshape(4, 3, 5, 1), lambda a: a[:, 1:4].reshape(4, 3, 5, 1)),
    "view_of_col_slice_merge_tail": (lambda t: t[:, ::2].view(4, 3, 5), lambda a: a[:, ::2]),
    "view_split_of_permuted": (lambda t: t.permute(1, 0, 2).view(2, 3, 4, 5),
                               lambda a: a.transpose(1, 0, 2).reshape(2, 3, 4, 5)),
    "view_of_transpose_merge_kept": (lambda t: t.transpose(0, 1).reshape(6, 4, 5),
                                     lambda a: a.swapaxes(0, 1).reshape(6, 4, 5)),
    "view_of_expand_tail": (lambda t: t[:, :, :1].expand(4, 6, 3).reshape(24, 3),
                            lambda a: np.broadcast_to(a[:, :, :1], (4, 6, 3)).reshape(24, 3)),
    "T_of_slice": (lambda t: t[1:, ::2, 3].T, lambda a: a[1:, ::2, 3].T),
    "chain": (lambda t: t.permute(2, 1, 0)[1:, ::2].unsqueeze(0).mT[0, 1],
              lambda a: a.transpose(2, 1, 0)[1:, ::2][None].swapaxes(-1, -2)[0, 1]),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_is_zero_copy(name: str) -> None:
    a, x = _source()
    fb, fn = VIEWS[name]
    _check_zero_copy(fb, fn, x, a)


def test_view_of_pending_tensor_records_nothing() -> None:
    """Views of a tensor whose producer has not run yet are still pure layout work."""
    x = braze.arange(24).reshape(2, 3, 4)  # pending arange node
    n = len(stream("cpu").nodes)
    braze.reset_stats()
    v = x.permute(2, 0, 1)[1:, :, None, -1]
    assert braze.stats()["nodes_recorded"] == 0
    assert len(stream("cpu").nodes) == n
    assert v.shares_storage(x)
    np.testing.assert_array_equal(v.numpy(), np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1)[1:, :, None, -1])


def test_view_strides_and_offset() -> None:
    a, x = _source()
    v = x[1:, 2::2, 3]
    # Element strides, as PyTorch reports them.
    assert v.stride() == tuple(s // 4 for s in a[1:, 2::2, 3].strides)
    assert v.storage_offset() == 1 * 30 + 2 * 5 + 3
    assert x.expand(3, *SHAPE).stride()[0] == 0
    assert x[:, :1].expand(4, 6, 5).stride() == (30, 0, 1)
    assert not x.T.is_contiguous() and x.T.T.is_contiguous()


def test_reshape_of_transpose_copies() -> None:
    """Flattening a transpose cannot be strides: reshape records one copy, view raises."""
    a, x = _source()
    t = x.transpose(0, 1)
    braze.reset_stats()
    r = t.reshape(-1)
    assert braze.stats()["nodes_recorded"] == 1
    assert not r.shares_storage(x)
    assert r.is_contiguous()
    np.testing.assert_array_equal(r.numpy(), a.swapaxes(0, 1).reshape(-1))
    assert braze.stats()["allocations"] == 1
    # flatten goes through reshape
    f = x.permute(2, 1, 0).flatten()
    assert not f.shares_storage(x)
    np.testing.assert_array_equal(f.numpy(), a.transpose(2, 1, 0).reshape(-1))
    # a copy is independent: writing the source afterwards does not change it
    x[0, 0, 0] = -1.0
    assert r.numpy()[0] == 0.0
    n = len(stream("cpu").nodes)
    with pytest.raises(braze.ShapeMismatch) as info:
        x.transpose(0, 1).view(-1)
    assert "view" in str(info.value) and "(6, 4, 5)" in str(info.value)
    assert len(stream("cpu").nodes) == n


def test_contiguous_of_view() -> None:
    a, x = _source()
    assert x.contiguous() is x
    braze.reset_stats()
    c = x.T.contiguous()
    assert braze.stats()["nodes_recorded"] == 1 and not c.shares_storage(x)
    np.testing.assert_array_equal(c.numpy(), a.T)


def test_view_errors_record_nothing() -> None:
    _, x = _source()
    n = len(stream("cpu").nodes)
    braze.reset_stats()
    with pytest.raises(braze.ShapeMismatch):
        x.reshape(7, -1)
    with pytest.raises(braze.ShapeMismatch):
        x.view(-1, -1)
    with pytest.raises(braze.ShapeMismatch):
        x.expand(4, 7, 5)
    with pytest.raises(braze.DimOutOfRange):
        x.permute(0, 0, 1)
    with pytest.raises(braze.RankMismatch):
        x.permute(0, 1)
    with pytest.raises(braze.DimOutOfRange):
        x.transpose(0, 3)
    with pytest.raises(braze.DimOutOfRange):
        x.unsqueeze(4)
    with pytest.raises(braze.IndexOutOfRange):
        x.select(0, 4)
    with pytest.raises(braze.IndexOutOfRange):
        x.narrow(1, 4, 3)
    with pytest.raises(braze.IndexOutOfRange):
        x[4]
    with pytest.raises(braze.IndexOutOfRange):
        x[:, -7]
    with pytest.raises(braze.DimOutOfRange):
        x[0, 0, 0, 0]
    with pytest.raises(braze.ShapeMismatch):
        x.split([1, 2], 1)
    with pytest.raises(braze.RankMismatch):
        x.mT[0, 0].mT
    assert braze.stats()["nodes_recorded"] == 0
    assert len(stream("cpu").nodes) == n


def test_zero_dim_views() -> None:
    x = braze.tensor(3.5).realize()
    braze.reset_stats()
    assert x.reshape(1, 1).shape == (1, 1)
    assert x.unsqueeze(0).shape == (1,)
    assert x.flatten().shape == (1,)
    assert x.T.shape == () and x[None].shape == (1,) and x[...].shape == ()
    assert x.squeeze().shape == ()
    assert braze.stats()["nodes_recorded"] == 0 and braze.stats()["allocations"] == 0
    assert x.reshape(1, 1).item() == 3.5
