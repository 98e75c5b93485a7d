"""Checked reads of the values a model takes from its files (GGUF metadata, the JSON
files of an embedder directory).

The parsers guarantee structure (a GGUF value is an int, a float, a string, a list);
what sits on top must not trust the values: a head count of 0 divides by zero, a NaN
epsilon generates empty text, a context length of 2**32 sizes gigabytes. Every field
is read through ``Fields``, which checks its type and range where it is read and
raises ``FormatError(file, field, ..., value=...)`` naming all three.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import FormatError

_MISSING: Any = object()

#: the largest count any model field may hold: far past real models (Llama 3.1 405B
#: has 126 layers, 128 heads, 53248 FFN width, a 128k context), small enough that no
#: product of two of them overflows or sizes a table braze could not allocate
MAX_COUNT = 1 << 24

#: config JSON files are a few KiB; a larger one is not a config
MAX_JSON_BYTES = 16 << 20


class Fields:
    """One file's key/value metadata, read field by field with a check for each."""

    def __init__(self, file: str | os.PathLike[str], meta: Mapping[str, Any], prefix: str = "") -> None:
        self.file, self.meta, self.prefix = os.fspath(file), meta, prefix

    def error(self, key: str, value: Any, why: str) -> FormatError:
        return FormatError(self.file, self.prefix + key, None, why, value=value)

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.meta:
            return self.meta[key]
        if default is _MISSING:
            raise FormatError(self.file, self.prefix + key, None, "required field is missing")
        return default

    def count(self, key: str, default: Any = _MISSING, lo: int = 1, hi: int = MAX_COUNT) -> int:
        """An integer in ``[lo, hi]`` (bools and floats are refused: a count stored as
        ``2.5`` or ``true`` is a broken file, not a value to round)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise self.error(key, value, f"must be an integer, not {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.error(key, value, f"must be in [{lo}, {hi}]")
        return int(value)

    def real(self, key: str, default: Any = _MISSING, lo: float = 0.0, hi: float = math.inf,
             lo_open: bool = True) -> float:
        """A finite number in ``(lo, hi]`` (``[lo, hi]`` without ``lo_open``)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise self.error(key, value, f"must be a number, not {type(value).__name__}")
        x = float(value)
        low_ok = x > lo if lo_open else x >= lo
        if not (math.isfinite(x) and low_ok and x <= hi):
            raise self.error(key, value, f"must be finite and in {'(' if lo_open else '['}{lo}, {hi}]")
        return x

    def text(self, key: str, default: Any = _MISSING, choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise self.error(key, value, f"must be a string, not {type(value).__name__}")
        if choices is not None and value not in choices:
            raise self.error(key, value, f"must be one of {', '.join(choices)}")
        return value

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, (bool, np.bool_)):
            raise self.error(key, value, f"must be true or false, not {type(value).__name__}")
        return bool(value)


def read_json(path: Path, expect: type = dict) -> Any:
    """A JSON file of a model directory, of type ``expect`` at the top: a missing,
    oversized, non-regular, non-UTF-8, malformed or wrongly-shaped file is a
    ``FormatError`` naming it, never a traceback from ``json``."""
    name = path.name
    try:
        if not path.is_file():
            raise FormatError(str(path), name, None, "is not a regular file")
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise FormatError(str(path), name, None, f"is {size} bytes, more than a config's {MAX_JSON_BYTES}")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FormatError:
        raise
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FormatError(str(path), name, None, f"cannot read it: {type(e).__name__}: {e}") from None
    if not isinstance(data, expect):
        raise FormatError(str(path), name, None, f"must hold a JSON {expect.__name__}, not {type(data).__name__}",
                          value=data)
    return data
