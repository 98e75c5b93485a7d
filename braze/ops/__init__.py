"""Every op braze records, each defined once in the registry (see ``registry.py``)."""

from . import elementwise, reduce, shape  # noqa: F401  (registers the ops)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
