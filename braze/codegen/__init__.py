"""Renderers from the loop IR to source code: ``c.py`` (C + OpenMP, with ``cmath.h``),
``chain.py`` (chain kernels, ``tile.h``) and ``quant.py`` (quantized matmuls, ``quant.h``)."""

from . import c, chain, topk  # noqa: F401  (chain and topk register their renderers with c)
