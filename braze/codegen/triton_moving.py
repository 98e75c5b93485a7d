"""A rendered kernel whose moving pointers take their offsets from a device buffer.

A captured decoding step (``runtime/cuda_replay.py``) launches the same kernels with
the same argument values at every position, so that one CUDA graph replays them all:
an operand whose offset moves with the position (the KV cache's write row, the rotary
table's) is passed at its storage's start, and the kernel adds its offset, read from
the step's moving buffer, on entry. ``moving(r, positions)`` is any rendered kernel
(element, chain, GEMM, quantized: all are ``@triton.jit`` functions whose buffers come
first, constexprs last) with one more pointer parameter, ``braze_mv``, after its
buffers; parameter ``positions[i]`` adds ``braze_mv[i]`` (elements of its own type; a
block-quantized buffer's, bytes). The launch passes ``braze_mv`` at the kernel's first
slot, so a model's identical layers still share one source.
"""

from __future__ import annotations

import ast

from .triton import NotRendered, Rendered

PARAM = "braze_mv"


def moving(r: Rendered, positions: tuple[int, ...]) -> Rendered:
    """``r`` with its parameters at ``positions`` (indices among its buffers) offset on
    entry by the moving buffer's slots, in order; the buffer is the last buffer."""
    tree = ast.parse(r.source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == r.name), None)
    if fn is None:
        raise NotRendered(f"a kernel whose function {r.name} is not found in its source")
    params = fn.args.args
    buffers = [p for p in params if not (isinstance(p.annotation, ast.Attribute) and p.annotation.attr == "constexpr")]
    if params[:len(buffers)] != buffers or any(not 0 <= i < len(buffers) for i in positions) or not buffers:
        raise NotRendered("a kernel whose buffers do not come first")
    lines = r.source.split("\n")
    last = buffers[-1]
    assert last.end_lineno is not None and last.end_col_offset is not None
    row = last.end_lineno - 1
    lines[row] = lines[row][:last.end_col_offset] + f", {PARAM}" + lines[row][last.end_col_offset:]
    body = fn.body[0]
    if body.lineno <= last.end_lineno:
        raise NotRendered("a kernel whose body starts on its def line")
    pad = " " * body.col_offset
    entry = [f"{pad}{buffers[i].arg} = {buffers[i].arg} + tl.load({PARAM} + {slot})" for slot, i in enumerate(positions)]
    at = body.lineno - 1
    return Rendered("\n".join(lines[:at] + entry + lines[at:]), r.name, r.grid, r.meta)
