"""The C headers shipped beside the renderers (cmath.h, tile.h, the quantized matmul's), read once."""

from __future__ import annotations

import functools
from importlib import resources

from ..runtime.simd import wide_512


@functools.cache
def header(name: str) -> str:
    return resources.files("braze.codegen").joinpath(name).read_text()


# The quantized matmul's headers, in the order each needs the ones before it: one block
# (unpacking, x's quantizing, one block's dots), the shared parts and the strips, one x
# row in registers, and the assembly per type that codegen/quant.py's table instantiates.
QUANT_HEADERS = ("quant_blocks.h", "quant.h", "quant_rows.h", "quant_linear.h")


def quant_source() -> str:
    """The quantized matmul's C, every header in order (before a type's instantiation),
    after what the machine measured (``runtime/simd.py``; a -D flag still overrides it)."""
    return "\n".join([f"#ifndef BRAZE_WIDE512\n#define BRAZE_WIDE512 {int(wide_512())}\n#endif",
                      *(header(name) for name in QUANT_HEADERS)])
