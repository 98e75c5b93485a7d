"""Weights kept in their GGML blocks on the cuda device: quantized matmul and row gather
as Triton, each weight element dequantized in registers where it is used.

One table entry per type (``DEQUANT``): a ``@triton.jit`` function ``_braze_deq(w, b,
e)`` giving the float32 value of element ``e`` of the block that starts ``b`` units
into ``w`` (bytes for the quantized types, elements for the float ones), read straight
from the block's fields as ``quant/dequant.py`` spells them; and the block geometry from
``quant/formats.py``. A new type is one entry here. Every kernel below is the same for
all types: the type's function is pasted in front of it.

- ``qlinear`` (``x @ w.T``): up to ``FEW`` rows of x (decoding) a matrix-vector kernel,
  each program a block of ``BN`` output rows over all of K, the weight tile (rows x
  blocks x elements: a block's scales load once) dequantized once and dotted with every
  row of x (each weight byte read once from memory), float32 sums; more rows (prefill) a tiled GEMM, the dequantized tile fed to ``tl.dot`` (float32
  at IEEE precision, as ``triton_gemm.py``: no silent TF32).
- ``qembedding`` / ``dequantize``: rows (at ids, or all) dequantized to float32; an id
  outside the table gives a row of NaN (as the C kernel; the recording checks ids).

Loads are never masked: indices are clamped inside the tensor and what a clamped lane
computed is zeroed, so a lane past the end reads real bytes and contributes nothing.
Shapes and strides are literals in the source (specialised per node, as the element
kernels are); pointer offsets come with the arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..layout import Layout
from ..quant.formats import TYPE_SIZES, GGMLType
from .triton import PRELUDE, NotRendered, Rendered

_FIELDS = '''

@triton.jit
def _braze_u8(w, p):
    return tl.load(w + p).to(tl.int32)


@triton.jit
def _braze_i8(w, p):
    v = tl.load(w + p).to(tl.int32)
    return tl.where(v >= 128, v - 256, v)


@triton.jit
def _braze_f16(w, p):
    # a little-endian float16 at byte p, from two byte loads (a block's fields have no alignment)
    u = tl.load(w + p).to(tl.uint16) | (tl.load(w + p + 1).to(tl.uint16) << 8)
    return u.to(tl.float16, bitcast=True).to(tl.float32)
'''

# per type: the body of _braze_deq(w, b, e) (w the weight pointer, b the block's start,
# e the element in the block, int32)
_LEGACY_NIBBLE = "(_braze_u8(w, b + {qs} + (e % 16)) >> ((e // 16) * 4)) & 15"
_FIFTH_BIT = "((_braze_u8(w, b + {qh} + e // 8) >> (e % 8)) & 1) << 4"
_K_LOW2 = "(_braze_u8(w, b + {qs} + (e // 128) * 32 + e % 32) >> (((e // 32) % 4) * 2)) & 3"
_K_NIBBLE = "(_braze_u8(w, b + {qs} + (e // 64) * 32 + e % 32) >> (((e // 32) % 2) * 4)) & 15"
_K_HIGH_BIT = "(_braze_u8(w, b + {qh} + e % 32) >> (e // 32)) & 1"
# Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 scale bytes at b + 4
_K_SCALE_MIN = '''    j = e // 32
    lo = j < 4
    ja = tl.where(lo, j, j + 4)
    jb = tl.where(lo, j + 4, j - 4)
    a = _braze_u8(w, b + 4 + ja)
    c = _braze_u8(w, b + 4 + jb)
    sc = tl.where(lo, a & 63, (a & 15) | ((c >> 6) << 4))
    mn = tl.where(lo, c & 63, (a >> 4) | ((_braze_u8(w, b + 4 + j) >> 6) << 4))
'''
_FLOAT = "    return tl.load(w + b + e).to(tl.float32)\n"

DEQUANT: dict[str, str] = {
    "Q4_0": f"    q = {_LEGACY_NIBBLE.format(qs=2)}\n"
            "    return (q - 8).to(tl.float32) * _braze_f16(w, b)\n",
    "Q4_1": f"    q = {_LEGACY_NIBBLE.format(qs=4)}\n"
            "    return q.to(tl.float32) * _braze_f16(w, b) + _braze_f16(w, b + 2)\n",
    "Q5_0": f"    q = ({_LEGACY_NIBBLE.format(qs=6)}) | ({_FIFTH_BIT.format(qh=2)})\n"
            "    return (q - 16).to(tl.float32) * _braze_f16(w, b)\n",
    "Q5_1": f"    q = ({_LEGACY_NIBBLE.format(qs=8)}) | ({_FIFTH_BIT.format(qh=4)})\n"
            "    return q.to(tl.float32) * _braze_f16(w, b) + _braze_f16(w, b + 2)\n",
    "Q8_0": "    return _braze_i8(w, b + 2 + e).to(tl.float32) * _braze_f16(w, b)\n",
    "Q2_K": "    sc = _braze_u8(w, b + e // 16)\n"
            f"    q = {_K_LOW2.format(qs=16)}\n"
            "    dl = _braze_f16(w, b + 80) * (sc & 15).to(tl.float32)\n"
            "    ml = _braze_f16(w, b + 82) * (sc >> 4).to(tl.float32)\n"
            "    return dl * q.to(tl.float32) - ml\n",
    "Q3_K": "    i = e // 16\n"
            "    low4 = (_braze_u8(w, b + 96 + i % 8) >> ((i // 8) * 4)) & 15\n"
            "    high2 = (_braze_u8(w, b + 104 + i % 4) >> ((i // 4) * 2)) & 3\n"
            "    sc = (low4 | (high2 << 4)) - 32\n"
            f"    q = ({_K_LOW2.format(qs=32)}) - (1 - ({_K_HIGH_BIT.format(qh=0)})) * 4\n"
            "    return (_braze_f16(w, b + 108) * sc.to(tl.float32)) * q.to(tl.float32)\n",
    "Q4_K": _K_SCALE_MIN +
            f"    q = {_K_NIBBLE.format(qs=16)}\n"
            "    return (_braze_f16(w, b) * sc.to(tl.float32)) * q.to(tl.float32) "
            "- _braze_f16(w, b + 2) * mn.to(tl.float32)\n",
    "Q5_K": _K_SCALE_MIN +
            f"    q = ({_K_NIBBLE.format(qs=48)}) | (({_K_HIGH_BIT.format(qh=16)}) << 4)\n"
            "    return (_braze_f16(w, b) * sc.to(tl.float32)) * q.to(tl.float32) "
            "- _braze_f16(w, b + 2) * mn.to(tl.float32)\n",
    "Q6_K": "    k = (e // 32) % 4\n"
            "    low = (_braze_u8(w, b + (e // 128) * 64 + (k % 2) * 32 + e % 32) >> ((k // 2) * 4)) & 15\n"
            "    high = (_braze_u8(w, b + 128 + (e // 128) * 32 + e % 32) >> (k * 2)) & 3\n"
            "    q = (low | (high << 4)) - 32\n"
            "    return (_braze_f16(w, b + 208) * _braze_i8(w, b + 192 + e // 16).to(tl.float32)) * q.to(tl.float32)\n",
    "F32": _FLOAT,
    "F16": _FLOAT,
    "BF16": _FLOAT,
}

FEW = 8  # rows of x up to which qlinear takes the matrix-vector kernel
MAX_NUMEL = 1 << 20  # elements of a tile, at most (Triton refuses more)
PROGRAMS = 128  # matrix-vector programs wanted at least (an H100 has 132 SMs), rows allowing


@dataclass(frozen=True)
class Geometry:
    """A weight operand as its kernel addresses it: elements and pointer units per block
    (bytes for a quantized type, one element for a float one), units between rows."""

    per_block: int
    units: int
    ldw: int

    @staticmethod
    def of(qtype: str, w: Layout) -> "Geometry":
        if qtype not in DEQUANT:
            raise NotRendered(f"a {qtype} weight")
        elements, nbytes = TYPE_SIZES[GGMLType[qtype]]
        units = nbytes if elements > 1 else 1
        lead = [(n, s) for n, s in zip(w.shape[:-1], w.strides[:-1]) if n > 1]
        # the rows' dims flattened to one stride (a view that keeps them one run of rows)
        stride = lead[-1][1] if lead else 0
        size = 1
        for n, s in reversed(lead):
            if s != stride * size:
                raise NotRendered(f"a {qtype} weight whose rows are not evenly spaced")
            size *= n
        return Geometry(elements, units, stride // elements * units)

    def address(self, row: str, col: str) -> tuple[str, str]:
        """``b, e`` of element (row, col): the block's start and the element in it."""
        if self.per_block == 1:
            return f"{row} * {self.ldw} + {col}", "0"
        return (f"{row} * {self.ldw} + ({col} // {self.per_block}) * {self.units}",
                f"({col} % {self.per_block}).to(tl.int32)")


def _module(qtype: str, body: list[str]) -> str:
    deq = "\n\n@triton.jit\ndef _braze_deq(w, b, e):\n" + DEQUANT[qtype]
    return PRELUDE + _FIELDS + deq + "\n".join(body) + "\n"


def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def qlinear_source(x: Layout, w: Layout, qtype: str, name: str, interpret: bool = False) -> Rendered:
    """``y = x @ w.T`` for x (M, K) float32 and w (N, K) of ``qtype``, y (M, N) contiguous
    float32; arguments x, w, y. ``interpret`` picks wide tiles (the interpreter runs a
    program's tile as one numpy operation, so fewer, wider programs run faster)."""
    (m, k), n = x.shape, w.shape[0]
    sxm, sxk = x.strides
    g = Geometry.of(qtype, w)
    if m <= FEW:
        return _gemv(x, n, g, qtype, name, interpret)
    bm, bn, bk = (64, 64, 64) if interpret else (64, 64, 32)
    nb = -(-n // bn)
    b, e = g.address("nn[None, :]", "kc[:, None]")
    body = ["", "", "@triton.jit", f"def {name}(x, w, y, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):",
            "    pid = tl.program_id(0).to(tl.int64)",
            f"    rm = (pid // {nb}) * BM + tl.arange(0, BM).to(tl.int64)",
            f"    rn = (pid % {nb}) * BN + tl.arange(0, BN).to(tl.int64)",
            f"    nn = tl.minimum(rn, {n - 1})",
            "    acc = tl.zeros([BM, BN], tl.float32)",
            f"    for k0 in range(0, {k}, BK):",
            "        kk = k0 + tl.arange(0, BK).to(tl.int64)",
            f"        kc = tl.minimum(kk, {k - 1})",
            f"        xv = tl.load(x + rm[:, None] * {sxm} + kc[None, :] * {sxk}, "
            f"mask=(rm[:, None] < {m}) & (kk[None, :] < {k}), other=0.0)",
            f"        wv = tl.where(kk[:, None] < {k}, _braze_deq(w, {b}, {e}), 0.0)",  # (BK, BN): w.T's tile
            '        acc += tl.dot(xv, wv, input_precision="ieee")',
            f"    tl.store(y + rm[:, None] * {n} + rn[None, :], acc, mask=(rm[:, None] < {m}) & (rn[None, :] < {n}))"]
    return Rendered(_module(qtype, body), name, (-(-m // bm) * nb,), {"BM": bm, "BN": bn, "BK": bk})


def _gemv(x: Layout, n: int, g: Geometry, qtype: str, name: str, interpret: bool) -> Rendered:
    """The matrix-vector kernel: a program per ``BN`` output rows walks K ``NB`` blocks at a
    time, the weight tile shaped (rows, blocks, elements) so that each block's scales are
    loaded once and broadcast over its elements, and dots it with each of the ``MP`` rows of x."""
    (m, k), (sxm, sxk) = x.shape, x.strides
    mp, qk = _pow2(m), g.per_block
    nblocks = k // qk
    if interpret:  # wide tiles: fewer programs, each one numpy operation per statement
        nb = max(1, min(512, _pow2(k)) // qk)
        bn = min(_pow2(n), MAX_NUMEL // (mp * nb * qk))
    else:  # at most ~4096 products per program step, and programs enough to fill the SMs
        nb = max(1, 128 // qk)
        most = max(8, 4096 // (mp * nb * qk))
        bn = max(8, min(most, 1 << max(0, (n // PROGRAMS).bit_length() - 1)))
    body = ["", "", "@triton.jit",
            f"def {name}(x, w, y, MP: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr, QK: tl.constexpr):",
            "    rn = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)",
            "    rm = tl.arange(0, MP).to(tl.int64)",
            "    blk = tl.arange(0, NB).to(tl.int64)",
            "    el = tl.arange(0, QK)",
            f"    row = tl.minimum(rn, {n - 1})[:, None, None] * {g.ldw}",
            "    acc = tl.zeros([MP, BN], tl.float32)",
            f"    for b0 in range(0, {nblocks}, NB):",
            "        bi = b0 + blk",
            f"        b = row + tl.minimum(bi, {nblocks - 1})[None, :, None] * {g.units}",
            "        kk = bi[:, None] * QK + el[None, :]",  # (NB, QK): the columns of this step
            f"        wv = tl.where(kk[None, :, :] < {k}, _braze_deq(w, b, el[None, None, :]), 0.0)",
            f"        kc = tl.minimum(kk, {k - 1})",
            f"        xv = tl.load(x + rm[:, None, None] * {sxm} + kc[None, :, :] * {sxk}, "
            f"mask=(rm[:, None, None] < {m}) & (kk[None, :, :] < {k}), other=0.0)",
            "        acc += tl.sum(tl.sum(xv[:, None, :, :] * wv[None, :, :, :], axis=3), axis=2)",
            f"    tl.store(y + rm[:, None] * {n} + rn[None, :], acc, mask=(rm[:, None] < {m}) & (rn[None, :] < {n}))"]
    return Rendered(_module(qtype, body), name, (-(-n // bn),), {"MP": mp, "BN": bn, "NB": nb, "QK": qk})


def qrows_source(w: Layout, qtype: str, rows: int, name: str, ids: bool, interpret: bool = False) -> Rendered:
    """float32 rows of table w (``rows`` of them, K wide) into a contiguous (R, K) output:
    with ``ids`` row i is the table's row ``ids[i]`` (arguments w, ids, out; R ids), else
    row i itself (arguments w, out; R = every row of w: ``dequantize``)."""
    k = w.shape[-1]
    table = prod(w.shape[:-1])
    g = Geometry.of(qtype, w)
    bk = min(1024 if interpret else 256, _pow2(k))
    b, e = g.address("ic", "kc")
    args = "w, ids, out" if ids else "w, out"
    body = ["", "", "@triton.jit", f"def {name}({args}, BK: tl.constexpr):",
            "    r = tl.program_id(0).to(tl.int64)",
            "    kk = tl.program_id(1).to(tl.int64) * BK + tl.arange(0, BK).to(tl.int64)",
            f"    kc = tl.minimum(kk, {k - 1})"]
    if ids:
        body += ["    i = tl.load(ids + r).to(tl.int64)",
                 f"    ok = (i >= 0) & (i < {table})",
                 "    ic = tl.where(ok, i, 0)",
                 f"    v = tl.where(ok, _braze_deq(w, {b}, {e}), float('nan'))"]
    else:
        body += ["    ic = r", f"    v = _braze_deq(w, {b}, {e})"]
    body.append(f"    tl.store(out + r * {k} + kk, v, mask=kk < {k})")
    return Rendered(_module(qtype, body), name, (rows, -(-k // bk)), {"BK": bk})
