"""The quantized matmul as a library per type, which generated modules link against.

The quantized matmul's headers (``headers.QUANT_HEADERS``) instantiated for a type
(``BRAZE_QLINEAR``) are the same C in every plan of every model, and they are most of
the compile time of a module that calls them: a cold
SmolLM2 prompt's unit of light kernels took ~2.1 s of gcc at -O3, ~1.7 s of it the Q4_1
and Q8_0 matmuls (measured by removing them; bench/RESULTS.md, sixth session). So each
type is compiled once per machine (``runtime/qlib.py``: by ``make install``, or by the
first process that needs it), into a shared library that exports the type's functions
under names carrying a hash of the library's source (``tag``); a generated module holds
only the declarations (``declarations``), ``#define``d to those names, and is loaded
after the libraries it calls (global symbols). The source hash in every name means a
module never binds to a library built from other C: a changed quant header is another
tag, another library, another module text.

The library's functions are the headers' own, compiled with the same flags: a kernel hands
its epilogue and prologue as function pointers and receives its sums through memory, as
it did when they were in one translation unit, so the results are the same bits.
"""

from __future__ import annotations

import functools
import re

from ..runtime.cpu import sha256
from .headers import header, quant_source
from .quant import MODE, QTYPES, QUANTIZED

_CALL = re.compile(r"\bbraze_(?:qlinear|rowf|row)_(\w+)\b")

# The functions a library exports: (name, parameters, arguments), spelled once here for
# the declarations and the wrappers; a parameter list that disagrees with the headers'
# definitions is a compile error of the library (its wrapper calls them).
_QLINEAR = ("int64_t m, int64_t n, int64_t k, const float *x, int64_t lda, const uint8_t *const *w, int nw, "
            "int64_t ldw, braze_qep_fn ep, braze_qpro_fn pro, void **args, int64_t nthreads",
            "m, n, k, x, lda, w, nw, ldw, ep, pro, args, nthreads")
_ROW = ("const uint8_t *w, int64_t k, float *out", "w, k, out")
_QROWS_SIG = ("int64_t n, const void *ids, int ids64, const uint8_t *w, int64_t ldw, int64_t rows, int64_t k, "
              "float *out, braze_rowf_fn rowf", "n, ids, ids64, w, ldw, rows, k, out, rowf")
# quant.h's function types, repeated for modules that do not include it (in the library,
# after the headers, a redefinition that differs is a compile error)
_TYPES = """#include <stdint.h>
typedef void (*braze_rowf_fn)(const uint8_t *w, int64_t k, float *out);
typedef void (*braze_qep_fn)(void **args, int64_t r0, int64_t nr, int64_t j0, int64_t nj, float *const *acc,
                             int64_t ldc);
typedef void (*braze_qpro_fn)(void **args, int64_t r, float *row);
"""


def _functions(qtype: str) -> list[tuple[str, str, str]]:
    t = qtype.lower()
    row = f"braze_rowf_{t}" if qtype in QUANTIZED else f"braze_row_{t}"
    return [(f"braze_qlinear_{t}", *_QLINEAR), (row, *_ROW), ("braze_qrows", *_QROWS_SIG)]


def _body(qtype: str) -> str:
    """What the library compiles before its exported wrappers: tile.h, the quantized
    matmul's headers and the type's instantiation (in the mode codegen/quant.py picks)."""
    return "\n".join([header("tile.h"), quant_source(), QTYPES[qtype].format(mode=MODE.get(qtype, 0))])


@functools.cache
def tag(qtype: str) -> str:
    """The library's name in its symbols: a hash of the C it compiles."""
    return str(sha256(_body(qtype).encode()).hexdigest()[:16])


def exported(qtype: str) -> list[str]:
    """The symbols the library of ``qtype`` exports."""
    return [f"{name}_{tag(qtype)}" for name, _, _ in _functions(qtype)]


def library_source(qtype: str) -> str:
    """The library's C: the quant headers for ``qtype``, and each function under its exported name."""
    lines = [_body(qtype), _TYPES]
    for (name, params, args), sym in zip(_functions(qtype), exported(qtype)):
        lines.append(f"void {sym}({params});\nvoid {sym}({params}) {{ {name}({args}); }}")
    return "\n".join(lines) + "\n"


def used(kernel_sources: list[str]) -> list[str]:
    """The quant types (QTYPES' names) whose functions the kernels call, in table order."""
    called = {m for src in kernel_sources for m in _CALL.findall(src)}
    return [q for q in QTYPES if q.lower() in called]


def declarations(kernel_sources: list[str]) -> str:
    """The C a module needs to call the libraries of the types its kernels use: the
    function types, and each function declared under its library's name and ``#define``d
    to it ("" when no kernel calls one)."""
    types = used(kernel_sources)
    if not types:
        return ""
    lines = [_TYPES]
    done: set[str] = set()
    for q in types:
        for (name, params, _), sym in zip(_functions(q), exported(q)):
            if name in done:  # braze_qrows: every library has one; the first type's serves
                continue
            done.add(name)
            lines.append(f"void {sym}({params});\n#define {name} {sym}")
    return "\n".join(lines)


def libraries(sources: list[str]) -> list[str]:
    """The quant types whose libraries the given module sources link against."""
    return [q for q in QTYPES if any(f"_{tag(q)}" in src for src in sources)]
