"""The jit fast lane's guard-and-run in C (``lane.c``), as a CPython extension.

A jitted call of a small shape that repeats its last direct replay costs its kernel
plus the Python that checks the call and runs the plan: ~9 us of Python around a 10-15
us kernel at (64, 256), ~5 us with this lane. ``lane.c`` does the same checks and the same run in C, from
data that ``jit._Fast`` builds once (what each argument must be, which attributes of
braze's own objects must still be what they were, the kernels' argument arrays), and
answers "not mine" for anything else, which then takes the Python way.

It is built once per machine, like the quantized matmul's libraries, into
``cpu.runtime_dir()`` (``make install`` builds it; a process that misses it builds it in
the foreground, ~1 s). Where it cannot be built (no C compiler, no Python headers) jit
keeps its Python lane, and says so once on stderr.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import CompileError
from . import cpu

__all__ = ["G_IS", "G_FALSY", "G_GT", "G_WEAK", "G_ITEM", "available", "build", "make"]

#: guard kinds (``lane.c``): getattr(obj, name) is want / is falsy / > want / is want()
#: (a weak reference) / [key] is want (a dict)
G_IS, G_FALSY, G_GT, G_WEAK, G_ITEM = range(5)

_SOURCE = Path(__file__).with_name("lane.c")
_INIT = "PyInit_braze_lane"
_lock = threading.Lock()
_module: ModuleType | None = None
_why_not: str | None = None


def _flags() -> tuple[str, ...]:
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").exists():
        raise CompileError(f"no Python headers (Python.h) in {include!r}")
    # the kernels' flags (the same compiler, -O3, -march=native), against this Python
    return (*cpu.FLAGS, f"-I{include}")


def build() -> cpu.CompiledLibrary:
    """The extension, built into ``cpu.runtime_dir()`` unless it is there (``make install``)."""
    return cpu.compile_c(_SOURCE.read_text(), [_INIT], _flags(), directory=cpu.runtime_dir())


def _load() -> ModuleType:
    lib = build()
    # the cache renames exported symbols <name>_<tag> (cpu.tagged_source): the module's
    # name carries the tag too, so that Python finds PyInit_<name>
    name = f"braze_lane_{cpu.symbol_tag(lib.key)}"
    loader = importlib.machinery.ExtensionFileLoader(name, str(lib.path))
    spec = importlib.util.spec_from_file_location(name, lib.path, loader=loader)
    if spec is None:
        raise CompileError(f"cannot load {lib.path} as a Python extension")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def available() -> bool:
    """Is the C lane here (built, or built now)? Once per process it is tried; a failure
    is said once on stderr, and jit keeps its Python lane."""
    global _module, _why_not
    if _module is not None or _why_not is not None:
        return _module is not None
    with _lock:
        if _module is None and _why_not is None:
            try:
                _module = _load()
            except (CompileError, OSError, ImportError) as err:
                _why_not = str(err).splitlines()[0] if str(err) else type(err).__name__
                print(f"braze: jit's C lane is unavailable ({_why_not}); direct replays run their Python lane "
                      "(~4 us more a call)", file=sys.stderr, flush=True)
    return _module is not None


def make(spec: tuple[Any, ...]) -> Any:
    """A ``Lane`` over ``spec`` (``lane.c``'s ``lane_init`` lists its fields): called with
    a call's argument tuple, it returns the result, or ``spec[0]`` (the miss sentinel)."""
    if not available():
        raise CompileError(f"jit's C lane is unavailable: {_why_not}")
    assert _module is not None
    return _module.Lane(spec)
