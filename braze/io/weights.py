"""A prefix-scoped weight builder: module paths to tensor names, as Candle's VarBuilder.

``vb.pp("blk").pp(3).get("attn_q.weight")`` fetches ``blk.3.attn_q.weight`` from the
file, checks its shape, and hands it out as a braze tensor, zero-copy over the file's
memory map: float tensors in their own type, quantized GGUF tensors in their blocks
(a block dtype such as ``q4_k``), read only by the quantized matmul and embedding
kernels. Loading a model reads no weight bytes; the pages come in as kernels touch them.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from ..errors import MissingWeight, ShapeMismatch
from ..quant import DTYPES, BlockTensor, GGMLType
from ..runtime import memory
from ..creation import from_blocks, from_numpy
from ..tensor import Tensor


class WeightSource(Protocol):
    path: str

    def names(self) -> Iterable[str]: ...

    def load(self, name: str) -> Tensor: ...


class GGUFWeights:
    """Tensors of a GGUF file; quantized ones stay in their blocks, or with
    ``dequantize`` (the float32 baseline the quantized kernels are compared with) are
    dequantized to float32, as are half ones."""

    def __init__(self, gguf: Any, dequantize: bool = False) -> None:
        self.file = gguf
        self.path = str(gguf.path)
        self.dequantize = dequantize

    def names(self) -> Iterable[str]:
        return self.file.tensors.keys()

    def qtype(self, name: str) -> str:
        return str(self.file.tensors[name].qtype.name)

    def load(self, name: str) -> Tensor:
        data = self.file.tensor(name)
        if self.dequantize and (isinstance(data, BlockTensor) or data.dtype.name in ("float16", "bfloat16")):
            return from_numpy(memory.adopt(np.ascontiguousarray(self.file.dequantize(name), np.float32)))
        if isinstance(data, BlockTensor):
            return from_blocks(data.raw, DTYPES[data.qtype], data.shape, owner=self.file)
        return from_numpy(data)


class SafetensorsWeights:
    def __init__(self, st: Any) -> None:
        self.file = st
        self.path = str(st.path)

    def names(self) -> Iterable[str]:
        return self.file.tensors.keys()

    def load(self, name: str) -> Tensor:
        return from_numpy(self.file.tensor(name))


class WeightBuilder:
    def __init__(self, source: WeightSource, prefix: str = "", on_load: Callable[[str], None] | None = None,
                 _names: frozenset[str] | None = None) -> None:
        self.source = source
        self.prefix = prefix
        self.on_load = on_load
        self._names = _names if _names is not None else frozenset(source.names())

    def pp(self, name: str | int) -> "WeightBuilder":
        """A builder one level deeper: ``pp("blk").pp(3)`` scopes to ``blk.3.``."""
        return WeightBuilder(self.source, self._full(str(name)), self.on_load, self._names)

    def _full(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def contains(self, name: str) -> bool:
        return self._full(name) in self._names

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> Tensor:
        full = self._full(name)
        if full not in self._names:
            raise MissingWeight(self.source.path, full, difflib.get_close_matches(full, sorted(self._names), n=3))
        t = self.source.load(full)
        if shape is not None and t.shape != tuple(shape):
            raise ShapeMismatch("load", [t.shape, tuple(shape)],
                                f"{self.source.path}: tensor {full!r} has shape {t.shape}, the model expects {tuple(shape)}")
        if self.on_load is not None:
            self.on_load(full)
        return t

    def get_opt(self, name: str, shape: tuple[int, ...] | None = None) -> Tensor | None:
        return self.get(name, shape) if self.contains(name) else None
