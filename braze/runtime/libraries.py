"""Machine-wide libraries: C every plan links against, compiled once per machine.

Today these are the quantized matmul's libraries, one per quant type
(``codegen/qlib.py``); ``main`` also builds jit's C lane (``runtime/lane.py``). They live in ``cpu.runtime_dir()``, not in the kernel cache, under
the same key as any cached object (source, compiler, flags, CPU, braze version). ``make
install`` builds every type's (``python -m braze.runtime.libraries``, the types in
parallel); a process that needs one that is missing (a machine that skipped the install
step, or a new compiler) builds it in the foreground, in parallel with its own compile
units (``units.compile_units``), before it loads them.

A module that calls a library has undefined symbols that name it; it is loaded after the
library, which is loaded with global symbols, so the dynamic loader binds them.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from ..codegen import qlib
from ..errors import CompileError
from . import cpu, lane
from .threads import _allowed_cpus

__all__ = ["needed", "sources", "load", "build_all", "main"]

_loaded: set[str] = set()


def needed(module_sources: Sequence[str]) -> list[str]:
    """The quant types whose libraries these modules link against."""
    return qlib.libraries(list(module_sources))


def sources(qtypes: Sequence[str]) -> list[str]:
    """The libraries' C, for ``cpu.build``/``cpu.compile_c`` with ``directory=cpu.runtime_dir()``."""
    return [qlib.library_source(q) for q in qtypes]


def load(qtypes: Sequence[str]) -> None:
    """Load (building any missing) the libraries of ``qtypes`` with global symbols, so
    that modules loaded after them bind to them."""
    for q in qtypes:
        if q in _loaded:
            continue
        lib = cpu.compile_c(qlib.library_source(q), [], directory=cpu.runtime_dir(), shared=True)
        missing = [s for s in qlib.exported(q) if not hasattr(lib.cdll, s)]
        if missing:
            raise CompileError(f"the {q} library {lib.path} does not export {', '.join(missing)}")
        _loaded.add(q)


def build_all(jobs: int) -> list[str]:
    """Build every type's library not built yet, ``jobs`` compilers at once; the types built."""
    directory = cpu.runtime_dir()
    todo = [q for q in qlib.QTYPES if not cpu.is_cached(qlib.library_source(q), [], directory=directory)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for f in [pool.submit(cpu.build, qlib.library_source(q), [], directory=directory) for q in todo]:
            f.result()
    return todo


def main() -> None:
    """``make install``'s step (``python -c "from braze.runtime.libraries import main; main()"``:
    ``-m`` would run this module a second time, the package having imported it)."""
    built = build_all(len(_allowed_cpus()))
    print(f"braze: machine-wide libraries in {cpu.runtime_dir()}: built {len(built)} "
          f"({', '.join(built) or 'all were there'})", file=sys.stderr)
    lane.available()  # jit's C lane, a Python extension built the same way
