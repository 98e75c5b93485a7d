"""The cuda device's tests: under Triton's interpreter on machines without a GPU (the
whole directory skips, saying why, where Triton is not installed), and the
``requires_gpu`` tests only where a GPU is."""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Iterator

import numpy as np
import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (make install installs the gpu extra)", allow_module_level=True)

import braze
from braze.runtime.cuda_probe import gpu_count


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if gpu_count() == 0:
        skip = pytest.mark.skip(reason="needs a GPU: cuda.core finds none on this machine (these test the "
                                       "device runtime itself, which Triton's interpreter does not stand in for)")
        for item in items:
            if "requires_gpu" in item.keywords:
                item.add_marker(skip)


#: on a machine with a GPU the kernel tests run on it (``BRAZE_CUDA_INTERPRET=1`` forces
#: the interpreter there too); elsewhere under Triton's interpreter
ON_GPU = gpu_count() > 0 and os.environ.get("BRAZE_CUDA_INTERPRET", "").strip() in ("", "0")


@pytest.fixture(autouse=True)
def interpret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The cuda device on the GPU, or as Triton's interpreter on the host; fused (each
    test sets BRAZE_FUSION itself where it computes the reference)."""
    if not ON_GPU:
        monkeypatch.setenv("BRAZE_CUDA_INTERPRET", "1")
    monkeypatch.setenv("BRAZE_FUSION", "1")
    yield
    braze.synchronize()



@pytest.fixture
def on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU itself, not the interpreter (the ``requires_gpu`` tests of the device
    runtime, after ``interpret``): skips where the interpreter was asked for."""
    monkeypatch.delenv("BRAZE_CUDA_INTERPRET", raising=False)
    if braze.cuda.interpreting():
        pytest.skip("the interpreter was asked for (TRITON_INTERPRET or BRAZE_CUDA_INTERPRET)")


def on_both(monkeypatch: pytest.MonkeyPatch, fn: Any, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``fn`` over CPU tensors on the reference executor, and over the same data on the
    cuda device (Triton kernels); both results as numpy."""
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = fn(*[braze.tensor(a) for a in arrays]).numpy()
    monkeypatch.setenv("BRAZE_FUSION", "1")
    got = fn(*[braze.tensor(a, device="cuda") for a in arrays]).numpy()
    return got, ref
