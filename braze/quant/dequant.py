"""Reference dequantisers for the GGML block formats, in numpy.

These are the *reference*: simple, vectorised over all blocks at once (no Python
loop per block) and bit-exact with ggml's scalar C code, because every float32
operation is done in the same order as ``dequantize_row_*`` (e.g. ``d * q + m``, or
``(d * sc) * q``).  Fast kernels are tested against these.

Each ``_deq_*`` takes the blocks as a structured array of shape ``(n_blocks,)``
(see ``formats.BLOCK_DTYPES``) and returns float32 of shape ``(n_blocks, block_size)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from braze.errors import DtypeMismatch, ShapeMismatch, Unsupported
from braze.quant.formats import BLOCK_DTYPES, PLAIN_SIZES, QK_K, TYPE_SIZES, GGMLType, plain_dtype

_F32 = np.float32


def _f32(field: np.ndarray) -> np.ndarray:
    """A per-block f16 scale as float32 column ``(n_blocks, 1)`` ready to broadcast."""
    return field.astype(_F32)[:, None]


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """Legacy 32-blocks: low nibbles are elements 0..15, high nibbles elements 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _bits_le(qh: np.ndarray, n: int) -> np.ndarray:
    """Bits of little-endian bytes ``qh`` (n_blocks, nbytes) in bit order: bit k of the whole word."""
    return np.unpackbits(qh, axis=1, bitorder="little")[:, :n]


def _bit_planes(h: np.ndarray) -> np.ndarray:
    """K-quant high bits: element e takes bit ``e // 32`` of byte ``h[e % 32]`` (h has 32 bytes)."""
    shifts = np.arange(8, dtype=np.uint8)[None, :, None]
    return ((h[:, None, :] >> shifts) & 1).reshape(h.shape[0], QK_K)


def _deq_q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles_split(b["qs"]).astype(np.int8) - np.int8(8)
    return q.astype(_F32) * _f32(b["d"])


def _deq_q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles_split(b["qs"]).astype(_F32)
    return q * _f32(b["d"]) + _f32(b["m"])


def _q5_values(b: np.ndarray) -> np.ndarray:
    """5-bit values 0..31: a nibble plus its fifth bit from the 32-bit ``qh`` word."""
    return _nibbles_split(b["qs"]) | (_bits_le(b["qh"], 32) << 4)


def _deq_q5_0(b: np.ndarray) -> np.ndarray:
    q = _q5_values(b).astype(np.int8) - np.int8(16)
    return q.astype(_F32) * _f32(b["d"])


def _deq_q5_1(b: np.ndarray) -> np.ndarray:
    return _q5_values(b).astype(_F32) * _f32(b["d"]) + _f32(b["m"])


def _deq_q8_0(b: np.ndarray) -> np.ndarray:
    return b["qs"].astype(_F32) * _f32(b["d"])


def _deq_q8_1(b: np.ndarray) -> np.ndarray:
    # ``s`` caches d * sum(qs) for dot products; it plays no part in the values.
    return b["qs"].astype(_F32) * _f32(b["d"])


def _per_16(scale: np.ndarray) -> np.ndarray:
    """Repeat a per-16-element scale (n_blocks, 16) over the 256 elements of a super-block."""
    return np.repeat(scale, 16, axis=1)


def _per_32(scale: np.ndarray) -> np.ndarray:
    return np.repeat(scale, 32, axis=1)


def _deq_q2_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sc = b["scales"]
    dl = _per_16(_f32(b["d"]) * (sc & 0x0F).astype(_F32))
    ml = _per_16(_f32(b["dmin"]) * (sc >> 4).astype(_F32))
    # Two halves of 128 elements, each from 32 bytes; shift 2*j gives the j-th group of 32.
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    q = ((b["qs"].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, QK_K)
    return dl * q.astype(_F32) - ml


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit scales packed in 12 bytes: 4 low bits from bytes 0..7, 2 high bits from 8..11."""
    i = np.arange(16)
    low = (s[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 0x0F
    high = (s[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 0x03
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def _deq_q3_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    dl = _per_16(_f32(b["d"]) * _q3_k_scales(b["scales"]).astype(_F32))
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    low = ((b["qs"].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, QK_K).astype(np.int8)
    # A *clear* high bit means "subtract 4".
    q = low - ((1 - _bit_planes(b["hmask"])) * 4).astype(np.int8)
    return dl * q.astype(_F32)


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eight 6-bit (scale, min) pairs from the 12-byte ``scales`` field of Q4_K / Q5_K."""
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: each 32 bytes give 64 elements, low nibbles first then high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8)[None, None, :, None]
    return (q & 0x0F).reshape(n, QK_K)


def _deq_q4_k(b: np.ndarray) -> np.ndarray:
    sc, mn = _k4_scales_mins(b["scales"])
    d = _per_32(_f32(b["d"]) * sc.astype(_F32))
    m = _per_32(_f32(b["dmin"]) * mn.astype(_F32))
    return d * _k4_nibbles(b["qs"]).astype(_F32) - m


def _deq_q5_k(b: np.ndarray) -> np.ndarray:
    sc, mn = _k4_scales_mins(b["scales"])
    d = _per_32(_f32(b["d"]) * sc.astype(_F32))
    m = _per_32(_f32(b["dmin"]) * mn.astype(_F32))
    q = _k4_nibbles(b["qs"]) | (_bit_planes(b["qh"]) << 4)
    return d * q.astype(_F32) - m


def _deq_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    # Two halves of 128 elements.  In a half, group k (0..3) of 32 elements takes
    # nibble k//2 of ql bytes 32*(k%2).., and bits 2k..2k+1 of the half's 32 qh bytes.
    ql = b["ql"].reshape(n, 2, 1, 2, 32) >> np.array([0, 4], dtype=np.uint8)[None, None, :, None, None]
    low = (ql & 0x0F).reshape(n, 2, 4, 32)
    qh = b["qh"].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    high = (qh & 3).reshape(n, 2, 4, 32)
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(n, QK_K)
    d = _per_16(_f32(b["d"]) * b["scales"].astype(_F32))
    return d * q.astype(_F32)


_DEQUANTISERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q4_0: _deq_q4_0,
    GGMLType.Q4_1: _deq_q4_1,
    GGMLType.Q5_0: _deq_q5_0,
    GGMLType.Q5_1: _deq_q5_1,
    GGMLType.Q8_0: _deq_q8_0,
    GGMLType.Q8_1: _deq_q8_1,
    GGMLType.Q2_K: _deq_q2_k,
    GGMLType.Q3_K: _deq_q3_k,
    GGMLType.Q4_K: _deq_q4_k,
    GGMLType.Q5_K: _deq_q5_k,
    GGMLType.Q6_K: _deq_q6_k,
}

SUPPORTED_DEQUANT: frozenset[GGMLType] = frozenset(_DEQUANTISERS) | {
    GGMLType.F32,
    GGMLType.F16,
    GGMLType.BF16,
}


def expected_nbytes(qtype: GGMLType, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of ``shape`` takes; raises ``ShapeMismatch`` if rows do not fill whole blocks."""
    bs, ts = TYPE_SIZES[qtype]
    if any(int(s) < 0 for s in shape):
        raise ShapeMismatch("dequantize", [tuple(shape)], "negative dimension")
    if bs > 1 and (len(shape) == 0 or shape[-1] % bs):
        raise ShapeMismatch(
            "dequantize", [tuple(shape)], f"last dim must be a multiple of the {qtype.name} block size {bs}"
        )
    n = 1
    for s in shape:
        n *= int(s)
    return n // bs * ts


def dequantize(raw: np.ndarray, qtype: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
    """Decode the raw bytes of a GGML tensor into float32 of ``shape`` (row-major).

    ``raw`` is the uint8 bytes of all blocks, in file order.  The result is a new
    array, except for F32, which is returned as a (possibly read-only) view of ``raw``.
    """
    try:
        qtype = GGMLType(qtype)
    except ValueError:
        raise Unsupported("dequantize", f"unknown GGML type {qtype!r}") from None
    if qtype not in SUPPORTED_DEQUANT:
        raise Unsupported("dequantize", f"no dequantiser for {qtype.name}")
    if raw.dtype != np.uint8:
        raise DtypeMismatch("dequantize", [raw.dtype], "raw block bytes must be uint8")
    shape = tuple(int(s) for s in shape)
    nbytes = expected_nbytes(qtype, shape)
    flat = raw.reshape(-1)
    if flat.size != nbytes:
        raise ShapeMismatch(
            "dequantize", [shape, raw.shape], f"{qtype.name} {shape} needs {nbytes} bytes, got {flat.size}"
        )
    if qtype in PLAIN_SIZES:
        values = flat.view(plain_dtype(qtype))
        out = values if qtype == GGMLType.F32 else values.astype(_F32)
        return out.reshape(shape)
    blocks = flat.view(BLOCK_DTYPES[qtype])
    # A NaN/inf scale in the file gives NaN/inf values (as in ggml), not a warning per call.
    with np.errstate(invalid="ignore", over="ignore"):
        return _DEQUANTISERS[qtype](blocks).reshape(shape)
