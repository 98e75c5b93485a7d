"""Neural-network modules for inference, PyTorch-shaped."""

from . import functional
from .layers import Attention, Embedding, GeGLU, KVCache, LayerNorm, Linear, RMSNorm, RotaryEmbedding, SwiGLU
from .paged import PagedIndex, PagedKVCache
from .module import Module, ModuleList

__all__ = ["functional", "Module", "ModuleList", "Linear", "Embedding", "RMSNorm", "LayerNorm",
           "RotaryEmbedding", "SwiGLU", "GeGLU", "Attention", "KVCache", "PagedIndex", "PagedKVCache"]
