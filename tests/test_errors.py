"""Typed errors: the right class (and builtin base), raised at the call that made the
mistake, naming the op and its operands, and leaving nothing half-recorded.

Data-dependent mistakes (indices computed lazily) can only be found when the stream
runs: they raise at the sync point, leave the stream empty, and the tensors the flush
could not compute raise a BrazeError when read rather than returning garbage.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

import braze
from braze.device import Device
from braze.layout import Layout
from braze.storage import Storage
from braze.stream import stream


@pytest.fixture
def clean() -> Iterator[None]:
    braze.synchronize()
    yield
    braze.set_memory_limit(None)
    braze.synchronize()


def _queued() -> int:
    return len(stream("cpu").nodes)


def _raises_cleanly(err: type[BaseException], call: Callable[[], Any], *fragments: str) -> BaseException:
    """``call`` raises ``err`` at once, records nothing, and ``str(err)`` names every fragment."""
    n, rec = _queued(), braze.stats()["nodes_recorded"]
    with pytest.raises(err) as info:
        call()
    assert _queued() == n, "the failing call left nodes on the stream"
    assert braze.stats()["nodes_recorded"] == rec, "the failing call recorded nodes"
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return info.value


def _cuda_tensor(shape: tuple[int, ...] = (2, 3)) -> braze.Tensor:
    """A tensor that claims to live on a GPU (no GPU backend exists): enough to reach
    the device checks, which run before anything would touch the data."""
    n = int(np.prod(shape))
    st = Storage(braze.float32, Device("cuda"), n, np.zeros(n, np.float32))
    return braze.Tensor(st, Layout.contiguous(shape))


def test_builtin_bases() -> None:
    assert issubclass(braze.ShapeMismatch, ValueError)
    assert issubclass(braze.RankMismatch, ValueError)
    assert issubclass(braze.DimOutOfRange, IndexError)
    assert issubclass(braze.IndexOutOfRange, IndexError)
    assert issubclass(braze.DtypeMismatch, TypeError)
    assert issubclass(braze.DeviceMismatch, RuntimeError)
    assert issubclass(braze.DeviceUnavailable, RuntimeError)
    assert issubclass(braze.OutOfMemory, MemoryError)
    assert issubclass(braze.Unsupported, NotImplementedError)
    assert issubclass(braze.FormatError, ValueError)
    for e in (braze.ShapeMismatch, braze.RankMismatch, braze.DimOutOfRange, braze.IndexOutOfRange,
              braze.DtypeMismatch, braze.DeviceMismatch, braze.DeviceUnavailable, braze.OutOfMemory,
              braze.Unsupported, braze.FormatError, braze.CompileError):
        assert issubclass(e, braze.BrazeError)


def test_shape_mismatch(clean: None) -> None:
    a = braze.ones(2, 3).realize()
    b = braze.ones(4, 5).realize()
    pos = (a > 0).realize()
    e = _raises_cleanly(braze.ShapeMismatch, lambda: a + b, "add", "(2, 3)", "(4, 5)")
    assert e.op == "add" and e.shapes == [(2, 3), (4, 5)]  # type: ignore[attr-defined]
    _raises_cleanly(braze.ShapeMismatch, lambda: a @ b, "matmul", "(2, 3)", "(4, 5)")
    _raises_cleanly(braze.ShapeMismatch, lambda: braze.cat([a, b], 0), "cat", "(2, 3)", "(4, 5)")
    _raises_cleanly(braze.ShapeMismatch, lambda: braze.stack([a, a.T]), "stack", "(2, 3)", "(3, 2)")
    _raises_cleanly(braze.ShapeMismatch, lambda: a.reshape(4, 2), "reshape", "(2, 3)", "(4, 2)")
    _raises_cleanly(braze.ShapeMismatch, lambda: a.T.view(6), "view", "(3, 2)", "(6,)")
    _raises_cleanly(braze.ShapeMismatch, lambda: a.expand(3, 3), "expand", "(2, 3)")
    _raises_cleanly(braze.ShapeMismatch, lambda: braze.where(pos, a, b), "where")
    _raises_cleanly(braze.ShapeMismatch, lambda: a.item(), "item", "(2, 3)")
    _raises_cleanly(braze.ShapeMismatch, lambda: bool(a), "(2, 3)")
    _raises_cleanly(braze.ShapeMismatch, lambda: a.masked_fill(braze.tensor([True, False]), 0.0), "masked_fill")
    with pytest.raises(ValueError):  # numpy-style except clauses still catch it
        a + b


def test_rank_mismatch(clean: None) -> None:
    a = braze.ones(2, 3).realize()
    e = _raises_cleanly(braze.RankMismatch, lambda: a.dims3(), "dims3", "rank 3", "rank 2", "(2, 3)")
    assert e.shape == (2, 3) and e.expected == 3  # type: ignore[attr-defined]
    _raises_cleanly(braze.RankMismatch, lambda: a.permute(1, 0, 2), "permute", "(2, 3)")
    _raises_cleanly(braze.RankMismatch, lambda: braze.tril(braze.tensor([1.0, 2.0])), "tril", "(2,)")
    _raises_cleanly(braze.RankMismatch, lambda: a.index_select(0, braze.tensor([[0]])), "index_select", "(1, 1)")
    _raises_cleanly(braze.RankMismatch, lambda: braze.tensor(1.0) @ a, "matmul", "()")
    cube = braze.ones(2, 2, 2).realize()
    _raises_cleanly(braze.RankMismatch, lambda: cube.t(), "t", "(2, 2, 2)")


def test_dim_out_of_range(clean: None) -> None:
    a = braze.ones(2, 3).realize()
    e = _raises_cleanly(braze.DimOutOfRange, lambda: a.sum(2), "sum", "dimension 2", "rank 2")
    assert e.dim == 2 and e.ndim == 2  # type: ignore[attr-defined]
    _raises_cleanly(braze.DimOutOfRange, lambda: a.softmax(-3), "dimension -3", "rank 2")
    _raises_cleanly(braze.DimOutOfRange, lambda: a.transpose(0, 5), "transpose", "dimension 5")
    _raises_cleanly(braze.DimOutOfRange, lambda: a.unsqueeze(3), "unsqueeze", "dimension 3")
    _raises_cleanly(braze.DimOutOfRange, lambda: braze.cat([a, a], 2), "cat")
    _raises_cleanly(braze.DimOutOfRange, lambda: a[0, 0, 0], "__getitem__", "rank 2")
    _raises_cleanly(braze.DimOutOfRange, lambda: a.sum((0, 0)), "sum")
    # composite ops whose first step would have recorded a node
    _raises_cleanly(braze.DimOutOfRange, lambda: a.sum(5, dtype=braze.float64), "sum")
    _raises_cleanly(braze.DimOutOfRange, lambda: a.mean(5, dtype=braze.float64), "mean")
    _raises_cleanly(braze.DimOutOfRange, lambda: braze.cumsum(a, 5, dtype=braze.float64), "cumsum")
    _raises_cleanly(braze.DimOutOfRange, lambda: braze.softmax(a, 5, dtype=braze.float64), "dimension 5")
    _raises_cleanly(braze.DimOutOfRange, lambda: braze.log_softmax(a, 5, dtype=braze.float64), "dimension 5")
    with pytest.raises(IndexError):
        a.sum(2)


def test_index_out_of_range(clean: None) -> None:
    a = braze.ones(2, 3).realize()
    e = _raises_cleanly(braze.IndexOutOfRange, lambda: a[2], "__getitem__", "index 2", "size 2")
    assert (e.index, e.size, e.dim) == (2, 2, 0)  # type: ignore[attr-defined]
    _raises_cleanly(braze.IndexOutOfRange, lambda: a[:, -4], "index -4", "dimension 1", "size 3")
    _raises_cleanly(braze.IndexOutOfRange, lambda: a.select(1, 3), "select")
    _raises_cleanly(braze.IndexOutOfRange, lambda: a.narrow(1, 2, 2), "narrow")
    idx = braze.tensor([0, 3]).realize()
    _raises_cleanly(braze.IndexOutOfRange, lambda: a.index_select(1, idx), "index_select", "index 3", "size 3")
    _raises_cleanly(braze.IndexOutOfRange, lambda: a[idx], "index 3", "size 2")
    _raises_cleanly(braze.IndexOutOfRange, lambda: braze.gather(a, 1, braze.tensor([[0, 5]])), "gather", "index 5")
    _raises_cleanly(braze.IndexOutOfRange, lambda: braze.one_hot(braze.tensor([1, 4]), 3), "one_hot")


def test_dtype_mismatch(clean: None) -> None:
    f = braze.ones(3).realize()
    i = braze.tensor([1, 2, 3]).realize()
    pos = (f > 0).realize()
    # mixed dtypes promote (tests/test_promotion.py); in place, a result of a higher
    # category does not cast back: the promoted add is taken back
    e = _raises_cleanly(braze.DtypeMismatch, lambda: i.add_(f), "add_", "int64", "float32")
    assert e.dtypes == [braze.int64, braze.float32]  # type: ignore[attr-defined]
    _raises_cleanly(braze.DtypeMismatch, lambda: i.masked_fill(pos, 1.5), "masked_fill", "int64", "1.5")
    _raises_cleanly(braze.DtypeMismatch, lambda: i.exp(), "exp", "int64")
    _raises_cleanly(braze.DtypeMismatch, lambda: braze.where(i, f, f), "where", "int64")
    _raises_cleanly(braze.DtypeMismatch, lambda: f.index_select(0, f), "index_select", "float32")
    _raises_cleanly(braze.DtypeMismatch, lambda: braze.softmax(i, 0), "softmax", "int64")
    _raises_cleanly(braze.DtypeMismatch, lambda: f[f], "__getitem__", "float32")
    _raises_cleanly(braze.DtypeMismatch, lambda: pos + pos, "add", "bool")
    _raises_cleanly(braze.DtypeMismatch, lambda: braze.tensor([1], dtype=braze.uint8) + 300, "add", "300")
    # composite ops: the first nodes (maximum, minimum; the cast) are taken back
    _raises_cleanly(braze.DtypeMismatch, lambda: i.clamp_(0, 1.5), "clamp_", "int64", "float32")
    _raises_cleanly(braze.DtypeMismatch, lambda: braze.softmax(f, 0, dtype=braze.int32), "softmax", "int32")
    _raises_cleanly(braze.DtypeMismatch, lambda: i.div_(2), "div_", "int64", "float32")
    with pytest.raises(TypeError):
        pos - pos


def test_device_mismatch(clean: None) -> None:
    a = braze.ones(2, 3).realize()
    c = _cuda_tensor()
    pos = (a > 0).realize()
    e = _raises_cleanly(braze.DeviceMismatch, lambda: a + c, "add", "cpu", "cuda:0")
    assert e.devices == [Device("cpu"), Device("cuda")]  # type: ignore[attr-defined]
    _raises_cleanly(braze.DeviceMismatch, lambda: c * a, "mul", "cuda:0", "cpu")
    _raises_cleanly(braze.DeviceMismatch, lambda: a @ c.T, "matmul", "cpu", "cuda:0")
    _raises_cleanly(braze.DeviceMismatch, lambda: braze.cat([a, c]), "cat", "cpu", "cuda:0")
    _raises_cleanly(braze.DeviceMismatch, lambda: braze.where(pos, a, c), "where", "cuda:0")
    _raises_cleanly(braze.DeviceMismatch, lambda: a.copy_(c), "copy_", "cuda:0")
    _raises_cleanly(braze.DeviceMismatch, lambda: a.add_(c), "cuda:0")
    assert len(stream("cuda:0").nodes) == 0
    with pytest.raises(RuntimeError):
        a + c


def test_device_unavailable(clean: None) -> None:
    e = _raises_cleanly(braze.DeviceUnavailable, lambda: braze.zeros(2, device="cuda"), "cuda")
    assert e.device == "cuda:0"  # type: ignore[attr-defined]
    a = braze.ones(2).realize()
    _raises_cleanly(braze.DeviceUnavailable, lambda: a.to("cuda"), "to", "cuda")
    _raises_cleanly(braze.DeviceUnavailable, lambda: a.to("cuda:1", braze.float64), "cuda:1")
    _raises_cleanly(braze.DeviceUnavailable, lambda: braze.tensor([1.0], device="cuda"), "tensor", "cuda")
    _raises_cleanly(braze.DeviceUnavailable, lambda: braze.arange(3, device="cuda"), "arange")
    _raises_cleanly(braze.DeviceUnavailable, lambda: braze.randn(3, device="cuda"), "cuda")
    _raises_cleanly(braze.Unsupported, lambda: braze.zeros(2, device="tpu"), "tpu")
    assert a.to("cpu") is a and a.to(braze.device("cpu")) is a


def test_out_of_memory(clean: None) -> None:
    small = braze.ones(10).realize()
    braze.set_memory_limit(braze.stats()["live_bytes"] + 1000)
    try:
        e = _raises_cleanly(braze.OutOfMemory, lambda: braze.zeros(1000, 1000), "full", "4000000", "out of memory")
        assert e.requested == 4_000_000  # type: ignore[attr-defined]
        assert 0 <= e.available <= 1000  # type: ignore[attr-defined]
        assert str(e.available) in str(e)  # type: ignore[attr-defined]
        assert e.device == "cpu"  # type: ignore[attr-defined]
        big = small.expand(100_000, 10)  # a view: free
        _raises_cleanly(braze.OutOfMemory, lambda: big + 1.0, "add", "4000000")
        _raises_cleanly(braze.OutOfMemory, lambda: braze.empty(1000, 1000), "empty")
        _raises_cleanly(braze.OutOfMemory, lambda: braze.tensor(np.zeros(100_000)), "tensor")
        # small work still fits
        assert (small + 1.0).sum().item() == 20.0
        with pytest.raises(MemoryError):
            braze.zeros(1000, 1000)
    finally:
        braze.set_memory_limit(None)
    assert braze.memory_limit() is None
    assert braze.zeros(1000, 1000).shape == (1000, 1000)


def test_unsupported(clean: None) -> None:
    a = braze.ones(2, 3).realize()
    _raises_cleanly(braze.Unsupported, lambda: a.to("float7"), "to", "float7")
    _raises_cleanly(braze.Unsupported, lambda: a[::-1], "__getitem__", "step")
    _raises_cleanly(braze.Unsupported, lambda: a + "x", "add", "str")
    _raises_cleanly(braze.Unsupported, lambda: braze.gelu(a, approximate="fast"), "gelu", "fast")
    _raises_cleanly(braze.Unsupported, lambda: braze.from_numpy(np.zeros(2, np.complex64)), "from_numpy", "complex64")
    _raises_cleanly(braze.Unsupported, lambda: braze.pad(a, (1, 1), mode="mirror"), "pad", "mirror")
    with pytest.raises(NotImplementedError):
        a[::-1]


# -- errors only the flush can find ---------------------------------------------------------

def test_lazy_index_error_raises_at_sync(clean: None) -> None:
    x = braze.tensor([1.0, 2.0, 3.0]).realize()
    before = (x * 2)                        # recorded before the bad node: computed
    idx = braze.arange(3) + 10              # indices known only when the stream runs
    bad = x.index_select(0, idx)            # the call cannot know: no error yet
    after = bad + 1                         # depends on the bad node
    later = x - 1                           # queued behind the bad node
    assert _queued() >= 4
    with pytest.raises(braze.IndexOutOfRange) as info:
        bad.numpy()
    assert "index_select" in str(info.value) and "12" in str(info.value) and "size 3" in str(info.value)
    assert _queued() == 0, "a failed flush must leave the stream empty"
    assert before.tolist() == [2.0, 4.0, 6.0]
    for lost in (bad, after, later):
        with pytest.raises(braze.BrazeError, match="earlier flush failed"):
            lost.numpy()
        with pytest.raises(braze.BrazeError):
            lost.item() if lost.numel() == 1 else lost.tolist()
    # views of a lost tensor are lost too
    with pytest.raises(braze.BrazeError):
        bad[0].item()
    # unrelated tensors, old and new, keep working; so does the stream
    assert x.tolist() == [1.0, 2.0, 3.0]
    assert (x + 1).tolist() == [2.0, 3.0, 4.0]
    assert idx.tolist() == [10, 11, 12]
    assert x.index_select(0, idx - 10).tolist() == [1.0, 2.0, 3.0]


def test_lazy_error_drops_writes_queued_behind_it(clean: None) -> None:
    """Decided behaviour: nodes queued behind the failing node never run. A write among
    them is dropped, so its target keeps the values it had, as if the program had
    stopped at the failing op (which is what eager execution would have done)."""
    x = braze.tensor([1.0, 2.0, 3.0]).realize()
    bad = x.index_select(0, braze.arange(2) - 5)
    x[0] = 100.0
    with pytest.raises(braze.IndexOutOfRange):
        braze.synchronize()
    assert _queued() == 0
    assert x.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(braze.BrazeError):
        bad.numpy()


def test_error_carries_op_attribute() -> None:
    err = braze.ShapeMismatch("matmul", [(2, 3), (4, 5)], "inner dims differ")
    assert err.op == "matmul"
    assert str(err) == "matmul: shapes (2, 3), (4, 5) do not fit: inner dims differ"
    err2 = braze.IndexOutOfRange("select", 7, 3, 1)
    assert str(err2) == "select: index 7 out of range for dimension 1 of size 3"
    assert braze.OutOfMemory(10, 5).requested == 10


def test_lazy_negative_indices_wrap_like_pytorch(clean: None) -> None:
    """``x[idx]`` accepts negative indices even when idx is not computed yet; an index
    below ``-size`` is still an error, found when the stream runs."""
    x = braze.tensor([10.0, 20.0, 30.0]).realize()
    assert x[braze.arange(3) - 1].tolist() == [30.0, 10.0, 20.0]
    assert x[braze.arange(2).reshape(2, 1) - 2].tolist() == [[20.0], [30.0]]
    bad = x[braze.arange(2) - 5]
    with pytest.raises(braze.IndexOutOfRange):
        bad.numpy()
    assert _queued() == 0
