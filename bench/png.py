"""A tiny PNG writer and bar chart, with numpy, zlib and struct only.

The benchmarks draw one chart each; matplotlib would be a large dependency for that.
An image is an (H, W, 3) uint8 array; ``encode_png`` writes it as an 8-bit RGB PNG
(no filtering: every row's filter byte is 0, which every decoder reads). Labels use a
5x7 bitmap font of upper-case letters, digits and a little punctuation (lower case is
drawn in upper case), scaled by whole pixels.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
Color = tuple[int, int, int]


def _chunk(kind: bytes, data: bytes) -> bytes:
    # length, type, data, then the CRC of type and data (PNG spec, section 5.3)
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 RGB image."""
    img = np.ascontiguousarray(image, dtype=np.uint8)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) image, got shape {img.shape}")
    h, w, _ = img.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)], axis=1)  # filter byte 0 per row
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, no filter, no interlace
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) \
        + _chunk(b"IEND", b"")


# --------------------------------------------------------------------------- 5x7 font

_GLYPHS = {
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.", "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####", "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.", "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.", "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.", "9": ".###. #...# #...# .#### ....# ...#. .##..",
    "A": ".###. #...# #...# ##### #...# #...# #...#", "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.", "D": "###.. #..#. #...# #...# #...# #..#. ###..",
    "E": "##### #.... #.... ####. #.... #.... #####", "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####", "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.", "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#", "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#", "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.", "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#", "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.", "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.", "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.", "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..", "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    ".": "..... ..... ..... ..... ..... .##.. .##..", "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "-": "..... ..... ..... ##### ..... ..... .....", ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.", ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    "=": "..... ..... ##### ..... ##### ..... .....", " ": "..... ..... ..... ..... ..... ..... .....",
    "_": "..... ..... ..... ..... ..... ..... #####", ",": "..... ..... ..... ..... .##.. ..#.. .#...",
}
FONT: dict[str, np.ndarray] = {
    c: np.array([[ch == "#" for ch in row] for row in g.split()], dtype=bool) for c, g in _GLYPHS.items()
}


class Canvas:
    """An RGB image to draw filled rectangles and text on (coordinates: x right, y down)."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        self.pixels = np.empty((height, width, 3), np.uint8)
        self.pixels[:] = background

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the canvas."""
        x0, x1 = max(x0, 0), min(x1, self.width)
        y0, y1 = max(y0, 0), min(y1, self.height)
        if x0 < x1 and y0 < y1:
            self.pixels[y0:y1, x0:x1] = color

    @staticmethod
    def text_width(text: str, scale: int = 1) -> int:
        return max(len(text) * 6 - 1, 0) * scale  # 5 columns and a 1-column gap per character

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), scale: int = 1) -> None:
        """Draw ``text`` with its top-left corner at (x, y); unknown characters are blank."""
        for i, ch in enumerate(text.upper()):
            glyph = FONT.get(ch)
            if glyph is None:
                continue
            big = np.kron(glyph, np.ones((scale, scale), bool))  # each font pixel a scale x scale block
            gx, gy = x + i * 6 * scale, y
            h = min(big.shape[0], self.height - gy)
            w = min(big.shape[1], self.width - gx)
            if gx < 0 or gy < 0 or h <= 0 or w <= 0:
                continue
            region = self.pixels[gy:gy + h, gx:gx + w]
            region[big[:h, :w]] = color


# --------------------------------------------------------------------------- bar chart

PALETTE: list[Color] = [(230, 85, 13), (49, 130, 189), (49, 163, 84), (117, 107, 177), (99, 99, 99)]


@dataclass
class Panel:
    """One chart: a title, the labels of its groups along x, and per series one value
    per group (None: no bar)."""
    title: str
    groups: Sequence[str]
    series: Mapping[str, Sequence[float | None]]


def bar_chart(panels: Sequence[Panel], title: str = "", scale: int = 2, bar_width: int = 48,
              plot_height: int = 240) -> np.ndarray:
    """Grouped bar charts side by side, each on its own y scale (prefill and decoding
    rates differ by 10x or more), with each bar's value printed above it, one legend for
    all and an optional title line (drawn at scale 1) above. Returns the (H, W, 3) image."""
    names: list[str] = []
    for p in panels:
        names += [n for n in p.series if n not in names]
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    ch = 7 * scale                                # character height
    gap, pad = bar_width, 16 * scale
    widths = []
    for p in panels:
        group_w = len(p.series) * bar_width + gap
        label_w = max([Canvas.text_width(g, scale) for g in p.groups] + [0]) + gap // 2
        widths.append(max(len(p.groups) * max(group_w, label_w) + gap, Canvas.text_width(p.title, scale) + pad))
    title_h = 7 + pad // 2 if title else 0
    legend_h = title_h + ch + pad
    top = legend_h + ch + pad + ch + 8            # title, legend, panel titles, a value label above the tallest bar
    height = top + plot_height + 8 + ch + pad
    canvas = Canvas(max(sum(widths) + pad * (len(panels) + 1), Canvas.text_width(title) + 2 * pad), height)
    if title:
        canvas.text(pad, pad // 2, title, (80, 80, 80))
    x = pad                                       # the legend, across the top
    for n in names:
        canvas.rect(x, title_h + pad // 2, x + ch, title_h + pad // 2 + ch, color[n])
        canvas.text(x + ch + 4 * scale, title_h + pad // 2, n, scale=scale)
        x += ch + 4 * scale + Canvas.text_width(n, scale) + pad
    x0 = pad
    for p, w in zip(panels, widths):
        canvas.text(x0, legend_h + pad // 2, p.title, scale=scale)
        base = top + plot_height
        canvas.rect(x0, base, x0 + w, base + 2, (0, 0, 0))
        vmax = max([v for vs in p.series.values() for v in vs if v is not None] + [1e-12])
        slot = (w - gap) // max(len(p.groups), 1)
        for gi, label in enumerate(p.groups):
            gx = x0 + gap // 2 + gi * slot
            bars_w = len(p.series) * bar_width
            bx = gx + (slot - bars_w) // 2
            for si, (name, values) in enumerate(p.series.items()):
                v = values[gi] if gi < len(values) else None
                if v is None:
                    continue
                h = max(int(round(plot_height * v / vmax)), 1)
                canvas.rect(bx + si * bar_width + 2, base - h, bx + (si + 1) * bar_width - 2, base, color[name])
                s = f"{v:.0f}" if v >= 100 else f"{v:.1f}"
                sc = scale if Canvas.text_width(s, scale) <= bar_width else 1
                tx = bx + si * bar_width + (bar_width - Canvas.text_width(s, sc)) // 2
                canvas.text(tx, base - h - 7 * sc - 4, s, scale=sc)
            canvas.text(gx + (slot - Canvas.text_width(label, scale)) // 2, base + 8, label, scale=scale)
        x0 += w + pad
    return canvas.pixels


def write_bar_chart(path: str, panels: Sequence[Panel], title: str = "") -> None:
    with open(path, "wb") as f:
        f.write(encode_png(bar_chart(panels, title)))
