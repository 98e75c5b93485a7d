"""An architecture's GGUF metadata: ``{arch}.key`` lookups that name the file and the key.

Every model file reads its shape through this: a missing required key, or a value of
the wrong kind, is a ``FormatError`` naming the file and the field, before any tensor
is touched.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..errors import FormatError
from ..io.validate import MAX_COUNT

_REQUIRED: Any = object()


class ArchMeta:
    def __init__(self, path: str, meta: Mapping[str, Any], arch: str) -> None:
        self.path, self.meta, self.arch = path, meta, arch

    def key(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self.key(key) in self.meta

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        full = self.key(key)
        if full in self.meta:
            return self.meta[full]
        if default is _REQUIRED:
            raise FormatError(self.path, full, None, "required metadata key is missing")
        return default

    def error(self, key: str, value: Any, why: str) -> FormatError:
        return FormatError(self.path, self.key(key), None, why, value=value)

    def _number(self, key: str, default: Any, kind: type) -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
            raise self.error(key, value, f"expected {kind.__name__}, got {type(value).__name__}")
        return kind(value)

    def int(self, key: str, default: Any = _REQUIRED, hi: int = MAX_COUNT) -> Any:
        """A count in ``[1, hi]`` (``None`` when absent and ``default`` is None): no
        value a file holds sizes a table past what any real model has."""
        v = self._number(key, default, int)
        if v is not None and not 1 <= v <= hi:
            raise self.error(key, v, f"expected an integer in [1, {hi}]")
        return v

    def float(self, key: str, default: Any = _REQUIRED, lo: float = -math.inf, hi: float = math.inf) -> Any:
        """A finite number in ``(lo, hi]`` (a NaN epsilon or rope base is a broken file)."""
        v = self._number(key, default, float)
        if v is not None and not (math.isfinite(v) and lo < v <= hi):
            raise self.error(key, v, f"expected a finite number in ({lo}, {hi}]")
        return v

    def str(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.get(key, default)
        if value is not None and not isinstance(value, str):
            raise FormatError(self.path, self.key(key), None, f"expected a string, got {value!r}")
        return value
