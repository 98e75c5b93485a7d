"""Writes: through views, ordered against the reads around them, atomic on error.

An in-place op is a node on the stream that writes into an existing storage. Nodes run
in recorded order, so a read recorded before a write sees the old values and a read
recorded after it, through any view of that storage, sees the new ones.
"""

from __future__ import annotations

import numpy as np
import pytest

import braze
from braze.stream import stream


def _base() -> tuple[np.ndarray, braze.Tensor]:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    return a, braze.tensor(a)


def _queued() -> int:
    return len(stream("cpu").nodes)


# -- writes are seen through every view -------------------------------------------------

WRITES = {
    "setitem_int": (lambda x: x.__setitem__(1, 7.0), lambda a: a.__setitem__(1, 7.0)),
    "setitem_slice": (lambda x: x.__setitem__((slice(None), slice(1, None, 2)), -1.0),
                      lambda a: a.__setitem__((slice(None), slice(1, None, 2)), -1.0)),
    "setitem_elem": (lambda x: x.__setitem__((2, -1), 9.0), lambda a: a.__setitem__((2, -1), 9.0)),
    "setitem_tensor_bcast": (lambda x: x.__setitem__(slice(0, 2), braze.tensor([1.0, 2, 3, 4])),
                             lambda a: a.__setitem__(slice(0, 2), [1.0, 2, 3, 4])),
    "setitem_numpy": (lambda x: x.__setitem__(0, np.array([5.0, 6, 7, 8], np.float32)),
                      lambda a: a.__setitem__(0, [5.0, 6, 7, 8])),
    "copy_": (lambda x: x[:, 0].copy_(braze.tensor([10.0, 20, 30])), lambda a: a.__setitem__((slice(None), 0), [10, 20, 30])),
    "copy_cast": (lambda x: x[0].copy_(braze.tensor([1, 2, 3, 4])), lambda a: a.__setitem__(0, [1, 2, 3, 4])),
    "fill_": (lambda x: x.T[1].fill_(3.5), lambda a: a.__setitem__((slice(None), 1), 3.5)),
    "zero_": (lambda x: x[1:].zero_(), lambda a: a.__setitem__(slice(1, None), 0)),
    "iadd_view": (lambda x: x[1].__iadd__(100.0), lambda a: a.__setitem__(1, a[1] + 100)),
    "add_": (lambda x: x.add_(braze.tensor([1.0, 2, 3, 4])), lambda a: a.__iadd__([1.0, 2, 3, 4])),
    "sub_mul_div": (lambda x: x.sub_(1.0).mul_(2.0).div_(4.0), lambda a: a.__setitem__(Ellipsis, (a - 1) * 2 / 4)),
    "imul_T": (lambda x: x.T.__imul__(braze.tensor([1.0, -1, 2])), lambda a: a.__imul__([[1.0], [-1], [2]])),
    "clamp_": (lambda x: x.clamp_(2.0, 8.0), lambda a: np.clip(a, 2, 8, out=a)),
    "masked_fill_": (lambda x: x.masked_fill_(x > 5.0, 0.0), lambda a: a.__setitem__(a > 5, 0)),
    "mask_assign": (lambda x: x.__setitem__(x > 6.0, -2.0), lambda a: a.__setitem__(a > 6, -2)),
    "mask_assign_rows": (lambda x: x.__setitem__(braze.tensor([True, False, True]), 1.0),
                         lambda a: a.__setitem__(np.array([True, False, True]), 1)),
    "mask_assign_values": (lambda x: x.__setitem__(x > 8.0, braze.tensor([-1.0, -2, -3])),
                           lambda a: a.__setitem__(a > 8, [-1, -2, -3])),
    "mask_assign_row_values": (lambda x: x.__setitem__(braze.tensor([True, False, True]), braze.tensor([[0.0, 1, 2, 3],
                                                                                                       [4, 5, 6, 7]])),
                               lambda a: a.__setitem__(np.array([True, False, True]), [[0, 1, 2, 3], [4, 5, 6, 7]])),
    "int_index_assign": (lambda x: x.__setitem__(braze.tensor([2, 0]), 5.0), lambda a: a.__setitem__([2, 0], 5.0)),
    "int_index_assign_neg": (lambda x: x.__setitem__([-1], braze.tensor([1.0, 2, 3, 4])),
                             lambda a: a.__setitem__([-1], [1.0, 2, 3, 4])),
    "int_index_assign_rows": (lambda x: x.__setitem__(braze.tensor([0, 2]), braze.tensor([[1.0], [2.0]])),
                              lambda a: a.__setitem__([0, 2], [[1.0], [2.0]])),
    "write_through_reshape": (lambda x: x.reshape(2, 6)[1, 1:3].fill_(-5.0), lambda a: a.reshape(2, 6)[1, 1:3].fill(-5)),
    "write_through_unsqueeze": (lambda x: x[None, :, 2].fill_(4.0), lambda a: a.__setitem__((slice(None), 2), 4)),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_write_is_seen_through_every_view(name: str) -> None:
    a, x = _base()
    views = [x.T, x.reshape(12), x[1:], x.unsqueeze(0), x.mT[::2]]
    write, np_write = WRITES[name]
    write(x)
    np_write(a)
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal(views[0].numpy(), a.T)
    np.testing.assert_array_equal(views[1].numpy(), a.reshape(12))
    np.testing.assert_array_equal(views[2].numpy(), a[1:])
    np.testing.assert_array_equal(views[3].numpy(), a[None])
    np.testing.assert_array_equal(views[4].numpy(), a.T[::2])
    # a view made after the write sees the new data too
    np.testing.assert_array_equal(x.permute(1, 0)[1].numpy(), a.T[1])


def test_inplace_returns_self_and_keeps_identity() -> None:
    _, x = _base()
    y = x
    x += 1.0
    assert x is y
    assert x.add_(1.0) is x and x.fill_(0.0) is x and x.zero_() is x and x[0].copy_(1.0).shares_storage(x)


# -- ordering ---------------------------------------------------------------------------

def test_read_before_write_sees_old_values() -> None:
    _, x = _base()
    y = x * 1
    x[0] = 5.0
    z = x * 1
    assert y.numpy()[0, 0] == 0.0
    assert z.numpy()[0, 0] == 5.0
    assert x.numpy()[0, 0] == 5.0


def test_ordering_on_a_pending_tensor() -> None:
    """The write targets a storage whose producer has not run yet."""
    x = braze.arange(6).to(braze.float32)  # pending
    before = x.sum()
    x[2] = 100.0
    x.add_(1.0)
    after = x.sum()
    assert _queued() > 0
    assert before.item() == 15.0
    assert after.item() == 15.0 - 2 + 100 + 6
    assert x.tolist() == [1.0, 2.0, 101.0, 4.0, 5.0, 6.0]


def test_ordering_through_other_views() -> None:
    _, x = _base()
    v = x.T
    old = v[1, 0] * 1
    x[0, 1] = 7.0
    new = v[1, 0] * 1
    assert old.item() == 1.0
    assert new.item() == 7.0
    assert v[1, 0].item() == 7.0
    # a write through the view is seen by the base, also in order
    r = x.sum()
    v[2, :] = 0.0
    assert r.item() == pytest.approx(np.arange(12).sum() - 1 + 7)
    assert x.numpy()[:, 2].tolist() == [0.0, 0.0, 0.0]
    assert x.numpy()[:, 1].tolist() == [7.0, 5.0, 9.0]


def test_many_interleaved_reads_and_writes() -> None:
    x = braze.zeros(4)
    snaps = []
    for i in range(5):
        snaps.append(x.clone())
        x[i % 4] = float(i + 1)
    a = np.zeros(4, np.float32)
    for i, s in enumerate(snaps):
        np.testing.assert_array_equal(s.numpy(), a)
        a[i % 4] = i + 1
    np.testing.assert_array_equal(x.numpy(), a)


def test_overlapping_self_copy_matches_numpy() -> None:
    """``x[1:] = x[:-1]`` reads and writes overlapping memory. braze defines it as
    numpy does: the result is as if the source were read completely first."""
    a = np.arange(6, dtype=np.float32)
    x = braze.tensor(a)
    x[1:] = x[:-1]
    a2 = a.copy()
    a2[1:] = a2[:-1]
    np.testing.assert_array_equal(x.numpy(), a2)
    assert x.tolist() == [0, 0, 1, 2, 3, 4]
    # the other direction, and the explicit clone, agree
    y = braze.tensor(a)
    y[:-1] = y[1:]
    assert y.tolist() == [1, 2, 3, 4, 5, 5]
    z = braze.tensor(a)
    z[1:] = z[:-1].clone()
    assert z.tolist() == [0, 0, 1, 2, 3, 4]
    # overlapping through a transpose of a square matrix: x.copy_(x.T)
    m = np.arange(9, dtype=np.float32).reshape(3, 3)
    t = braze.tensor(m)
    t.copy_(t.T)
    np.testing.assert_array_equal(t.numpy(), m.T)
    # pending source and target
    p = braze.arange(6)
    p[2:] = p[:4]
    assert p.tolist() == [0, 1, 0, 1, 2, 3]


# -- from_numpy sharing, read-only data ---------------------------------------------------

def test_from_numpy_write_shows_in_numpy_after_sync() -> None:
    a = np.zeros((2, 3), np.float32)
    x = braze.from_numpy(a)
    x[1, 2] = 4.0
    x[0] += 1.0
    braze.synchronize()
    assert a[1, 2] == 4.0 and a[0].tolist() == [1.0, 1.0, 1.0]
    # a non-contiguous numpy view is shared too
    b = np.zeros((4, 6), np.float32)
    col = b[::2, 1::2]
    y = braze.from_numpy(col)
    y.fill_(2.0)
    y.realize()
    assert b[::2, 1::2].tolist() == [[2.0] * 3] * 2 and b.sum() == 12.0
    # and a numpy-side write is seen by braze reads recorded after it
    b[0, 1] = 9.0
    assert y[0, 0].item() == 9.0


def test_readonly_writes_raise_at_the_call() -> None:
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    x = braze.from_numpy(a)
    mask = (x > 1.0).realize()
    z4 = braze.zeros(4).realize()
    n, rec = _queued(), braze.stats()["nodes_recorded"]
    for write in (lambda: x.__setitem__(0, 1.0), lambda: x.copy_(z4), lambda: x.fill_(1.0),
                  lambda: x.zero_(), lambda: x.add_(1.0), lambda: x[1:].mul_(2.0), lambda: x.clamp_(0.0),
                  lambda: x.__setitem__(mask, 0.0), lambda: x.__setitem__([0], 0.0),
                  lambda: x.masked_fill_(mask, 0.0)):
        with pytest.raises(braze.Unsupported, match="read-only"):
            write()
    def iadd() -> None:
        nonlocal x
        x += 1.0
    with pytest.raises(braze.Unsupported):
        iadd()
    assert _queued() == n and braze.stats()["nodes_recorded"] == rec
    assert x.tolist() == [0, 1, 2, 3]
    assert not x.numpy().flags.writeable
    c = x.clone()
    c[0] = 5.0
    assert c.tolist() == [5, 1, 2, 3] and a[0] == 0


def test_write_to_expanded_view_is_refused() -> None:
    x = braze.zeros(1, 3).realize()
    e = x.expand(4, 3)
    n = _queued()
    with pytest.raises(braze.Unsupported, match="expanded"):
        e.fill_(1.0)
    with pytest.raises(braze.Unsupported):
        e[0] = 1.0
    assert _queued() == n
    e2 = x.expand(1, 3)  # no dim actually repeats: a plain write
    e2.fill_(2.0)
    assert x.tolist() == [[2.0, 2.0, 2.0]]


# -- failing in-place calls leave nothing behind --------------------------------------------

def test_failed_inplace_records_nothing() -> None:
    x = braze.zeros(3).realize()
    xi = braze.tensor([1, 2, 3]).realize()
    big = braze.zeros(2, 3).realize()
    wrong = braze.tensor([1, 2]).realize()
    mask = braze.tensor([False, True, True])
    braze.synchronize()
    rec = braze.stats()["nodes_recorded"]
    cases = [
        (braze.ShapeMismatch, lambda: x.copy_(wrong)),          # cast would be recorded first
        (braze.ShapeMismatch, lambda: x.add_(big)),              # x + big is (2, 3)
        (braze.ShapeMismatch, lambda: x.__setitem__(slice(None), big)),
        (braze.DtypeMismatch, lambda: xi.div_(2)),               # int / int is float
        (braze.DtypeMismatch, lambda: xi.add_(x)),               # float result: no cast back to int
        (braze.IndexOutOfRange, lambda: x.__setitem__(braze.tensor([0, 3]), 1.0)),
        (braze.IndexOutOfRange, lambda: x.__setitem__([-4], 1.0)),
        (braze.ShapeMismatch, lambda: x.__setitem__(braze.tensor([True, False]), 1.0)),
        (braze.ShapeMismatch, lambda: x.__setitem__(mask, braze.tensor([1.0, 2.0, 3.0]))),
        (braze.ShapeMismatch, lambda: x.__setitem__(braze.tensor([0, 1]), braze.tensor([1.0, 2, 3]))),
        (braze.IndexOutOfRange, lambda: x.__setitem__(3, 1.0)),
        (braze.DtypeMismatch, lambda: xi.__setitem__(0, 1.5)),
    ]
    for err, call in cases:
        with pytest.raises(err):
            call()
        assert _queued() == 0, call
        assert braze.stats()["nodes_recorded"] == rec
    assert x.tolist() == [0.0, 0.0, 0.0] and xi.tolist() == [1, 2, 3]


def test_int_index_assign_duplicates_last_wins_and_casts() -> None:
    x = braze.zeros(4, dtype=braze.int32)
    x[braze.tensor([1, 1, 3])] = braze.tensor([5, 6, 7], dtype=braze.int32)
    assert x.tolist() == [0, 6, 0, 7]
    y = braze.zeros(3)
    y[[0, 2]] = braze.tensor([1, 2])  # int64 values cast to float32, as copy_ does
    assert y.tolist() == [1.0, 0.0, 2.0]
