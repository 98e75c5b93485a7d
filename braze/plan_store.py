"""Stored plans as checksummed JSON: reading one executes no code.

A stored plan (its schedule, arena, and rendered C) was a pickle: a file in the cache
directory that anyone able to write there could turn into code execution on load, and
whose one flipped byte (``+`` to ``;`` in the C) ran silently wrong kernels. Now:

- the file is a header line ``{"format": ..., "version": ..., "sha256": ...}`` and a
  JSON body whose bytes that sha256 covers: any changed byte is a rebuild;
- the body is plain data: lists, numbers, strings, and tagged objects of an allowlist
  (the IR's dataclasses, the schedule's steps, braze dtypes), rebuilt field by field;
- the body names the plan (the file's own name) and the sha256 of each C module it
  renders: a plan moved to another name, or whose C does not hash to what it records,
  is rebuilt.

``load`` returns None for anything that is not exactly right; the caller rebuilds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from . import dtypes, ir
from .runtime import cpu
from .schedule.group import ExternStep, KernelStep

FORMAT = "braze-plan"
VERSION = 8  # 8: JSON with a checksum (7 and before were pickles)

_CLASSES: dict[str, type] = {c.__name__: c for c in (
    ir.Affine, ir.Load, ir.Const, ir.Coord, ir.Acc, ir.Op, ir.Dot, ir.Var, ir.Reduce, ir.Contract, ir.Store,
    ir.StoreRow, ir.Scan, ir.Kernel, ir.QLinear, ir.QRows, ir.TopK, KernelStep, ExternStep)}


class _Bad(Exception):
    """The body is not a plan this braze wrote."""


class _Encoder:
    """Plain data for a plan. Immutable IR nodes (frozen dataclasses) go once into a
    table and are referred to by index: every layer of a model shares its kernels'
    nodes, and a plan written out as a tree was 2-3x larger and 10x slower to read."""

    def __init__(self) -> None:
        self.table: list[Any] = []
        self._index: dict[str, int] = {}
        self._by_id: dict[int, int] = {}
        self._keep: list[Any] = []  # the ids above stay valid while we encode

    def enc(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, ir.Size):
            return {"size": [int(x), x.expr]}
        if isinstance(x, (int, np.integer)):
            return int(x)
        if isinstance(x, (float, np.floating)):
            return float(x) if math.isfinite(x) else {"float": repr(float(x))}
        if isinstance(x, list):
            return [self.enc(v) for v in x]
        if isinstance(x, tuple):
            return {"tuple": [self.enc(v) for v in x]}
        if isinstance(x, (set, frozenset)):
            return {"frozenset" if isinstance(x, frozenset) else "set": [self.enc(v) for v in sorted(x, key=repr)]}
        if isinstance(x, dict):
            return {"dict": [[self.enc(k), self.enc(v)] for k, v in x.items()]}
        if isinstance(x, dtypes.DType):
            return {"dtype": [x.name, list(x.block) if x.block else None]}
        if isinstance(x, np.dtype):
            return {"npdtype": x.str}
        name = type(x).__name__
        if _CLASSES.get(name) is not type(x):
            raise TypeError(f"a plan cannot store a {type(x).__qualname__}")
        fields = dataclasses.fields(x)  # type: ignore[arg-type]  # an allowlisted dataclass
        if not type(x).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            return {"class": name, "fields": {f.name: self.enc(getattr(x, f.name)) for f in fields}}
        i = self._by_id.get(id(x))
        if i is None:
            node = {"class": name, "fields": {f.name: self.enc(getattr(x, f.name)) for f in fields}}
            text = json.dumps(node, sort_keys=True, allow_nan=False)
            i = self._index.get(text)
            if i is None:
                i = self._index[text] = len(self.table)
                self.table.append(node)
            self._by_id[id(x)] = i
            self._keep.append(x)
        return {"ref": i}


class _Decoder:
    def __init__(self, table: Any) -> None:
        self.objects: list[Any] = []
        for node in _list(table):  # a node refers only to nodes before it: no cycles
            self.objects.append(self.dec(node))

    def dec(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.dec(v) for v in x]
        if not isinstance(x, dict) or len(x) not in (1, 2):
            raise _Bad(f"unexpected {type(x).__name__}")
        tag, value = next(iter(x.items()))
        if tag == "ref":
            if not (type(value) is int and 0 <= value < len(self.objects)):
                raise _Bad(f"bad reference {value!r}")
            return self.objects[value]
        if tag == "tuple":
            return tuple(self.dec(v) for v in _list(value))
        if tag == "set":
            return {self.dec(v) for v in _list(value)}
        if tag == "frozenset":
            return frozenset(self.dec(v) for v in _list(value))
        if tag == "dict":
            return {self.dec(k): self.dec(v) for k, v in (_pair(p) for p in _list(value))}
        if tag == "float" and value in ("nan", "inf", "-inf"):
            return float(value)
        if tag == "size":
            n, expr = _pair(value)
            if not (isinstance(n, int) and isinstance(expr, str)):
                raise _Bad("bad size")
            return ir.Size(n, expr)
        if tag == "npdtype" and isinstance(value, str):
            return np.dtype(value)
        if tag == "dtype":
            name, block = _pair(value)
            if not isinstance(name, str):
                raise _Bad("bad dtype")
            # braze compares dtypes by identity: decode to the one object of that name
            return dtypes.block_dtype(name, *_pair(block)) if block is not None else dtypes.as_dtype(name)
        if tag == "class":
            cls = _CLASSES.get(value)
            fields = x.get("fields")
            if cls is None or not isinstance(fields, dict):
                raise _Bad(f"class {value!r} is not one a plan holds")
            names = {f.name for f in dataclasses.fields(cls)}
            if set(fields) - names:
                raise _Bad(f"{value} has no fields {sorted(set(fields) - names)}")
            return cls(**{k: self.dec(v) for k, v in fields.items()})
        raise _Bad(f"unknown tag {tag!r}")


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _Bad("expected a list")
    return value


def _pair(value: Any) -> tuple[Any, Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise _Bad("expected a pair")
    return value[0], value[1]


def _digest(data: bytes) -> str:
    return str(cpu.sha256(data).hexdigest())


def source_digest(source: str) -> str:
    return _digest(source.encode())


def dumps(name: str, stored: tuple[Any, ...]) -> bytes:
    """The bytes of a stored plan named ``name``; ``stored[-1]`` is its rendered C."""
    modules = stored[-1][0]
    encoder = _Encoder()
    plan = encoder.enc(stored)
    body = json.dumps({"name": name, "table": encoder.table, "plan": plan,
                       "sources": [source_digest(source) for source, _ in modules]},
                      allow_nan=False, separators=(",", ":")).encode()
    header = json.dumps({"format": FORMAT, "version": VERSION, "sha256": _digest(body)}).encode()
    return header + b"\n" + body


def loads(name: str, data: bytes) -> tuple[Any, ...] | None:
    """The stored plan in ``data`` if it is intact and is the plan ``name``; else None."""
    head, sep, body = data.partition(b"\n")
    try:
        header = json.loads(head)
        if not (sep and isinstance(header, dict) and header.get("format") == FORMAT
                and header.get("version") == VERSION and header.get("sha256") == _digest(body)):
            return None
        doc = json.loads(body)
        if not isinstance(doc, dict) or doc.get("name") != name:
            return None
        stored = _Decoder(doc.get("table")).dec(doc.get("plan"))
        if not (isinstance(stored, tuple) and len(stored) == 6):
            return None
        modules = stored[-1][0]
        if [source_digest(source) for source, _ in modules] != doc.get("sources"):
            return None  # its C is not the C it was stored with
        return stored
    except Exception:  # noqa: BLE001 - whatever a damaged body raises, the answer is: rebuild
        return None


def load(path: Path) -> tuple[Any, ...] | None:
    """A stored plan, or None if absent or not intact (then it is removed and rebuilt)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    stored = loads(path.stem, data)
    if stored is None:
        path.unlink(missing_ok=True)
    return stored


def save(path: Path, stored: tuple[Any, ...]) -> None:
    """Write atomically; a plan that cannot be stored (an unexpected object) is not."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(dumps(path.stem, stored))
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - storing is an optimisation: never fail a flush for it
        tmp.unlink(missing_ok=True)
