"""The cuda device as a user sees it: moving tensors and modules, mixing devices,
what it refuses, and the memory it counts (under Triton's interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

import braze
import braze.nn as nn
from braze.runtime.cuda_probe import gpu_count


def test_available_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    assert braze.cuda.is_available() and braze.cuda.device_count() == 1
    assert braze.cuda.interpreting() == (gpu_count() == 0) or braze.cuda.interpreting()
    monkeypatch.delenv("BRAZE_CUDA_INTERPRET", raising=False)
    if gpu_count() == 0:
        assert not braze.cuda.is_available()
        assert "BRAZE_CUDA_INTERPRET" in (braze.cuda.unavailable_reason() or "")
        with pytest.raises(braze.DeviceUnavailable, match="cuda"):
            braze.zeros(2, device="cuda")
    with pytest.raises(braze.DeviceUnavailable, match="cuda:1"):
        braze.ones(2).to("cuda:1")


def test_round_trip_and_copies() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = braze.tensor(a)
    c = x.T.to("cuda")  # a view moves as its values, contiguous
    assert c.device == braze.device("cuda") and c.shape == (4, 3) and c.is_contiguous()
    back = c.cpu()
    assert back.device == braze.device("cpu")
    np.testing.assert_array_equal(back.numpy(), a.T)
    host = c.numpy()  # a copy: writing it leaves the device tensor as it was
    host[0, 0] = 99
    assert c.numpy()[0, 0] == 0
    assert x.to("cpu") is x and c.to("cuda") is c
    h = x.to("cuda", braze.float16)  # moved, then cast there
    assert h.device.type == "cuda" and h.dtype is braze.float16
    np.testing.assert_array_equal(h.numpy().astype(np.float32), a)
    assert float((c + 1.0).sum().item()) == float(a.sum() + 12)


def test_mixing_devices_is_a_typed_error() -> None:
    a = braze.ones(2, 3)
    c = braze.ones(2, 3, device="cuda").realize()
    with pytest.raises(braze.DeviceMismatch, match="cpu.*cuda:0"):
        a + c
    with pytest.raises(braze.DeviceMismatch):
        c @ a.T
    assert len(braze.stream.stream("cuda:0").nodes) == 0  # nothing half-recorded
    np.testing.assert_array_equal((2.0 * c - 1.0).numpy(), np.ones((2, 3)))  # Python scalars go anywhere


def test_unsupported_op_names_it() -> None:
    c = braze.tensor(np.arange(6.0, dtype=np.float32), device="cuda")
    with pytest.raises(braze.Unsupported, match="topk.*cuda"):
        c.topk(2)[0].numpy()
    with pytest.raises(braze.Unsupported, match="sort.*cuda"):
        c.sort()[0].numpy()
    np.testing.assert_array_equal((c * 2.0).numpy(), np.arange(6.0) * 2)  # the stream is usable after


def test_module_to_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    braze.manual_seed(0)
    lin = nn.Linear(8, 4)
    x = braze.randn(3, 8)
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = lin(x).numpy()
    monkeypatch.setenv("BRAZE_FUSION", "1")
    lin.to("cuda")
    assert lin.weight.device.type == "cuda"
    np.testing.assert_allclose(lin(x.to("cuda")).numpy(), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(braze.DeviceMismatch):
        lin(x)


def test_memory_is_counted() -> None:
    x = braze.randn(256, 256)
    before = braze.stats()["live_bytes"]
    c = x.to("cuda")
    assert braze.stats()["live_bytes"] >= before + 256 * 256 * 4
    del c
