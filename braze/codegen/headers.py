"""The C headers shipped beside the renderers (cmath.h, tile.h, quant.h), read once."""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def header(name: str) -> str:
    return resources.files("braze.codegen").joinpath(name).read_text()
