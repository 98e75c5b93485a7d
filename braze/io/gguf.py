"""braze's GGUF reader (format versions 2 and 3, little-endian).

Layout: ``"GGUF"``, u32 version, u64 tensor count, u64 metadata count, the metadata
key/value pairs, the tensor infos (name, n_dims, dims in GGML order -- innermost
first --, ggml type, u64 offset relative to the data section), then the data section,
which starts at the next multiple of ``general.alignment`` (default 32).  Version 1
used 32-bit counts and lengths and is not supported; v2 and v3 share the layout (v3
only added big-endian files, which braze does not read).

Everything is validated before use: every length and count is checked against the
bytes that are left *before* anything is allocated from it, so a corrupt file fails
with a ``FormatError`` naming the file, the field and the byte offset, and never with
a crash, a huge allocation or a hang.

String policy: keys and string values must be valid UTF-8 and are returned as
``str``; invalid UTF-8 is a ``FormatError`` (GGUF specifies UTF-8, and a lossy
decode would silently change tokenizer vocabularies).  Arrays (numeric or not,
nested or not) come back as Python lists, so metadata is plain, predictable data.

Memory: a tokenizer's arrays (``tokenizer.ggml.tokens``/``merges``, ~49k strings each)
would be ~9 MB of small Python objects that stay resident for as long as the file is
open (all through generation).  They are validated on open but kept as positions in
the mapping, and become lists only when read (``metadata[key]``, then kept);
``GGUFMetadata.peek`` reads one without keeping it, as the tokenizer does.
"""

from __future__ import annotations

import difflib
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np

from braze.errors import FormatError, MissingWeight
from braze.io._mmap import MappedFile, MappedReader
from braze.quant.formats import TYPE_SIZES, GGMLType, is_quantized, plain_dtype
from braze.quant.tensor import BlockTensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 16
"""Nested arrays deeper than this are rejected (real files nest at most twice)."""
_INT64_MAX = 2**63 - 1
LAZY_ARRAY_MIN = 1024
"""Arrays of strings or numbers with at least this many items are decoded on first read."""

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# GGUF metadata value type ids -> little-endian numpy dtype of the scalar (bool is a byte).
_T_BOOL, _T_STRING, _T_ARRAY = 7, 8, 9
_SCALAR_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("u1"),
    1: np.dtype("i1"),
    2: np.dtype("<u2"),
    3: np.dtype("<i2"),
    4: np.dtype("<u4"),
    5: np.dtype("<i4"),
    6: np.dtype("<f4"),
    _T_BOOL: np.dtype("u1"),
    10: np.dtype("<u8"),
    11: np.dtype("<i8"),
    12: np.dtype("<f8"),
}
# Explicit struct codes: numpy's dtype.char for u8/i8 ("L"/"l") is 4 bytes to ``struct``.
_SCALAR_STRUCTS: dict[int, struct.Struct] = {
    t: struct.Struct("<" + code)
    for t, code in {
        0: "B",
        1: "b",
        2: "H",
        3: "h",
        4: "I",
        5: "i",
        6: "f",
        7: "B",
        10: "Q",
        11: "q",
        12: "d",
    }.items()
}
assert all(_SCALAR_STRUCTS[t].size == dt.itemsize for t, dt in _SCALAR_DTYPES.items())
_INT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
# Smallest encoding of one value of each type: bounds element counts before reading.
_MIN_SIZE: dict[int, int] = {
    **{t: dt.itemsize for t, dt in _SCALAR_DTYPES.items()},
    _T_STRING: 8,
    _T_ARRAY: 12,
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where a tensor lives in the file.

    ``shape`` is row-major (PyTorch order, the reverse of GGML's ``ne``): the last dim
    is the contiguous one.  ``offset`` is absolute in the file; ``nbytes`` the size.
    """

    name: str
    shape: tuple[int, ...]
    qtype: GGMLType
    offset: int
    nbytes: int


class _Cursor:
    """Bounds-checked little-endian reads over the mapped bytes."""

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def error(self, field: str, detail: str, offset: int | None = None) -> FormatError:
        return FormatError(self.path, field, self.pos if offset is None else offset, detail)

    def need(self, n: int, field: str) -> None:
        if n > self.size - self.pos:
            raise self.error(field, f"truncated: needs {n} bytes, {self.size - self.pos} left")

    def unpack(self, st: struct.Struct, field: str) -> Any:
        self.need(st.size, field)
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def u32(self, field: str) -> int:
        return self.unpack(_U32, field)

    def u64(self, field: str) -> int:
        return self.unpack(_U64, field)

    def count(self, field: str, min_item_size: int) -> int:
        """A u64 element count, rejected if that many items cannot fit in what is left."""
        start = self.pos
        n = self.u64(field)
        if n * min_item_size > self.size - self.pos:
            raise self.error(
                field,
                f"count {n} needs at least {n * min_item_size} bytes, {self.size - self.pos} left",
                start,
            )
        return n

    def string(self, field: str) -> str:
        start = self.pos
        n = self.u64(field)
        if n > self.size - self.pos:
            raise self.error(field, f"string length {n} exceeds the {self.size - self.pos} bytes left", start)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(field, f"invalid UTF-8 ({e.reason} at byte {e.start})", start) from None

    def strings(self, n: int, field: str) -> list[str]:
        """``n`` strings in a row, each checked in turn (the first bad one is the error)."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack_u64 = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(n):
            if size - pos < 8:
                self.pos = pos
                raise self.error(f"{field}[{i}]", "truncated: string length")
            (length,) = unpack_u64(buf, pos)
            if length > size - pos - 8:
                self.pos = pos
                raise self.error(
                    f"{field}[{i}]", f"string length {length} exceeds the {size - pos - 8} bytes left"
                )
            try:
                append(buf[pos + 8 : pos + 8 + length].decode("utf-8"))
            except UnicodeDecodeError as e:
                self.pos = pos
                raise self.error(f"{field}[{i}]", f"invalid UTF-8 ({e.reason} at byte {e.start})") from None
            pos += 8 + length
        self.pos = pos
        return out

    def packed_strings(
        self, n: int, field: str, bounds: np.ndarray | None = None
    ) -> tuple[bytes, np.ndarray]:
        """``n`` strings in a row as their UTF-8 bytes end to end and ``n + 1``
        boundaries: the hot path for tokenizer vocabularies (~50k entries), with no
        object per string.  Validated as ``strings`` validates them, and a bad file
        fails with its error (it reruns to find the first bad string); or, given the
        ``bounds`` this returned before, only gathered."""
        buf, size, start = self.buf, self.size, self.pos
        if bounds is not None:
            self.pos = start + 8 * n + int(bounds[-1])
            return _strip_lengths(buf[start : self.pos], bounds), bounds
        unpack_u64 = _U64.unpack_from
        lengths: list[int] = []
        append = lengths.append
        pos = start
        for _ in range(n):
            if size - pos < 8:
                break
            (length,) = unpack_u64(buf, pos)
            if length > size - pos - 8:
                break
            append(length)
            pos += 8 + length
        if len(lengths) == n:
            ends = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=ends[1:])
            bounds = ends.astype(np.uint32) if ends[-1] < 2**32 else ends  # half the size
            data = _strip_lengths(buf[start:pos], bounds)
            # Valid as a whole, and no string starting inside a character: then every
            # string is whole characters, i.e. valid by itself (and only then).
            try:
                data.decode("utf-8")
                firsts = np.frombuffer(data, dtype=np.uint8)[ends[:-1][np.asarray(lengths) > 0]]
                if not np.any((firsts & 0xC0) == 0x80):
                    self.pos = pos
                    return data, bounds
            except UnicodeDecodeError:
                pass
        texts = self.strings(n, field)  # raises the error of the first bad string
        return _pack(texts)

    def array(self, vtype: int, n: int, field: str) -> np.ndarray:
        """``n`` numbers of one type as a numpy array over a copy of their bytes (bools
        as ``bool``), validated; counts are pre-checked."""
        dt = _SCALAR_DTYPES[vtype]
        start = self.pos
        self.need(n * dt.itemsize, field)
        arr = np.frombuffer(self.buf[start : start + n * dt.itemsize], dtype=dt)
        self.pos += n * dt.itemsize
        if vtype == _T_BOOL:
            bad = np.flatnonzero(arr > 1)
            if bad.size:
                raise self.error(
                    f"{field}[{int(bad[0])}]",
                    f"bool byte {int(arr[bad[0]])} is not 0 or 1",
                    start + int(bad[0]),
                )
            return arr != 0
        return arr

    def numbers(self, vtype: int, n: int, field: str) -> list[Any]:
        """``n`` numbers of one type, decoded in one numpy call (counts are pre-checked)."""
        return self.array(vtype, n, field).tolist()


def _drop_pages(buf: Any, start: int, end: int) -> None:
    """Drop the whole pages of bytes ``[start, end)`` of the file mapping from this
    process's resident set (the kernel reads them back from the page cache if they are
    touched again).  Used for the header, which is read once: otherwise its ~2 MB (a
    vocabulary's strings) count in RSS for as long as the weights are mapped.  A hint,
    so any failure is ignored."""
    if not isinstance(buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = end // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        try:
            buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):
            pass


def _strip_lengths(span: bytes, bounds: np.ndarray) -> bytes:
    """The bytes of a run of strings (as the file stores them, each after its u64
    length) without the lengths; ``bounds`` are the string boundaries without them."""
    raw = np.frombuffer(span, dtype=np.uint8)
    keep = np.ones(raw.size, dtype=bool)
    heads = bounds[:-1] + 8 * np.arange(len(bounds) - 1)  # where each length field sits
    for k in range(8):
        keep[heads + k] = False
    return raw[keep].tobytes()


def _pack(texts: list[str]) -> tuple[bytes, np.ndarray]:
    encoded = [t.encode("utf-8") for t in texts]
    bounds = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=bounds[1:])
    return b"".join(encoded), bounds


def _unpack(data: bytes, bounds: np.ndarray) -> list[str]:
    """The strings of ``packed_strings`` (valid UTF-8), made in C: joined by NULs,
    decoded and split once; or, if a string holds a NUL, sliced one by one."""
    raw = np.frombuffer(data, dtype=np.uint8)
    bounds = bounds.astype(np.intp)  # np.insert wants indices it can add to
    if len(bounds) > 1 and not np.any(raw == 0):
        return np.insert(raw, bounds[1:-1], 0).tobytes().decode("utf-8").split("\0")
    text = data.decode("utf-8")
    if len(text) != len(data):  # not ASCII: byte offsets -> character offsets
        leads = (raw & 0xC0) != 0x80
        chars = np.zeros(len(data) + 1, np.int64)
        np.cumsum(leads, out=chars[1:])
        bounds = chars[bounds]
    return [text[a:b] for a, b in pairwise(bounds.tolist())]


class _LazyArray(NamedTuple):
    """A validated top-level metadata array left in the file: ``n`` items of type
    ``etype`` in bytes ``[pos, end)`` of the metadata's buffer (the mapping, or a copy of
    those bytes once it is closed); ``field`` names it in errors."""

    etype: int
    pos: int
    n: int
    field: str
    end: int
    bounds: np.ndarray | None = None
    """Where each string ends (``packed_strings``), found by the validation: kept for
    the first ``peek`` (the tokenizer's) so that it need not walk the array again."""


class GGUFMetadata(dict[str, Any]):
    """The metadata dict: a plain ``dict`` whose large arrays (``LAZY_ARRAY_MIN`` items
    or more, of strings or numbers) become lists on first read and are kept from then
    on.  Every read path (``[]``, ``get``, ``items``, ``values``, ``dict(m)``, ``==``,
    copies, pickling) sees the lists; ``peek`` reads one without keeping it."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._buf: Any = b""
        self._size = 0

    # -- lazy entries --------------------------------------------------------------

    def _attach(self, buf: Any, size: int) -> None:
        self._buf, self._size = buf, size

    def _detach(self) -> None:
        """The mapping is going away: copy the bytes of arrays not yet read (~2 MB for a
        vocabulary), so they stay readable after ``close()``."""
        lazy = [(k, v) for k, v in super().items() if isinstance(v, _LazyArray)]
        if not lazy:
            self._buf, self._size = b"", 0
            return
        lo, hi = min(v.pos for _, v in lazy), max(v.end for _, v in lazy)
        self._buf, self._size = bytes(self._buf[lo:hi]), hi - lo
        for k, v in lazy:
            super().__setitem__(k, v._replace(pos=v.pos - lo, end=v.end - lo))

    def _cursor(self, lazy: _LazyArray) -> _Cursor:
        cur = _Cursor(self._buf, self._size, self._path)
        cur.pos = lazy.pos
        return cur

    def _load_all(self) -> None:
        for key, value in list(super().items()):
            if isinstance(value, _LazyArray):
                self._load(key, value)

    def is_lazy(self, key: str) -> bool:
        """True while ``key`` is an array not yet read as a list."""
        return isinstance(super().get(key), _LazyArray)

    def peek(self, key: str, default: Any = None) -> Any:
        """``get(key, default)`` that leaves an array not read yet as it is: a caller
        that needs a large array once (the tokenizer) gets a list of its own, which is
        freed when it is done instead of staying here for the life of the file."""
        if key not in self:
            return default
        value = super().__getitem__(key)
        if isinstance(value, _LazyArray):
            cur = self._cursor(value)
            if value.etype == _T_STRING:
                out = _unpack(*cur.packed_strings(value.n, value.field, value.bounds))
                if value.bounds is not None:  # used: they are not kept with the file
                    super().__setitem__(key, value._replace(bounds=None))
            else:
                out = cur.numbers(value.etype, value.n, value.field)
            _drop_pages(self._buf, value.pos, value.end)  # read once more, not kept
            return out
        return value

    def _load(self, key: str, value: Any) -> Any:
        if isinstance(value, _LazyArray):
            value = self.peek(key)
            super().__setitem__(key, value)
        return value

    # -- dict reads that would otherwise see the lazy entries --------------------------

    def __getitem__(self, key: str) -> Any:
        return self._load(key, super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __iter__(self) -> Iterator[str]:
        # A subclass's own __iter__ makes dict(m), {**m} and update(m) read through
        # keys() and __getitem__ instead of copying the raw entries.
        return super().__iter__()

    def items(self) -> Any:
        self._load_all()
        return super().items()

    def values(self) -> Any:
        self._load_all()
        return super().values()

    def __eq__(self, other: object) -> bool:
        self._load_all()
        if isinstance(other, GGUFMetadata):
            other._load_all()
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        self._load_all()
        return super().__repr__()

    def copy(self) -> dict[str, Any]:
        self._load_all()
        return dict(super().items())

    def __or__(self, other: Any) -> Any:
        self._load_all()
        return super().__or__(other)

    def __ror__(self, other: Any) -> Any:
        self._load_all()
        return super().__ror__(other)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            value = self[key]
            del self[key]
            return value
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Any]:
        self._load_all()
        return super().popitem()

    def setdefault(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else super().setdefault(key, default)

    def __reduce__(self) -> Any:
        self._load_all()
        return (dict, (dict(super().items()),))


def _value_type(cur: _Cursor, field: str) -> int:
    start = cur.pos
    vtype = cur.u32(field)
    if vtype not in _MIN_SIZE:
        raise cur.error(field, f"unknown metadata value type {vtype}", start)
    return vtype


def _read_value(cur: _Cursor, vtype: int, field: str, depth: int = 0) -> Any:
    """One metadata value of type ``vtype``; arrays recurse with a bounded depth. A
    large top-level array is validated and returned as a ``_LazyArray``."""
    if vtype == _T_STRING:
        return cur.string(field)
    if vtype == _T_ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise cur.error(field, f"arrays nested deeper than {MAX_ARRAY_DEPTH}")
        etype = _value_type(cur, f"{field}.item_type")
        n = cur.count(f"{field}.count", _MIN_SIZE[etype])
        if depth == 0 and n >= LAZY_ARRAY_MIN and etype != _T_ARRAY:
            start = cur.pos
            if etype == _T_STRING:
                bounds = cur.packed_strings(n, field)[1]
                return _LazyArray(etype, start, n, field, cur.pos, bounds)
            cur.array(etype, n, field)
            return _LazyArray(etype, start, n, field, cur.pos)
        if etype == _T_STRING:
            return cur.strings(n, field)
        if etype == _T_ARRAY:
            return [_read_value(cur, etype, f"{field}[{i}]", depth + 1) for i in range(n)]
        return cur.numbers(etype, n, field)
    if vtype == _T_BOOL:
        start = cur.pos
        b = cur.unpack(_SCALAR_STRUCTS[_T_BOOL], field)
        if b > 1:
            raise cur.error(field, f"bool byte {b} is not 0 or 1", start)
        return bool(b)
    return cur.unpack(_SCALAR_STRUCTS[vtype], field)


def _align_up(x: int, alignment: int) -> int:
    return (x + alignment - 1) // alignment * alignment


class _RawTensorInfo(NamedTuple):
    """A parsed tensor info before its data is placed (offset still relative)."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLType
    rel_offset: int
    nbytes: int
    field_at: int  # file position of the offset field, for error messages


def _parse_tensor_info(cur: _Cursor, index: int) -> _RawTensorInfo:
    """One tensor info: name, n_dims, dims (GGML order), ggml type, relative data offset."""
    name = cur.string(f"tensor_info[{index}].name")
    field = f"tensor[{name!r}]"
    dims_at = cur.pos
    n_dims = cur.u32(f"{field}.n_dims")
    if n_dims > MAX_DIMS:
        raise cur.error(f"{field}.n_dims", f"{n_dims} dims, at most {MAX_DIMS} allowed", dims_at)
    ne = [cur.u64(f"{field}.dims[{d}]") for d in range(n_dims)]
    n_elements = 1
    for d, size in enumerate(ne):
        if size == 0 or size > _INT64_MAX:
            raise cur.error(
                f"{field}.dims[{d}]", f"dimension {size} is not in 1..2**63-1", dims_at + 4 + 8 * d
            )
        n_elements *= size
        if n_elements > _INT64_MAX:
            raise cur.error(f"{field}.dims", f"{ne} holds more than 2**63-1 elements", dims_at)
    type_at = cur.pos
    type_id = cur.u32(f"{field}.type")
    try:
        qtype = GGMLType(type_id)
    except ValueError:
        raise cur.error(f"{field}.type", f"unknown or unsupported ggml type {type_id}", type_at) from None
    bs, ts = TYPE_SIZES[qtype]
    row = ne[0] if ne else 1
    if row % bs:
        raise cur.error(
            f"{field}.dims",
            f"row length {row} is not a multiple of the {qtype.name} block size {bs}",
            dims_at,
        )
    field_at = cur.pos
    rel_offset = cur.u64(f"{field}.offset")
    return _RawTensorInfo(name, tuple(reversed(ne)), qtype, rel_offset, n_elements // bs * ts, field_at)


class GGUFFile(MappedReader):
    """A GGUF model file, memory-mapped read-only.

    ``metadata`` and ``tensors`` are parsed and validated on open; tensor data is
    never copied: ``tensor()`` returns numpy views (plain types) or ``BlockTensor``
    (quantised types) over the mapping.  Use as a context manager, or ``close()``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path: str = os.fspath(path)
        self._alignment_at: int | None = None
        self._file: MappedFile | None = MappedFile(self.path)
        try:
            self._parse(_Cursor(self._file.buf, self._file.size, self.path))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the mapping; arrays of the metadata not read yet are copied out first."""
        metadata = getattr(self, "metadata", None)  # absent when parsing failed
        if self._file is not None and metadata is not None:
            metadata._detach()
        super().close()

    def __del__(self) -> None:
        # Dropped without close(): the metadata may outlive this object, and must not
        # keep the whole mapping alive for its lazy arrays.
        try:
            metadata = getattr(self, "metadata", None)
            if getattr(self, "_file", None) is not None and metadata is not None:
                metadata._detach()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (interpreter exit)
            pass

    # -- parsing ---------------------------------------------------------------

    def _parse(self, cur: _Cursor) -> None:
        cur.need(4, "header.magic")
        magic = bytes(cur.buf[0:4])
        if magic != GGUF_MAGIC:
            raise cur.error("header.magic", f"expected {GGUF_MAGIC!r}, got {magic!r}", 0)
        cur.pos = 4
        self.version: int = cur.u32("header.version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            why = (
                "big-endian GGUF files are not supported"
                if swapped in SUPPORTED_VERSIONS
                else f"unsupported version {self.version} (braze reads versions 2 and 3)"
            )
            raise cur.error("header.version", why, 4)
        n_tensors = cur.u64("header.tensor_count")
        n_kv = cur.u64("header.metadata_kv_count")
        # Smallest tensor info: name length, n_dims, type, offset; smallest kv: key length, type, a byte.
        left = cur.size - cur.pos
        if n_tensors * 24 > left:
            raise cur.error("header.tensor_count", f"{n_tensors} tensor infos cannot fit in {left} bytes", 8)
        if n_kv * 13 > left:
            raise cur.error(
                "header.metadata_kv_count", f"{n_kv} metadata pairs cannot fit in {left} bytes", 16
            )
        self.metadata: GGUFMetadata = self._parse_metadata(cur, n_kv)
        self.alignment: int = self._parse_alignment(cur)
        infos = self._parse_tensor_infos(cur, n_tensors)
        self.data_offset: int = _align_up(cur.pos, self.alignment)
        self.tensors: dict[str, GGUFTensorInfo] = self._place_tensors(cur, infos)
        _drop_pages(cur.buf, 0, self.data_offset)  # parsed: the header is not read again

    def _parse_metadata(self, cur: _Cursor, n_kv: int) -> GGUFMetadata:
        metadata = GGUFMetadata(self.path)
        metadata._attach(cur.buf, cur.size)
        for i in range(n_kv):
            key_at = cur.pos
            key = cur.string(f"metadata[{i}].key")
            if key in metadata:
                raise cur.error(f"metadata[{i}].key", f"duplicate key {key!r}", key_at)
            field = f"metadata[{key!r}]"
            vtype = _value_type(cur, f"{field}.type")
            if key == "general.alignment":
                self._alignment_at = cur.pos  # so a bad alignment error can point at it
            metadata[key] = _read_value(cur, vtype, field)
        return metadata

    def _parse_alignment(self, cur: _Cursor) -> int:
        value = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(value) is not int or value <= 0 or value & (value - 1):
            raise cur.error(
                "metadata['general.alignment']",
                f"must be a power of two > 0, got {value!r}",
                self._alignment_at,
            )
        return value

    def _parse_tensor_infos(self, cur: _Cursor, n: int) -> list[_RawTensorInfo]:
        infos: list[_RawTensorInfo] = []
        seen: set[str] = set()
        for i in range(n):
            name_at = cur.pos
            info = _parse_tensor_info(cur, i)
            if info.name in seen:
                raise cur.error(f"tensor_info[{i}].name", f"duplicate tensor name {info.name!r}", name_at)
            seen.add(info.name)
            infos.append(info)
        return infos

    def _place_tensors(self, cur: _Cursor, infos: list[_RawTensorInfo]) -> dict[str, GGUFTensorInfo]:
        """Check alignment, bounds and overlap of tensor data; build the tensor table."""
        for info in infos:
            field = f"tensor[{info.name!r}].offset"
            if info.rel_offset % self.alignment:
                raise cur.error(
                    field,
                    f"data offset {info.rel_offset} is not a multiple of the alignment {self.alignment}",
                    info.field_at,
                )
            end = self.data_offset + info.rel_offset + info.nbytes
            if end > cur.size:
                raise cur.error(
                    field, f"data ends at {end}, past the end of the file ({cur.size} bytes)", info.field_at
                )
        by_start = sorted(infos, key=lambda t: t.rel_offset)
        for prev, nxt in pairwise(by_start):
            if nxt.rel_offset < prev.rel_offset + prev.nbytes:
                raise cur.error(
                    f"tensor[{nxt.name!r}].offset",
                    f"data at {nxt.rel_offset} (relative) overlaps tensor {prev.name!r} "
                    f"[{prev.rel_offset}, {prev.rel_offset + prev.nbytes})",
                    nxt.field_at,
                )
        return {
            t.name: GGUFTensorInfo(t.name, t.shape, t.qtype, self.data_offset + t.rel_offset, t.nbytes)
            for t in infos
        }

    # -- access ------------------------------------------------------------------

    def _info(self, name: str) -> GGUFTensorInfo:
        if self._file is None or self._file.data is None:
            raise ValueError(f"{self.path}: GGUF file is closed")
        try:
            return self.tensors[name]
        except KeyError:
            near = difflib.get_close_matches(str(name), list(self.tensors), n=3)
            raise MissingWeight(self.path, str(name), near) from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapping."""
        info = self._info(name)
        assert self._file is not None and self._file.data is not None
        return self._file.data[info.offset : info.offset + info.nbytes]

    def tensor(self, name: str) -> np.ndarray | BlockTensor:
        """Zero-copy tensor: a typed read-only numpy view, or a ``BlockTensor`` if quantised."""
        info = self._info(name)
        raw = self.raw(name)
        if is_quantized(info.qtype):
            return BlockTensor(info.qtype, info.shape, raw)
        return raw.view(plain_dtype(info.qtype)).reshape(info.shape)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 (F32 tensors come back as the zero-copy view itself)."""
        info = self._info(name)
        t = self.tensor(name)
        if isinstance(t, BlockTensor):
            return t.dequantize()
        return t if info.qtype == GGMLType.F32 else t.astype(np.float32)


    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, version={getattr(self, 'version', '?')}, tensors={len(getattr(self, 'tensors', {}))})"
