"""Renderers from the loop IR to source code: ``c.py`` (C + OpenMP, with ``cmath.h``),
``chain.py`` (chain kernels, ``tile.h``) and ``quant.py`` (quantized matmuls, ``quant.h``)."""

from . import c, chain, scan, scatter, topk  # noqa: F401  (they register their renderers with c)
