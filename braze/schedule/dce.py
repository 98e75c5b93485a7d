"""Dead code: nodes of a flush whose results nothing needs are not scheduled.

A result is needed when Python can still reach it (``live``) or a needed node reads
it; an in-place write is always needed (it changes a storage that outlives the
flush). Walking the nodes backwards finds every dead node at once, so a chain of
values that only feed each other dies whole. The common case is a multi-result idiom
whose other result is dropped: ``x.max(dim)[0]`` records the maximum and its argmax,
and without this the argmax would be folded too (once an extern step that split the
kernels around it; in an attention chain it still would: chains claim no arg fold).

The reference executor still runs every node (it is the truth, including for errors a
dead node would raise: an index out of range that the recording could not check).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .group import Key


def dead_nodes(nodes: Sequence[Any], key: Callable[[Any], Key], live: set[Key]) -> set[int]:
    """Indices of the nodes whose outputs are neither live nor read by a needed node."""
    needed = set(live)
    dead: set[int] = set()
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if not node.op.inplace and not any(key(o.storage) in needed for o in node.outputs):
            dead.add(i)
            continue
        needed.update(key(o.storage) for o in node.inputs)
        if node.op.inplace:
            needed.update(key(o.storage) for o in node.outputs)
    return dead
