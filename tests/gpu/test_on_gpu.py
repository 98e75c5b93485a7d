"""On a GPU only: the device-memory runtime itself. Storage is device memory, kernels
are compiled for the GPU and launched on braze's stream, a plan run again over the same
buffers replays as one CUDA graph, a gather's bad index still raises, and the
reference executor stages device memory through the host. (The kernel tests beside
this file also run on the GPU on such a machine: ``conftest.ON_GPU``.)"""

from __future__ import annotations

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.errors import IndexOutOfRange
from braze.runtime import cuda_memory

pytestmark = [pytest.mark.requires_gpu, pytest.mark.usefixtures("on_the_gpu")]


def _program(x: braze.Tensor) -> braze.Tensor:
    return F.gelu(braze.softmax(x * 2.0, -1) @ x.T) + 1.0


def test_storage_is_device_memory_and_kernels_match_the_cpu() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 300)).astype(np.float32)
    x = braze.tensor(a, device="cuda")
    assert isinstance(x._storage.array, cuda_memory.DeviceArray)
    y = _program(x)
    got = y.numpy()
    assert isinstance(y._storage.array, cuda_memory.DeviceArray)
    np.testing.assert_allclose(got, _program(braze.tensor(a)).numpy(), rtol=1e-4, atol=1e-4)
    b = a.astype(np.float32)
    for fn, tol in ((lambda t: F.layer_norm(t, (300,), eps=1e-5), 1e-4),
                    (lambda t: (t.to(braze.bfloat16) * 3.0).to(braze.float32).cumsum(-1), 0.2),
                    (lambda t: 0.5 * t * (1.0 + braze.erf(t / 2 ** 0.5)), 1e-5)):
        np.testing.assert_allclose(fn(braze.tensor(b, device="cuda")).numpy(), fn(braze.tensor(b)).numpy(),
                                   rtol=tol, atol=tol)


def test_a_plan_run_again_over_the_same_buffers_is_one_graph_launch() -> None:
    a = np.random.default_rng(4).standard_normal((32, 128)).astype(np.float32)
    x = braze.tensor(a, device="cuda")
    want = _program(braze.tensor(a)).numpy()
    before = braze.stats()
    for _ in range(5):
        y = _program(x)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
        del y  # its block goes back to the pool, and the next run gets the same one
    after = braze.stats()
    assert after["graphs_captured"] - before["graphs_captured"] >= 1
    assert after["graph_launches"] - before["graph_launches"] >= 2


def test_a_bad_index_raises_on_the_gpu() -> None:
    table = braze.tensor(np.arange(20, dtype=np.float32).reshape(5, 4), device="cuda")
    ids = braze.tensor(np.array([1, 7, 2]), device="cuda")
    with pytest.raises(IndexOutOfRange):
        F.embedding(ids, table).numpy()
    np.testing.assert_array_equal(F.embedding(braze.tensor(np.array([4, 0]), device="cuda"), table).numpy(),
                                  [[16, 17, 18, 19], [0, 1, 2, 3]])


def test_the_reference_executor_stages_through_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.random.default_rng(5).standard_normal((8, 50)).astype(np.float32)
    monkeypatch.setenv("BRAZE_FUSION", "0")
    y = _program(braze.tensor(a, device="cuda"))
    got = y.numpy()
    assert isinstance(y._storage.array, cuda_memory.DeviceArray)
    monkeypatch.setenv("BRAZE_FUSION", "1")
    np.testing.assert_allclose(got, _program(braze.tensor(a, device="cuda")).numpy(), rtol=1e-4, atol=1e-4)


def test_synchronize_waits_and_memory_comes_back() -> None:
    before = braze.stats()["live_bytes"]
    x = braze.zeros(1 << 20, device="cuda") + 1.0
    braze.cuda.synchronize()
    assert braze.stats()["live_bytes"] >= before + (4 << 20)
    assert float(x.sum().item()) == float(1 << 20)
    del x
    assert braze.stats()["live_bytes"] == before
    braze.cuda.empty_cache()
    assert cuda_memory.free_bytes() == 0
