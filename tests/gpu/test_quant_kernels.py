"""Weights in their GGML blocks on the cuda device (``codegen/triton_quant.py``), under
Triton's interpreter: quantized matmul (the matrix-vector kernel for few rows, the tiled
GEMM for many) and row gathers against the numpy dequantizer (``quant/dequant.py``,
bit-exact with ggml's C) and a float64 matmul, on random blocks with extreme scales,
row counts that fill no tile, and both the interpreter's tiles and the GPU's."""

from __future__ import annotations

import numpy as np
import pytest

import braze
from braze.creation import from_blocks
from braze.functions import qembedding, qlinear
from braze.quant.dequant import dequantize
from braze.quant.formats import BLOCK_DTYPES, DTYPES, TYPE_SIZES, GGMLType
from braze.runtime import cuda

QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# f16 scales from tiny (subnormal) to near the type's largest, and a negative one
FLOATS = {"F16": braze.float16, "BF16": braze.bfloat16, "F32": braze.float32}
SCALES = np.array([6e-8, 3e-5, 0.01, 0.7, -1.3, 250.0, 3e4], np.float16)


def random_blocks(qtype: str, rows: int, k: int, seed: int) -> np.ndarray:
    """``rows`` rows of ``k`` elements as raw bytes: random bytes, scale fields set to
    finite values (random bytes there would make NaN and inf scales)."""
    rng = np.random.default_rng(seed)
    t = GGMLType[qtype]
    nblocks = rows * k // TYPE_SIZES[t][0]
    blocks = np.frombuffer(rng.integers(0, 256, nblocks * BLOCK_DTYPES[t].itemsize, np.uint8).tobytes(),
                           BLOCK_DTYPES[t]).copy()
    for field in ("d", "m", "dmin"):
        if field in BLOCK_DTYPES[t].names:
            blocks[field] = rng.choice(SCALES, nblocks) * rng.uniform(0.5, 1.0, nblocks).astype(np.float16)
    return blocks.view(np.uint8)


def check_close(got: np.ndarray, x: np.ndarray, wf: np.ndarray) -> None:
    """``got`` against float64 ``x @ wf.T``: float32 sums in another order, so within a
    few float32 roundings of the sum of the products' magnitudes."""
    want = x.astype(np.float64) @ wf.astype(np.float64).T
    bound = np.abs(x).astype(np.float64) @ np.abs(wf).astype(np.float64).T
    np.testing.assert_array_less(np.abs(got - want), 1e-5 * bound + 1e-30)


def _tiles(monkeypatch: pytest.MonkeyPatch, gpu_tiles: bool) -> None:
    if gpu_tiles:  # the GPU's tile sizes, run by the interpreter
        monkeypatch.setattr(cuda, "interpreting", lambda: False)


@pytest.mark.parametrize("qtype", QUANTIZED)
@pytest.mark.parametrize("m", [1, 3, 19], ids=["decode", "few", "prefill"])
def test_qlinear_matches_the_dequantizer(monkeypatch: pytest.MonkeyPatch, qtype: str, m: int) -> None:
    per = TYPE_SIZES[GGMLType[qtype]][0]
    n, k = 37, 2 * per if per > 32 else 96  # odd rows (no tile of them), K in several blocks
    raw = random_blocks(qtype, n, k, seed=m)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    w = from_blocks(raw, DTYPES[GGMLType[qtype]], (n, k)).to("cuda")
    got = qlinear(braze.tensor(x, device="cuda"), w).numpy()
    check_close(got, x, dequantize(raw, GGMLType[qtype], (n, k)))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K", "F16", "BF16", "F32"])
@pytest.mark.parametrize("m", [2, 33])
def test_qlinear_with_the_gpus_tiles_and_float_weights(monkeypatch: pytest.MonkeyPatch, qtype: str, m: int) -> None:
    """The GPU's tile sizes (narrower than the interpreter's: several programs and K
    steps, a K that is no multiple of them) and weights kept as float16/bfloat16/float32."""
    _tiles(monkeypatch, True)
    rng = np.random.default_rng(2)
    n, k = 45, 256 + 64 if qtype != "Q6_K" else 512
    x = rng.standard_normal((m, k)).astype(np.float32)
    if qtype in ("F16", "BF16", "F32"):
        wt = braze.tensor(rng.standard_normal((n, k)).astype(np.float32)).to(FLOATS[qtype])
        wf = wt.to(braze.float32).numpy()
        w = wt.to("cuda")
    else:
        raw = random_blocks(qtype, n, k, seed=3)
        wf = dequantize(raw, GGMLType[qtype], (n, k))
        w = from_blocks(raw, DTYPES[GGMLType[qtype]], (n, k)).to("cuda")
    got = qlinear(braze.tensor(x, device="cuda"), w).numpy()
    check_close(got, x, wf)


def test_qlinear_over_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row slice of the weight (Phi-3's split projections) and a strided x (a column
    slice of a wider activation) are read where they are."""
    n, k = 40, 64
    raw = random_blocks("Q8_0", n, k, seed=5)
    wf = dequantize(raw, GGMLType.Q8_0, (n, k))
    w = from_blocks(raw, DTYPES[GGMLType.Q8_0], (n, k)).to("cuda")[8:29]
    xx = np.random.default_rng(6).standard_normal((3, 2 * k)).astype(np.float32)
    got = qlinear(braze.tensor(xx, device="cuda")[:, 1::2], w).numpy()
    check_close(got, xx[:, 1::2], wf[8:29])


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q3_K", "Q5_K", "F16"])
def test_quantized_rows_at_ids_and_dequantize(qtype: str) -> None:
    rows, k = 11, 256
    if qtype == "F16":
        table = np.random.default_rng(7).standard_normal((rows, k)).astype(np.float16)
        w_cpu, wf = braze.tensor(table), table.astype(np.float32)
    else:
        raw = random_blocks(qtype, rows, k, seed=8)
        w_cpu, wf = from_blocks(raw, DTYPES[GGMLType[qtype]], (rows, k)), dequantize(raw, GGMLType[qtype], (rows, k))
    ids = np.array([3, 0, 10, 3, 7], np.int64)
    w = w_cpu.to("cuda")
    np.testing.assert_array_equal(qembedding(w, braze.tensor(ids, device="cuda")).numpy(), wf[ids])
    np.testing.assert_array_equal(qembedding(w, braze.tensor(ids.astype(np.int32), device="cuda")).numpy(), wf[ids])
    if qtype != "F16":
        np.testing.assert_array_equal(w.to(braze.float32).numpy(), wf)


def test_block_tensors_move_as_their_bytes_both_ways() -> None:
    raw = random_blocks("Q4_K", 4, 256, seed=9)
    w = from_blocks(raw, DTYPES[GGMLType.Q4_K], (4, 256))
    moved = w[1:3].to("cuda")
    assert moved.dtype is w.dtype and moved.shape == (2, 256) and moved.device.type == "cuda"
    np.testing.assert_array_equal(moved.to(braze.float32).numpy(), dequantize(raw, GGMLType.Q4_K, (4, 256))[1:3])
    back = moved[1:].to("cpu")
    assert back.device.type == "cpu" and back.dtype is w.dtype and back.shape == (1, 256)
    np.testing.assert_array_equal(np.asarray(back._storage.data()), raw.reshape(4, -1)[2])


@pytest.mark.parametrize("interpret", [True, False])
@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K", "F16"])
def test_tiles_of_a_real_models_shapes_stay_within_tritons_limit(interpret: bool, qtype: str) -> None:
    """SmolLM2's logits (49152 x 576) at up to 8 rows (GEMV) and at 128 (GEMM): no tile
    over Triton's 2**20 elements (rendered only: running them here would take minutes)."""
    from braze.codegen.triton_quant import MAX_NUMEL, qlinear_source
    from braze.layout import Layout
    k = 576 if qtype != "Q6_K" else 512
    w = Layout.contiguous((49152, k))
    for m in (1, 3, 8, 128):
        r = qlinear_source(Layout.contiguous((m, k)), w, qtype, "k", interpret)
        tile = r.meta.get("MP", 1) * r.meta["BN"] * r.meta.get("NB", 1) * r.meta.get("QK", r.meta.get("BK", 1))
        assert tile <= MAX_NUMEL
        if m <= 8:  # the matrix-vector kernel: its programs cover every output row
            assert r.grid[0] * r.meta["BN"] >= 49152
