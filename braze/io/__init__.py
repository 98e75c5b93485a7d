"""Model-file readers: zero-copy, validating, mmap-backed."""

from braze.io.gguf import GGUFFile, GGUFTensorInfo
from braze.io.safetensors import SafetensorInfo, SafetensorsFile

__all__ = ["GGUFFile", "GGUFTensorInfo", "SafetensorInfo", "SafetensorsFile"]
