"""argparse types for the ``braze`` command: each refuses a bad value with one line
(argparse prints it with the usage and exits 2), before any model is loaded."""

from __future__ import annotations

import argparse
import math
from typing import Callable

#: the most tokens a command may ask for: past any context a model file may declare
#: (``io.validate.MAX_COUNT``); the model's own context is checked once it is loaded
MAX_TOKENS = 1 << 24
KV_DTYPES = ("float16", "bfloat16", "float32")  # --kv-dtype's choices (generate.kv_cache_dtype)


def text(value: str) -> str:
    """A text argument that is valid Unicode: bytes that are not UTF-8 reach Python as
    lone surrogates (``surrogateescape``), which no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 (byte {e.start})") from None
    return value


def integer(lo: int, hi: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is not in [{lo}, {hi}]")
        return n
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def real(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        low_ok = x > lo if lo_open else x >= lo
        if not (math.isfinite(x) and low_ok and x <= hi):
            raise argparse.ArgumentTypeError(f"{value} is not a finite number in {'(' if lo_open else '['}{lo}, {hi}]")
        return x
    parse.__name__ = "number"
    return parse


positive = integer(1, MAX_TOKENS)
max_tokens = integer(1, MAX_TOKENS)
temperature = real(0.0, 1e6)
top_k = integer(0, MAX_TOKENS)
top_p = real(0.0, 1.0, lo_open=True)
repeat_penalty = real(0.0, 1e6, lo_open=True)
seed = integer(0, 2**63 - 1)
port = integer(0, 65535)
queue_limit = integer(1, 1 << 20)


def device(value: str) -> str:
    """A device a model can run on ("cpu", "cuda"): refused here, before the model is
    loaded, where braze does not know it or it cannot run on this machine."""
    from .device import as_device
    from .errors import BrazeError
    try:
        return str(as_device(value, "--device"))
    except BrazeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def api_key(value: str) -> str:
    """An API key: printable ASCII without spaces (it travels in an HTTP header)."""
    if not value or not all(33 <= ord(c) <= 126 for c in value):
        raise argparse.ArgumentTypeError("an API key must be non-empty printable ASCII without spaces")
    return value
