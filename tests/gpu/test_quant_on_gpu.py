"""On a GPU only: the quantized kernels (``codegen/triton_quant.py``) and argmax
compiled for the device with the GPU's tile sizes and run there (buffers staged as in
``test_on_gpu.py``), against the numpy dequantizer and a float64 matmul."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import braze
from braze.creation import from_blocks
from braze.functions import qembedding, qlinear
from braze.quant.dequant import dequantize
from braze.quant.formats import DTYPES, GGMLType
from braze.runtime import cuda as runtime

from .test_on_gpu import _compiled_for_gpu, _ok
from .test_quant_kernels import check_close, random_blocks


@pytest.mark.requires_gpu
def test_quantized_kernels_on_the_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cuda.bindings import driver
    _ok(driver.cuInit(0))
    _ok(driver.cuCtxSetCurrent(_ok(driver.cuDevicePrimaryCtxRetain(_ok(driver.cuDeviceGet(0))))))
    runtime.clear()
    monkeypatch.setattr(runtime, "compile_kernel", _compiled_for_gpu(tmp_path))
    monkeypatch.setattr(runtime, "interpreting", lambda: False)  # the GPU's tiles
    rng = np.random.default_rng(4)
    for qtype, k in (("Q4_0", 576), ("Q4_1", 576), ("Q8_0", 576), ("Q5_1", 576), ("Q4_K", 512), ("Q6_K", 512),
                     ("Q2_K", 256), ("Q3_K", 256), ("Q5_K", 256)):
        n = 1000
        raw = random_blocks(qtype, n, k, seed=len(qtype) + k)
        wf = dequantize(raw, GGMLType[qtype], (n, k))
        w = from_blocks(raw, DTYPES[GGMLType[qtype]], (n, k)).to("cuda")
        for m in (1, 5, 40):
            x = rng.standard_normal((m, k)).astype(np.float32)
            check_close(qlinear(braze.tensor(x, device="cuda"), w).numpy(), x, wf)
        ids = np.array([0, 999, 17], np.int64)
        np.testing.assert_array_equal(qembedding(w, braze.tensor(ids, device="cuda")).numpy(), wf[ids])
    logits = rng.standard_normal((3, 49152)).astype(np.float32)
    assert braze.tensor(logits, device="cuda").argmax(-1).numpy().tolist() == np.argmax(logits, -1).tolist()
    runtime.clear()
