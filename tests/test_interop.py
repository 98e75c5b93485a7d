"""numpy and DLPack interop: zero-copy both ways where strides allow, plain Python
values out of ``tolist``/``item``, and bfloat16 through ``ml_dtypes``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import braze


def test_numpy_is_zero_copy_once_realised() -> None:
    t = braze.arange(6).reshape(2, 3) * 2
    a1 = t.numpy()
    a2 = t.numpy()
    assert np.shares_memory(a1, a2)
    assert a1.flags.writeable
    a1[1, 2] = -7
    assert t[1, 2].item() == -7
    assert t.sum().item() == 2 * 15 - 10 - 7
    # views hand out views of the same memory
    col = t.T[2].numpy()
    assert np.shares_memory(col, a1) and col.tolist() == [4, -7]
    assert t.T.numpy().strides == a1.T.strides


def test_from_numpy_is_zero_copy() -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = braze.from_numpy(a)
    assert t.dtype == braze.float32 and t.shape == (4, 6) and t.is_contiguous()
    assert np.shares_memory(t.numpy(), a)
    a[0, 0] = 100.0
    assert t[0, 0].item() == 100.0
    # non-contiguous views keep their strides, still without a copy
    for view in (a[:, ::2], a.T, a[1:3, 2:5], a[None, :, 3], np.broadcast_to(a[:1], (3, 4, 6)).transpose(1, 0, 2)):
        braze.reset_stats()
        v = braze.from_numpy(view)
        assert braze.stats()["allocations"] == 0
        assert v.shape == view.shape
        assert v.stride() == tuple(s // 4 for s in view.strides)
        got = v.numpy()
        assert np.shares_memory(got, a)
        np.testing.assert_array_equal(got, view)
        np.testing.assert_array_equal((v + 0.0).numpy(), view)


def test_from_numpy_copies_negative_strides_and_foreign_byte_order() -> None:
    a = np.arange(10, dtype=np.int32)
    r = a[::-2]
    t = braze.from_numpy(r)
    assert t.tolist() == [9, 7, 5, 3, 1]
    assert not np.shares_memory(t.numpy(), a)
    assert t.is_contiguous()
    m = np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::-1]
    assert braze.from_numpy(m).tolist() == [[2, 1, 0], [5, 4, 3]]
    big = np.arange(4, dtype=">f4")
    tb = braze.from_numpy(big)
    assert tb.dtype == braze.float32 and tb.tolist() == [0, 1, 2, 3]


def test_from_numpy_edge_cases() -> None:
    z = braze.from_numpy(np.array(2.5, dtype=np.float64))
    assert z.shape == () and z.dtype == braze.float64 and z.item() == 2.5
    e = braze.from_numpy(np.zeros((0, 3), np.int16))
    assert e.shape == (0, 3) and e.dtype == braze.int16 and e.tolist() == []
    assert braze.from_numpy(np.array([True, False])).dtype == braze.bool_
    with pytest.raises(braze.Unsupported):
        braze.from_numpy([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(braze.Unsupported, match="complex128"):
        braze.from_numpy(np.zeros(2, np.complex128))
    # the tensor keeps the array's memory alive on its own
    t = braze.from_numpy(np.arange(5, dtype=np.int64)[1:])
    import gc
    gc.collect()
    assert t.tolist() == [1, 2, 3, 4]


def test_readonly_numpy_stays_readonly() -> None:
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = braze.from_numpy(a)
    out = t.numpy()
    assert np.shares_memory(out, a)
    assert not out.flags.writeable
    with pytest.raises(braze.Unsupported):
        t[0] = 1.0


def test_array_protocol() -> None:
    t = braze.tensor([[1.0, 2.0], [3.0, 4.0]]) * 1
    a = np.asarray(t)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    np.testing.assert_array_equal(a, [[1, 2], [3, 4]])
    assert np.shares_memory(a, t.numpy())
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    c = np.array(t, copy=True)
    assert not np.shares_memory(c, t.numpy())
    assert np.sum(t.numpy()) == 10.0
    # numpy on the left defers to braze: the result is a (lazy) tensor
    r = np.ones((2, 2), np.float32) + t
    assert isinstance(r, braze.Tensor) and r.tolist() == [[2, 3], [4, 5]]


def test_dlpack_round_trip() -> None:
    t = braze.arange(12).reshape(3, 4).to(braze.float32) * 1
    a = np.from_dlpack(t)
    assert a.dtype == np.float32 and a.shape == (3, 4)
    assert np.shares_memory(a, t.numpy())
    assert t.__dlpack_device__() == (1, 0)
    b = np.arange(8, dtype=np.int16).reshape(2, 4)[:, 1:]
    u = braze.from_dlpack(b)
    assert u.dtype == braze.int16 and u.shape == (2, 3)
    assert np.shares_memory(u.numpy(), b)
    assert u.tolist() == b.tolist()
    w = braze.from_dlpack(t)
    assert np.shares_memory(w.numpy(), t.numpy())
    np.testing.assert_array_equal(w.numpy(), np.arange(12).reshape(3, 4))
    # numpy's DLPack has no bfloat16: the standard BufferError, not a crash
    with pytest.raises(BufferError):
        np.from_dlpack(braze.tensor([1.0], dtype=braze.bfloat16))


def test_bfloat16_round_trip() -> None:
    vals = [1.0, -2.5, 0.1, 3e38, float("inf")]
    t = braze.tensor(vals, dtype=braze.bfloat16)
    a = t.numpy()
    assert a.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(a, np.array(vals, dtype=ml_dtypes.bfloat16))
    back = braze.from_numpy(a)
    assert back.dtype == braze.bfloat16 and np.shares_memory(back.numpy(), a)
    lst = t.tolist()
    assert all(type(v) is float for v in lst)
    assert lst[0] == 1.0 and lst[1] == -2.5 and lst[2] == float(ml_dtypes.bfloat16(0.1))
    assert type(t[1].item()) is float and t[1].item() == -2.5
    src = np.array([0.5, 1.5], dtype=ml_dtypes.bfloat16)
    assert braze.from_numpy(src).to(braze.float32).tolist() == [0.5, 1.5]
    assert braze.tensor(src).dtype == braze.bfloat16
    assert "bfloat16" in repr(t)


@pytest.mark.parametrize("dtype,kind", [(braze.float32, float), (braze.float64, float), (braze.float16, float),
                                        (braze.int64, int), (braze.int8, int), (braze.uint8, int),
                                        (braze.int32, int), (braze.bool_, bool)])
def test_tolist_and_item_types(dtype: braze.DType, kind: type) -> None:
    t = braze.tensor([[1, 0], [1, 1]], dtype=dtype)
    lst = t.tolist()
    assert isinstance(lst, list) and isinstance(lst[0], list)
    assert all(type(v) is kind for row in lst for v in row)
    assert lst == [[kind(1), kind(0)], [kind(1), kind(1)]]
    assert type(t[0, 0].item()) is kind
    assert type(t[0, 0].tolist()) is kind  # a 0-d tensor gives a scalar, as in PyTorch
    assert type(t.reshape(4)[:1].item()) is kind  # one element of any rank
    assert t[:0].tolist() == []


def test_scalar_conversions() -> None:
    assert float(braze.tensor(2.5)) == 2.5
    assert int(braze.tensor([7])) == 7
    assert [10, 20, 30][braze.tensor(2)] == 30
    with pytest.raises(braze.DtypeMismatch):
        [1, 2][braze.tensor(1.0)]
    with pytest.raises(braze.ShapeMismatch):
        braze.tensor([1.0, 2.0]).item()
    assert braze.tensor(3.0).shape == ()
    assert braze.tensor([[1, 2]]).shape == (1, 2)


def test_dims() -> None:
    t = braze.zeros(2, 3, 4)
    assert t.dims3() == (2, 3, 4)
    b, n, d = t.dims3()
    assert (b, n, d) == (2, 3, 4)
    assert t[0].dims2() == (3, 4) and t[0, 0].dims1() == (4,) and t[0, 0, 0].dims0() == ()
    assert t[None].dims4() == (1, 2, 3, 4) and t[None, None].dims5() == (1, 1, 2, 3, 4)
    with pytest.raises(braze.RankMismatch) as info:
        t[0].dims3()
    assert "dims3" in str(info.value) and "(3, 4)" in str(info.value)
    assert info.value.expected == 3 and info.value.shape == (3, 4)
    with pytest.raises(ValueError):
        t.dims2()
