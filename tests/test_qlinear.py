"""Weights in their GGML blocks: the quantized matmul kernel, embedding rows and
dequantization, against the numpy dequantizer and a float64 matmul.

Random blocks of every type (scales set to finite float16 values, every other byte
random), rows not a multiple of the vector width, few rows (decoding: the matrix-vector
path) and many (prefill: the strips, in groups of 16 rows), views at offsets, extreme scales, and the
real model's tensors. The suite runs fused and with BRAZE_FUSION=0, so both the
compiled kernel and the reference executor are checked against float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import braze
from braze import plan as planmod
from braze.codegen import quant as qk
from braze.nn import functional as F
from braze.stream import fusion_enabled
from braze.errors import DtypeMismatch, IndexOutOfRange, ShapeMismatch
from braze.quant import BLOCK_DTYPES, DTYPES, GGMLType, block_size, dequantize
from braze.creation import from_blocks, from_numpy
from braze.functions import qembedding, qlinear
from braze.tensor import dequantize as bdequantize

QUANT = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
         GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
SCALES = ("d", "m", "dmin")


def random_blocks(qtype: GGMLType, n: int, k: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """Raw bytes of an (n, k) tensor of ``qtype``: random quants, finite float16 scales."""
    bdt = BLOCK_DTYPES[qtype]
    nb = n * k // (32 if qtype.name[-2:] not in ("_K",) else 256)
    raw = rng.integers(0, 256, nb * bdt.itemsize, dtype=np.uint8)
    blocks = raw.view(bdt)
    for f in SCALES:
        if f in bdt.names:
            blocks[f] = (rng.uniform(0.2, 1.0, nb) * scale * rng.choice([-1, 1], nb)).astype(np.float16)
    return raw


def weight(qtype: GGMLType, n: int, k: int, seed: int = 0, scale: float = 0.05) -> tuple[braze.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = random_blocks(qtype, n, k, rng, scale)
    return from_blocks(raw, DTYPES[qtype], (n, k)), dequantize(raw, qtype, (n, k)).astype(np.float64)


def levels(qtype: str, m: int) -> int:
    """The integer range x is rounded to for this type's dot at m rows (0: x stays float;
    a mode other than int8x2 takes the float GEMM past quant.FEW rows)."""
    mode = qk.MODE.get(qtype, 0)
    return qk.LEVELS[mode if m <= qk.FEW or mode == 3 else 0]


def tolerance(w: np.ndarray, x: np.ndarray, top: int) -> np.ndarray:
    """Per output element: float32 rounding over the sum, plus (integer dots) the error
    of rounding x to integers in blocks of 32: at most half a step, max|x_block| / top / 2."""
    tol = 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6
    if top:
        step = np.repeat(np.abs(x).reshape(x.shape[0], -1, 32).max(-1) / top, 32, axis=1)
        tol = tol + (0.5 * step) @ np.abs(w).T * 1.001
    return tol


def check(y: np.ndarray, w: np.ndarray, x: np.ndarray, qtype: str) -> None:
    ref = x.astype(np.float64) @ w.T
    err = np.abs(y - ref)
    tol = tolerance(w, x.astype(np.float64), levels(qtype, x.shape[0]) if fusion_enabled() else 0)
    assert np.all(np.isfinite(y))
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert np.all(err <= tol), f"{qtype}: error {err[worst]} > {tol[worst]} at {worst}"


@pytest.mark.parametrize("qtype", QUANT, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 37, 64, 65, 130])
def test_qlinear_matches_float64(qtype: GGMLType, m: int) -> None:
    k = 512 if qtype.name.endswith("_K") else 96
    w, wf = weight(qtype, 37, k, seed=m)  # 37 rows: not a multiple of 4, nor of a vector
    x = np.random.default_rng(100 + m).standard_normal((m, k)).astype(np.float32)
    check(qlinear(from_numpy(x), w).numpy(), wf, x, qtype.name)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m", [1, 5, 40])
def test_half_weights_beside_float32_activations(dtype: str, m: int) -> None:
    rng = np.random.default_rng(m)
    wf = rng.standard_normal((29, 70)).astype(np.float32)
    w = braze.tensor(wf).to(dtype)
    x = rng.standard_normal((m, 70)).astype(np.float32)
    y = F.linear(from_numpy(x), w).numpy()
    check(y, w.to("float32").numpy().astype(np.float64), x, dtype)


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("scale", [6e4, 1e-7])
def test_extreme_scales(qtype: GGMLType, scale: float) -> None:
    """Scales near float16's largest and in its subnormals stay finite and accurate."""
    k = 256
    w, wf = weight(qtype, 11, k, seed=3, scale=scale)
    x = (np.random.default_rng(4).standard_normal((2, k)) * (1e-3 if scale > 1 else 1e3)).astype(np.float32)
    check(qlinear(from_numpy(x), w).numpy(), wf, x, qtype.name)


def test_views_at_offsets_read_the_right_rows() -> None:
    """Row slices of the weight (a block-aligned offset) and of x (an offset given at run
    time, different each call) read what they name, and replay one plan."""
    w, wf = weight(GGMLType.Q4_K, 40, 256, seed=5)
    xs = np.random.default_rng(6).standard_normal((9, 256)).astype(np.float32)
    xt = from_numpy(xs)
    for start in (0, 2, 5):
        y = qlinear(xt[start:start + 3], w[7:30]).numpy()
        check(y, wf[7:30], xs[start:start + 3], "Q4_K")


def test_a_view_that_splits_blocks_is_refused() -> None:
    w, _ = weight(GGMLType.Q4_0, 8, 64)
    with pytest.raises(ShapeMismatch, match="whole blocks"):
        qlinear(braze.randn(1, 32), w[:, 16:48])
    with pytest.raises(ShapeMismatch):
        qlinear(braze.randn(1, 32), w)  # K disagrees


def test_bad_operands_are_typed_errors() -> None:
    w, _ = weight(GGMLType.Q4_0, 8, 64)
    with pytest.raises(DtypeMismatch, match="float32"):
        qlinear(braze.randn(1, 64).to("float16"), w)
    with pytest.raises(DtypeMismatch, match="numpy"):
        w.numpy()
    with pytest.raises(DtypeMismatch):
        w + 1  # element-wise ops do not take blocks
    assert "q4_0" in repr(w)


def test_embedding_rows_and_dequantize() -> None:
    w, wf = weight(GGMLType.Q6_K, 50, 256, seed=7)
    ids = braze.tensor([3, 0, 49, 3])
    np.testing.assert_array_equal(qembedding(w, ids).numpy(), wf[[3, 0, 49, 3]].astype(np.float32))
    np.testing.assert_array_equal(bdequantize(w).numpy(), wf.astype(np.float32))
    np.testing.assert_array_equal(w[10:12].to("float32").numpy(), wf[10:12].astype(np.float32))
    with pytest.raises(IndexOutOfRange):
        qembedding(w, braze.tensor([50]))


def test_fused_qlinear_is_a_kernel_not_an_extern_step(monkeypatch: Any) -> None:
    if not fusion_enabled():
        pytest.skip("the fused executor only (BRAZE_FUSION=0 runs the reference)")
    w, wf = weight(GGMLType.Q5_1, 16, 64, seed=8)
    x = np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32)
    planmod.clear()
    y = (qlinear(from_numpy(x), w) + 1).numpy()
    check(y - 1, wf, x, "Q5_1")
    kinds = [type(s.step.kernel).__name__ for p in planmod.stored_plans() for s in p.steps
             if not isinstance(s, planmod.ExternStep)]
    assert "QLinear" in kinds, kinds


def test_float32_rows_picked_from_an_intermediate_are_a_kernel() -> None:
    """``index_select`` of float32 rows (a padded prompt's last token) is a gathering
    kernel in the fused plan, not numpy between kernels; an index outside is a typed error."""
    a = np.random.default_rng(40).standard_normal((12, 40)).astype(np.float32)
    planmod.clear()
    got = (from_numpy(a) * 2).index_select(0, braze.tensor([11, 0, 5])).numpy()
    np.testing.assert_array_equal(got, (a * 2)[[11, 0, 5]])
    if fusion_enabled():
        steps = [s for p in planmod.stored_plans() for s in p.steps]
        assert not any(isinstance(s, planmod.ExternStep) for s in steps)
        assert any(getattr(s.step.kernel, "checks", ()) for s in steps)
    with pytest.raises(IndexOutOfRange, match="index_select"):
        (from_numpy(a) * 2).index_select(0, braze.tensor([12]))


@pytest.mark.parametrize("name", ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "token_embd.weight"])
@pytest.mark.parametrize("m", [1, 16])
def test_real_model_tensors(smollm: Any, name: str, m: int) -> None:
    from braze.io.gguf import GGUFFile
    g = GGUFFile(smollm.path)
    bt = g.tensor(name)
    w = from_blocks(bt.raw, DTYPES[bt.qtype], bt.shape)
    rows = slice(0, 512) if name == "token_embd.weight" else slice(None)  # the vocabulary: a slice is enough
    wf = bt.dequantize()[rows].astype(np.float64)
    x = np.random.default_rng(m).standard_normal((m, bt.shape[1])).astype(np.float32)
    check(qlinear(from_numpy(x), w[rows]).numpy(), wf, x, bt.qtype.name)


def test_model_weights_stay_quantized(smollm: Any) -> None:
    """Loading keeps every quantized tensor in its blocks, over the file's map."""
    blk = smollm.model.blocks[0]
    assert blk.mlp.up.weight.dtype.name == "q4_1"
    assert smollm.model.embed.weight.dtype.name == "q8_0"
    assert blk.attn_norm.weight.dtype is braze.float32


def built_kernel(qtype: GGMLType, m: int, n: int, k: int, mode: int, flags: tuple[str, ...] = ()) -> Any:
    """``y = x @ w.T`` as one kernel built directly from the quant headers in ``mode``, with braze's
    compiler flags and ``flags`` after them: ``fn(x, raw, y)`` on numpy arrays."""
    import ctypes

    from braze.codegen.c import kernel_source
    from braze.codegen.c_expr import PRELUDE
    from braze.codegen.headers import header
    from braze.runtime import cpu
    from braze.schedule.epilogue import plain
    body = kernel_source(plain(qtype.name, m, n, k, k, DTYPES[qtype].nbytes(k), 0, 0), "kq")
    src = "\n".join([header("cmath.h"), header("tile.h"), PRELUDE,
                     qk.instantiations([body], {qtype.name: mode}), body])
    fn = cpu.compile_c(src, ["kq"], flags=(*cpu.FLAGS, *flags)).function("kq", [ctypes.c_void_p, ctypes.c_int64])

    def call(x: np.ndarray, raw: np.ndarray, y: np.ndarray) -> None:
        fn((ctypes.c_void_p * 3)(x.ctypes.data, raw.ctypes.data, y.ctypes.data), 2)
    return call


@pytest.mark.parametrize("mode", sorted(qk.LEVELS))
@pytest.mark.parametrize("qtype", [GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q3_K, GGMLType.Q6_K],
                         ids=lambda t: t.name)
def test_every_decoding_mode_of_the_kernel(qtype: GGMLType, mode: int) -> None:
    """The kernel's four decoding dots (float, int8, int16, int8x2), whichever MODE picks for
    a type, built directly from the quant headers and called on numpy arrays: each within its
    own rounding bound of the float64 product."""
    n, k, m = 13, 512, 2
    w, wf = weight(qtype, n, k, seed=20 + mode)
    x = np.random.default_rng(mode).standard_normal((m, k)).astype(np.float32)
    y = np.zeros((m, n), np.float32)
    built_kernel(qtype, m, n, k, mode)(x, w._storage.array, y)
    ref = x.astype(np.float64) @ wf.T
    tol = tolerance(wf, x.astype(np.float64), qk.LEVELS[mode])
    assert np.all(np.abs(y - ref) <= tol)


def _cpu_has(flag: str) -> bool:
    try:
        return any(line.startswith("flags") and f" {flag} " in f"{line} " for line in open("/proc/cpuinfo"))
    except OSError:
        return False


# Each instruction set's build of the int8x2 kernels: 512-bit VNNI (x rows in the lanes),
# 256-bit AVX-VNNI (W's blocks in the lanes), AVX2 without VNNI (x as int16, vpmaddwd)
# and plain C; and the one-row kernels with two blocks per 512-bit instruction and with
# one per 256-bit one, whichever runtime/simd.py measured (one x row: the only kernels
# the choice changes). Where the CPU lacks one, the build is compiled and not run (its
# instructions would fault).
VECTOR_BUILDS = {"native": ((), None), "avx2": (("-mno-avx512f", "-mno-avxvnni"), "avx2"),
                 "avx-vnni": (("-mno-avx512f", "-mavxvnni"), "avx_vnni"), "plain": (("-mno-avx2",), None),
                 "wide512": (("-DBRAZE_WIDE512=1",), "avx512bw"), "narrow512": (("-DBRAZE_WIDE512=0",), None)}
ONE_ROW_BUILDS = ("wide512", "narrow512")


@pytest.mark.parametrize("build", list(VECTOR_BUILDS))
@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K,
                                   GGMLType.Q6_K], ids=lambda t: t.name)
def test_batched_rows_on_every_vector_width(qtype: GGMLType, build: str) -> None:
    """One x row (the matrix-vector dot) and many in int8x2 (the strips: groups of 16
    rows, passes of 64, a last group of 1..15; without VNNI, 2 rows take the one-row dot
    per row below quant.h's BRAZE_QSTRIP_MIN_##T and 70 the float GEMM, BRAZE_QGEMM_MIN):
    every row within its rounding bound of the float64 product. 17 blocks of 32 a row
    where the type allows: two-block kernels end on one block."""
    flags, needs = VECTOR_BUILDS[build]
    n, k = 21, 512 if block_size(qtype) == 256 else 544
    w, wf = weight(qtype, n, k, seed=7)
    for m in (1,) if build in ONE_ROW_BUILDS else (1, 2, 9, 17, 70):
        fn = built_kernel(qtype, m, n, k, 3, flags)
        if needs and not _cpu_has(needs):
            continue  # built, not run
        x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
        y = np.zeros((m, n), np.float32)
        fn(x, w._storage.array, y)
        err = np.abs(y - x.astype(np.float64) @ wf.T)
        assert np.all(err <= tolerance(wf, x.astype(np.float64), qk.LEVELS[3])), (build, m)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_table_rows_come_out_float32(dtype: str) -> None:
    from braze.nn import Embedding
    table = braze.randn(20, 48).to(dtype)
    ids = braze.tensor([[3, 19, 0]])
    got = Embedding.from_weights(table).forward(ids, dtype=braze.float32)
    assert got.dtype is braze.float32 and got.shape == (1, 3, 48)
    np.testing.assert_array_equal(got.numpy(), table.to("float32").numpy()[[3, 19, 0]][None])
    with pytest.raises(IndexOutOfRange):
        qembedding(table, braze.tensor([20]))


def test_embedding_kernel_reads_views_of_ids_and_tables_as_they_are() -> None:
    """Broadcast ids (stride 0) and a column-strided half table: the rows they name."""
    w, wf = weight(GGMLType.Q4_0, 10, 64, seed=30)
    ids = braze.tensor([6]).expand(4)
    np.testing.assert_array_equal(qembedding(w, ids).numpy(), wf[[6, 6, 6, 6]].astype(np.float32))
    a = np.arange(64, dtype=np.float16).reshape(8, 8)
    table = from_numpy(a).T  # rows strided by 8 elements
    np.testing.assert_array_equal(qembedding(table, braze.tensor([1, 3])).numpy(), a.T[[1, 3]].astype(np.float32))


def test_writing_into_a_block_tensor_copies_its_blocks() -> None:
    w, wf = weight(GGMLType.Q8_0, 4, 64, seed=31)
    w2, wf2 = weight(GGMLType.Q8_0, 4, 64, seed=32)
    dst = from_blocks(w._storage.array.copy(), DTYPES[GGMLType.Q8_0], (4, 64))
    dst[0] = w2[1]
    np.testing.assert_array_equal(bdequantize(dst).numpy(), np.concatenate([wf2[1:2], wf[1:]]).astype(np.float32))


def test_a_type_without_a_kernel_is_correct_and_says_it_is_slow(capfd: Any) -> None:
    """Q8_1 (an intermediate type, rare in files) has no kernel: the reference computes
    it, and the fused executor says so on stderr instead of being silently slow."""
    rng = np.random.default_rng(40)
    raw = rng.integers(0, 256, 4 * 2 * BLOCK_DTYPES[GGMLType.Q8_1].itemsize, dtype=np.uint8)
    raw.view(BLOCK_DTYPES[GGMLType.Q8_1])["d"] = np.float16(0.01)
    w = from_blocks(raw, DTYPES[GGMLType.Q8_1], (4, 64))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    y = qlinear(from_numpy(x), w).numpy()
    np.testing.assert_allclose(y, x @ dequantize(raw, GGMLType.Q8_1, (4, 64)).T, rtol=1e-5, atol=1e-5)
    if fusion_enabled():  # also when the plan is found stored on disk, not scheduled now
        planmod.clear()
        planmod._slow_said.clear()
        qlinear(from_numpy(x), w).numpy()
        assert "qlinear over a Q8_1 (4, 64) weight runs on the reference" in capfd.readouterr().err
