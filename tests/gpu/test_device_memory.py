"""The device-memory runtime's bookkeeping (``runtime/cuda_memory.py``) over a host-backed
stand-in for the CUDA driver (``fake_driver.py``): on a machine without a GPU this is
what checks that cuda storages hold device buffers, that copies to and from them move
the right bytes, that the pool reuses blocks and the budget counts them. Kernels need
a real GPU (``test_on_gpu.py``); here the cuda stream runs its reference executor, which
on a GPU stages device memory through the host."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import braze
from braze.errors import OutOfMemory
from braze.runtime import cuda as runtime
from braze.runtime import cuda_memory

from .fake_driver import FakeDriver


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    d = FakeDriver(capacity=64 << 20)
    monkeypatch.setattr(cuda_memory, "_driver", d)
    monkeypatch.setattr(cuda_memory, "_stream", 7)
    monkeypatch.setattr(cuda_memory, "_free", {})
    monkeypatch.setattr(cuda_memory, "_free_bytes", 0)
    monkeypatch.setattr(cuda_memory, "on_gpu", lambda: True)
    monkeypatch.setattr(runtime, "_mirrors", type(runtime._mirrors)())
    monkeypatch.setenv("BRAZE_FUSION", "0")  # kernels need a real GPU: the staged reference runs
    yield d
    braze.synchronize()


def test_a_cuda_tensor_lives_in_device_memory_and_comes_back_exactly(fake: FakeDriver) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.5
    t = braze.tensor(a, device="cuda")
    assert isinstance(t._storage.array, cuda_memory.DeviceArray)
    np.testing.assert_array_equal(t.numpy(), a)
    # views read only their span back, at their offset and strides
    np.testing.assert_array_equal(t[1, :, 1:3].numpy(), a[1, :, 1:3])
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(t.to("cpu").numpy(), a)
    assert t.to("cpu").device.type == "cpu"
    assert braze.empty(5, device="cuda")._storage.array.nbytes == 20


def test_device_bytes_are_counted_and_blocks_go_back_to_the_pool(fake: FakeDriver) -> None:
    before = braze.stats()["live_bytes"]
    t = braze.tensor(np.ones(1 << 18, np.float32), device="cuda")
    assert braze.stats()["live_bytes"] - before == 1 << 20
    del t
    assert braze.stats()["live_bytes"] == before
    allocs = fake.calls.count("alloc")
    hits = braze.stats()["pool_hits"]
    u = braze.tensor(np.zeros(1 << 18, np.float32), device="cuda")
    assert fake.calls.count("alloc") == allocs and braze.stats()["pool_hits"] == hits + 1
    np.testing.assert_array_equal(u.numpy(), 0)


def test_past_the_device_or_the_budget_is_out_of_memory_on_cuda(fake: FakeDriver) -> None:
    keep = braze.tensor(np.ones(4 << 20, np.float32), device="cuda")  # 16 MiB of the 64
    free = braze.tensor(np.ones(8 << 20, np.float32), device="cuda")
    del free  # pooled: given back to the driver before an allocation fails
    with pytest.raises(OutOfMemory) as e:
        braze.empty(15 << 20, device="cuda")  # 60 MiB
    assert e.value.device == "cuda" and e.value.requested == 60 << 20
    assert "free" in fake.calls
    braze.set_memory_limit(braze.stats()["live_bytes"] + 1000)
    try:
        with pytest.raises(OutOfMemory):
            braze.empty(1000, device="cuda")
    finally:
        braze.set_memory_limit(None)
    np.testing.assert_array_equal(keep.numpy()[:3], 1)


def test_the_reference_executor_stages_device_memory_through_the_host(fake: FakeDriver) -> None:
    a = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    x = braze.tensor(a, device="cuda")
    y = braze.softmax(x * 2.0, -1) + 1
    x.add_(1.0)  # an in-place write goes back to the device too
    got = y.numpy()
    e = np.exp(2 * a - (2 * a).max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True) + 1, rtol=1e-5)
    np.testing.assert_allclose(x.numpy(), a + 1)
    assert isinstance(y._storage.array, cuda_memory.DeviceArray)
    assert isinstance(x._storage.array, cuda_memory.DeviceArray)


def test_scalar_constants_get_one_device_copy_each(fake: FakeDriver) -> None:
    c = braze.tensor(3.5)._storage
    p = runtime.arg(c)
    assert isinstance(p, runtime.Pointer) and p.dtype == "float32"
    assert runtime.arg(c).data_ptr() == p.data_ptr()  # uploaded once
    host = np.empty(1, np.float32)
    fake.cuMemcpyDtoHAsync(host.ctypes.data, p.data_ptr(), 4, 7)
    assert host[0] == 3.5
