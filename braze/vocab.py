"""A vocabulary as tokenizers read it: token types and special ids, GPT-2's byte
alphabet (byte-level BPE vocabularies spell bytes as printable characters), byte
strings packed end to end, and typed readers of tokenizer metadata whose errors name
the file and field. Shared by the GGUF/BPE tokenizer (``tokenizer.py``) and the
WordPiece one (``wordpiece.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

import numpy as np

from braze.errors import FormatError
from braze.io.gguf import GGUFMetadata

__all__ = [
    "Packed", "Specials", "TokenType", "bad_field", "byte_level_bytes", "byte_level_pieces", "byte_to_unicode",
    "byte_token_value", "meta_bool", "meta_get", "meta_int", "meta_list", "meta_str", "meta_text",
]

class TokenType:
    """GGUF ``tokenizer.ggml.token_type`` values (llama.cpp's token attributes)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6




# ------------------------------------------------------------------ byte-level BPE

def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table.

    Byte-level BPE vocabularies are written in this alphabet so that every byte is a
    visible character: printable Latin-1 bytes stand for themselves and the other 68
    bytes (controls, space, soft hyphen...) are moved to U+0100 upward, in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in byte_to_unicode().items()}


def byte_level_bytes(token: str) -> bytes:
    """The bytes a byte-level vocabulary entry stands for. A character outside the
    table (only in malformed vocabularies) contributes its own UTF-8 so nothing is
    silently lost."""
    out = bytearray()
    for ch in token:
        b = _UNICODE_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


# ``str.translate`` table for whole vocabularies: each byte-level character -> the
# byte it stands for, as a Latin-1 character; any other character below U+0100 -> its
# UTF-8 bytes as Latin-1 characters (what byte_level_bytes gives it).
_BYTE_LEVEL_TRANSLATE: dict[int, str] = {
    **{cp: chr(cp).encode("utf-8").decode("latin-1") for cp in range(256)},
    **{ord(c): chr(b) for c, b in _UNICODE_TO_BYTE.items()},
}


def byte_level_pieces(tokens: Sequence[str], byte_level: Sequence[bool]) -> list[bytes]:
    """``byte_level_bytes`` of each token where ``byte_level``, else its UTF-8: the
    byte-level ones in one ``translate`` of them all (~0.6x the time of a call per
    token), or one by one when a character expands or is outside the table."""
    chosen = [t for t, b in zip(tokens, byte_level) if b]
    joined = "".join(chosen)
    try:
        data = joined.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1")
    except UnicodeEncodeError:  # a character outside the table (malformed vocabulary)
        data = b""
    if len(data) != len(joined):  # ... or one that expands: per token, below
        return [byte_level_bytes(t) if b else t.encode("utf-8") for t, b in zip(tokens, byte_level)]
    slices = (data[i:j] for i, j in pairwise(accumulate(map(len, chosen), initial=0)))
    return [next(slices) if b else t.encode("utf-8") for t, b in zip(tokens, byte_level)]


def byte_token_value(token: str) -> int | None:
    """``"<0x0A>"`` -> 10; anything else -> None (SentencePiece byte-fallback tokens)."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


# ------------------------------------------------------------------ metadata reading


class Packed:
    """Byte strings stored end to end: item ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

    A vocabulary's tokens and byte pieces stay resident for as long as the tokenizer
    (all through generation): 49k entries are ~0.8 MB here and ~4 MB as a list of
    small objects, and the garbage collector has nothing to walk.
    """

    __slots__ = ("data", "offsets")

    def __init__(self, items: Iterable[bytes]) -> None:
        parts = list(items)
        offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum(list(map(len, parts)), out=offsets[1:])
        self.data = b"".join(parts)
        # uint32 halves the offsets; a >= 4 GiB vocabulary keeps int64
        self.offsets = offsets.astype(np.uint32) if offsets[-1] < 2**32 else offsets

    @classmethod
    def of_texts(cls, texts: Iterable[str]) -> Packed:
        return cls(map(str.encode, texts))  # UTF-8, strict

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes:
        """Item ``i`` (``0 <= i < len``: callers check ids)."""
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def text(self, i: int) -> str:
        return self[i].decode("utf-8")

    def texts(self) -> list[str]:
        data = self.data
        return [data[a:b].decode("utf-8") for a, b in pairwise(self.offsets.tolist())]


def meta_get(metadata: Mapping[str, Any], key: str) -> Any:
    """``metadata.get(key)``; a GGUF file's large arrays are read without being kept in
    its metadata, where they would stay resident while the model runs."""
    if isinstance(metadata, GGUFMetadata):
        return metadata.peek(key)
    return metadata.get(key)


def meta_str(value: Any) -> str:
    """Readers may hand strings back as ``bytes``; GGUF strings are UTF-8."""
    if type(value) is str:  # the usual case, first: vocabularies call this 100k times
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def bad_field(metadata: Mapping[str, Any], key: str, value: Any, why: str) -> FormatError:
    return FormatError(getattr(metadata, "_path", "<metadata>"), key, None, why, value=value)


def meta_list(metadata: Mapping[str, Any], key: str, item: type | tuple[type, ...]) -> list[Any] | None:
    """An optional array whose items are all of type ``item`` (bools are not numbers)."""
    value = meta_get(metadata, key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_field(metadata, key, value, f"must be an array, not {type(value).__name__}")
    if not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
        bad = next(v for v in value if not isinstance(v, item) or isinstance(v, bool))
        raise bad_field(metadata, key, bad, f"holds a {type(bad).__name__} among its items")
    return value


def meta_text(metadata: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = metadata.get(key, default)
    if value is not None and not isinstance(value, str):
        raise bad_field(metadata, key, value, f"must be a string, not {type(value).__name__}")
    return value


def meta_int(metadata: Mapping[str, Any], key: str) -> int | None:
    """An optional token id; absent and "no token" sentinels both read as None."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise bad_field(metadata, key, value, f"a token id must be an integer, not {type(value).__name__}")
    value = int(value)
    # Some converters write -1 (or 0xFFFFFFFF) for "no such token".
    return None if value < 0 or value == 0xFFFFFFFF else value


def meta_bool(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    """An optional flag; converters omit flags whose value is the loader's default."""
    value = metadata.get(key)
    if value is None:
        return default
    if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
        raise bad_field(metadata, key, value, "must be true or false")
    return bool(value)


@dataclass(frozen=True)
class Specials:
    """Ids with a role. ``eos_ids`` is every id that should stop generation."""

    bos_id: int | None
    eos_id: int | None
    eos_ids: frozenset[int]
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
