"""A prefix-scoped weight builder: module paths to tensor names, as Candle's VarBuilder.

``vb.pp("blk").pp(3).get("attn_q.weight")`` fetches ``blk.3.attn_q.weight`` from the
file, checks its shape, and hands it out as a braze tensor: zero-copy over the file's
memory map for float tensors; quantized GGUF tensors are dequantised to float32 here
(a later issue keeps them quantized for quantized matmul kernels).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from ..errors import MissingWeight, ShapeMismatch
from ..runtime import memory
from ..tensor import Tensor, from_numpy


class WeightSource(Protocol):
    path: str

    def names(self) -> Iterable[str]: ...

    def load(self, name: str) -> Tensor: ...


class GGUFWeights:
    """Tensors of a GGUF file; quantized ones dequantised to float32 on load."""

    def __init__(self, gguf: Any) -> None:
        self.file = gguf
        self.path = str(gguf.path)

    def names(self) -> Iterable[str]:
        return self.file.tensors.keys()

    def qtype(self, name: str) -> str:
        return str(self.file.tensors[name].qtype.name)

    def load(self, name: str) -> Tensor:
        data = self.file.tensor(name)
        if not isinstance(data, np.ndarray):
            data = memory.adopt(self.file.dequantize(name))  # braze's memory now, not the file's
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
