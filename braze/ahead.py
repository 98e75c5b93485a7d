"""Compiling a step's kernels ahead: while another step's kernels compile, and it runs.

A cold ``braze generate`` compiles twice, one after the other: the prompt's kernels,
then, once the prompt has run and its token is known, the decoding step's. Each step's
critical path is one attention chain kernel (~1.3 and ~0.85 s of gcc), while the
second core finishes the step's light kernels early and then waits. The decoding step's
program does not depend on the token (it is written into a tensor) nor on the position
(a value; at position 0 the form differs, so it is recorded at the prompt's length),
so it can be recorded before the prompt runs: ``compile_ahead`` records it,
schedules and renders it as its flush would (the schedule is stored, so the real flush
does not schedule again), starts its compile units in the background
(``units.ahead``), and then drops the recorded nodes without running them. The real
step's flush finds its units compiled, or waits on the ones still compiling (the cache's
file lock): nothing is compiled twice, and the kernels are the same ones.

The prompt is compiled ahead the same way, first (``generate.py``): recording it twice
costs a few tens of ms, and its compilers then run while the decoding step is recorded
and scheduled (~1 s of Python) instead of after; the compiles ahead queue first come
first served (``units.ahead``), so the step's take a core only as the prompt's finish.

Dropped nodes' results are poisoned (``Storage.error``): a tensor of the recording that
something kept raises on a read instead of reading garbage.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from . import plan
from .device import CPU
from .errors import BrazeError
from .runtime import units
from .stream import NodeQueue, fusion_enabled, stream_of


class Dropped(BrazeError):
    """A tensor recorded only to compile its kernels ahead was read (it never ran)."""


def compile_ahead(record: Callable[[], Any]) -> bool:
    """Record ``record()`` on an empty stream and start compiling the kernels its flush
    would compile, without running it; whether compiles were started. Anything that
    would make this unlike the real flush (fusion off, a flush inside ``record``, a
    plan already there) starts nothing. ``record``'s side effects on Python state are
    the caller's to undo."""
    if not fusion_enabled():
        return False
    stream = stream_of(CPU)
    stream.flush()
    queue = stream.nodes
    started = False
    try:
        out = record()  # kept alive while planning: the real flush sees the same live results
        if stream.nodes is queue and queue:
            modules, store = plan.modules_ahead(queue)
            started = bool(modules) and units.ahead(modules)
            store()  # beside the compiles just started
        del out
    except Exception as e:  # noqa: BLE001 - only a head start: the real step meets any error itself
        if os.environ.get("BRAZE_DEBUG", "0") not in ("", "0"):
            print(f"braze: compiling ahead failed: {type(e).__name__}: {e}", file=sys.stderr)
    finally:  # every node queued now is the recording's (after a flush inside it, its rest)
        _drop(stream.nodes)
        stream.nodes = NodeQueue()
    return started


def _drop(nodes: NodeQueue) -> None:
    """Forget recorded nodes that will never run: their results poisoned, in-place
    targets no longer waiting on the stream."""
    err = Dropped("recorded only to compile its kernels ahead, never computed", op="compile_ahead")
    for node in nodes:
        for out in node.outputs:
            st = out.storage
            if node.op.inplace:
                st.dirty = False
            elif st.producer is node:
                st.producer = None
                if st.array is None:
                    st.error = err
    nodes.clear()
    nodes.form = None
