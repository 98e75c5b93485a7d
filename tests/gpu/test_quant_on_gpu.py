"""On a GPU only: the quantized kernels (``codegen/triton_quant.py``) and argmax at a
real model's sizes, compiled for the device (the kernel tests beside this file run there
too, at small sizes), against the numpy dequantizer and a float64 matmul."""

from __future__ import annotations

import numpy as np
import pytest

import braze
from braze.creation import from_blocks
from braze.functions import qembedding, qlinear
from braze.quant.dequant import dequantize
from braze.quant.formats import DTYPES, GGMLType

from .test_quant_kernels import check_close, random_blocks

pytestmark = [pytest.mark.requires_gpu, pytest.mark.usefixtures("on_the_gpu")]


@pytest.mark.parametrize("qtype,k", [("Q4_0", 576), ("Q4_1", 576), ("Q8_0", 576), ("Q5_1", 576), ("Q4_K", 512),
                                     ("Q6_K", 512), ("Q2_K", 256), ("Q3_K", 256), ("Q5_K", 256)])
def test_quantized_kernels_at_model_sizes(qtype: str, k: int) -> None:
    rng = np.random.default_rng(4)
    n = 1536
    raw = random_blocks(qtype, n, k, seed=len(qtype) + k)
    wf = dequantize(raw, GGMLType[qtype], (n, k))
    w = from_blocks(raw, DTYPES[GGMLType[qtype]], (n, k)).to("cuda")
    for m in (1, 5, 40, 128):
        x = rng.standard_normal((m, k)).astype(np.float32)
        check_close(qlinear(braze.tensor(x, device="cuda"), w).numpy(), x, wf)
    ids = np.array([0, n - 1, 17], np.int64)
    np.testing.assert_array_equal(qembedding(w, braze.tensor(ids, device="cuda")).numpy(), wf[ids])


def test_argmax_of_logits() -> None:
    logits = np.random.default_rng(5).standard_normal((3, 49152)).astype(np.float32)
    assert braze.tensor(logits, device="cuda").argmax(-1).numpy().tolist() == np.argmax(logits, -1).tolist()
