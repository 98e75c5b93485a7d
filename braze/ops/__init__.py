"""Every op braze records, each defined once in the registry (see ``registry.py``)."""

from . import elementwise, quant, reduce, shape  # noqa: F401  (registers the ops)
from . import lowering  # noqa: F401,E402  (fills OpDef.lower)
from .registry import REGISTRY, OpDef, get

__all__ = ["REGISTRY", "OpDef", "get"]
