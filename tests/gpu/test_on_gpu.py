"""On a GPU only: the Triton source braze renders, compiled for the device (not the
interpreter) and run on device memory. braze's device-memory runtime is not built yet,
so each launch stages its buffers through ``cuda.bindings`` (host -> device, launch,
device -> host); what this checks is that the generated kernels compile and compute
on real hardware what they compute under the interpreter."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.runtime import cuda as runtime

from .conftest import on_both


def _ok(result: Any) -> Any:
    from cuda.bindings import driver
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return rest[0] if rest else None


class _Staged:
    """A DeviceArg's host buffer copied to device memory for one launch."""

    def __init__(self, host: runtime.DeviceArg) -> None:
        from cuda.bindings import driver
        self.host, self.dtype = host, host.dtype
        self.nbytes = max(host.base.nbytes, 1)
        self.ptr = _ok(driver.cuMemAlloc(self.nbytes))
        _ok(driver.cuMemcpyHtoD(self.ptr, host.base.ctypes.data, host.base.nbytes))

    def data_ptr(self) -> int:
        return int(self.ptr) + self.host.offset * self.host.base.itemsize

    def back(self) -> None:
        from cuda.bindings import driver
        _ok(driver.cuMemcpyDtoH(self.host.base.ctypes.data, self.ptr, self.host.base.nbytes))
        _ok(driver.cuMemFree(self.ptr))


def _compiled_for_gpu(tmp: Path) -> Any:
    def compile_kernel(r: Any) -> Any:
        os.environ.pop("TRITON_INTERPRET", None)  # triton.jit picks the interpreter when it decorates
        path = tmp / f"{r.name}_{abs(hash(r.source))}.py"
        path.write_text(r.source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, r.name)

        class Launcher:
            def __getitem__(self, grid: tuple[int, ...]) -> Any:
                def launch(*args: runtime.DeviceArg, **meta: int) -> None:
                    from cuda.bindings import driver
                    staged = [_Staged(a) for a in args]
                    fn[grid](*staged, **meta)
                    _ok(driver.cuCtxSynchronize())
                    for s in staged:
                        s.back()
                return launch
        return Launcher()
    return compile_kernel


def on_the_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make the cuda device's kernels compile for the GPU, each launch staged."""
    from cuda.bindings import driver
    _ok(driver.cuInit(0))
    ctx = _ok(driver.cuDevicePrimaryCtxRetain(_ok(driver.cuDeviceGet(0))))
    _ok(driver.cuCtxSetCurrent(ctx))
    runtime.clear()
    monkeypatch.setattr(runtime, "compile_kernel", _compiled_for_gpu(tmp_path))


@pytest.mark.requires_gpu
def test_generated_kernels_on_the_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    on_the_gpu(monkeypatch, tmp_path)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 300)).astype(np.float32)
    for fn, tol in ((lambda t: braze.softmax(t * 2.0, -1), 1e-5),
                    (lambda t: F.layer_norm(t, (300,), eps=1e-5), 1e-4),
                    (lambda t: 0.5 * t * (1.0 + braze.erf(t / 2 ** 0.5)), 1e-5),
                    (lambda t: (t.to(braze.bfloat16) * 3.0).to(braze.float32).cumsum(-1), 1e-3),
                    (lambda t: F.gelu(t[:, :64] @ t[:, :64].T), 1e-3)):
        got, ref = on_both(monkeypatch, fn, x)
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    runtime.clear()
