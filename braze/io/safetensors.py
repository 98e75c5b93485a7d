"""braze's safetensors reader.

Layout: u64 little-endian header length N, N bytes of JSON (an object mapping tensor
names to ``{"dtype", "shape", "data_offsets": [start, end]}``, plus an optional
``"__metadata__"`` object of string to string), then the data section; offsets are
relative to its start.  The header is validated completely on open (types, bounds,
sizes, overlaps, duplicate keys) so that ``tensor()`` can hand out zero-copy views.
"""

from __future__ import annotations

import difflib
import json
import os
import struct
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from braze import dtypes
from braze.errors import FormatError, MissingWeight
from braze.io._mmap import MappedFile, MappedReader

MAX_HEADER_BYTES = 100_000_000
"""Same cap as the reference implementation: bigger headers are corrupt, not models."""

DTYPES: dict[str, np.dtype] = {  # and "BF16": braze's bfloat16 (ml_dtypes', imported on first use)
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
SIZES: dict[str, int] = {**{name: d.itemsize for name, d in DTYPES.items()}, "BF16": 2}


def numpy_type(name: str) -> np.dtype:
    """The numpy type of a header's dtype name (one of SIZES)."""
    return dtypes.bfloat16.np if name == "BF16" else DTYPES[name]


@dataclass(frozen=True)
class SafetensorInfo:
    """A tensor's entry in the header; ``start``/``end`` are absolute file offsets."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    start: int
    end: int


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a repeated key would silently shadow a tensor, so reject it."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _is_int(x: Any) -> bool:
    return type(x) is int  # bool is an int subclass, and not a size


class SafetensorsFile(MappedReader):
    """A safetensors file, memory-mapped read-only; ``tensor()`` returns zero-copy views."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path: str = os.fspath(path)
        self._file: MappedFile | None = MappedFile(self.path)
        try:
            self._parse(self._file)
        except BaseException:
            self.close()
            raise

    def _error(self, field: str, offset: int | None, detail: str) -> FormatError:
        return FormatError(self.path, field, offset, detail)

    def _parse(self, f: MappedFile) -> None:
        if f.size < 8:
            raise self._error("header.length", 0, f"truncated: file has {f.size} bytes, needs 8")
        (n,) = struct.unpack_from("<Q", f.buf, 0)
        if n > MAX_HEADER_BYTES or n > f.size - 8:
            raise self._error("header.length", 0, f"header length {n} is absurd for a {f.size}-byte file")
        try:
            header = json.loads(bytes(f.buf[8 : 8 + n]).decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self._error("header", 8, f"invalid JSON: {e}") from None
        if not isinstance(header, dict):
            raise self._error("header", 8, f"must be a JSON object, got {type(header).__name__}")
        data_start = 8 + n
        self.data_offset: int = data_start
        self.metadata: dict[str, str] = self._parse_metadata(header.pop("__metadata__", {}))
        self.tensors: dict[str, SafetensorInfo] = {
            name: self._parse_entry(name, entry, data_start, f.size) for name, entry in header.items()
        }
        by_start = sorted((t for t in self.tensors.values() if t.end > t.start), key=lambda t: t.start)
        for prev, nxt in pairwise(by_start):
            if nxt.start < prev.end:
                raise self._error(
                    f"{nxt.name}.data_offsets",
                    nxt.start,
                    f"[{nxt.start}, {nxt.end}) overlaps tensor {prev.name!r} [{prev.start}, {prev.end})",
                )

    def _parse_metadata(self, meta: Any) -> dict[str, str]:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self._error("__metadata__", 8, "must be an object of string values")
        return meta

    def _parse_entry(self, name: str, entry: Any, data_start: int, size: int) -> SafetensorInfo:
        if not isinstance(entry, dict):
            raise self._error(name, 8, "tensor entry must be an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in SIZES:
            raise self._error(f"{name}.dtype", 8, f"unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise self._error(f"{name}.shape", 8, f"must be a list of non-negative ints, got {shape!r}")
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)
        ):
            raise self._error(
                f"{name}.data_offsets", 8, f"must be [start, end] non-negative ints, got {offsets!r}"
            )
        start, end = offsets
        if end < start:
            raise self._error(f"{name}.data_offsets", 8, f"end {end} < start {start}")
        if data_start + end > size:
            raise self._error(
                f"{name}.data_offsets",
                data_start + start,
                f"[{start}, {end}) runs past the end of the data ({size - data_start} bytes)",
            )
        count = 1
        for d in shape:
            count *= d
        if count * SIZES[dtype] != end - start:
            raise self._error(
                f"{name}.data_offsets",
                data_start + start,
                f"{end - start} bytes do not hold {dtype} {tuple(shape)} ({count * SIZES[dtype]} bytes)",
            )
        return SafetensorInfo(name, tuple(shape), dtype, data_start + start, data_start + end)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as a read-only numpy view of the mapping (no copy)."""
        if self._file is None or self._file.data is None:
            raise ValueError(f"{self.path}: safetensors file is closed")
        try:
            info = self.tensors[name]
        except KeyError:
            near = difflib.get_close_matches(str(name), list(self.tensors), n=3)
            raise MissingWeight(self.path, str(name), near) from None
        return self._file.data[info.start : info.end].view(numpy_type(info.dtype)).reshape(info.shape)


    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}, tensors={len(getattr(self, 'tensors', {}))})"
