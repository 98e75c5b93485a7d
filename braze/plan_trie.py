"""The trie of stored plans, and the relative form of a stream that walks it.

A stream's nodes are kept in a *relative form* as they are recorded (``Form``, one
entry per node: storages numbered by first appearance, a placeholder for the offset of
a storage that exists before the flush), and a cursor walks the trie as the form
grows: every trie node is one entry further into some stream braze has planned, and
the node where a planned stream ended holds its plans keyed by liveness. ``plan.py``
stores, finds and evicts plans through this module; here is only the structure.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any, Sequence


def _attrs_key(attrs: dict[str, Any]) -> tuple[Any, ...]:
    """Attributes as a key: floats by their bits (-0.0 is not 0.0, and a nan is a nan)."""
    return tuple(sorted((k, v.hex() if isinstance(v, float) else v) for k, v in attrs.items()))


class TrieNode:
    """One position in the trie: the entries on the way here are a prefix of a stream
    braze has planned. Where a planned stream ended, its plans, keyed by liveness."""

    __slots__ = ("children", "plans", "dead")

    def __init__(self) -> None:
        self.children: dict[tuple[Any, ...], TrieNode] = {}
        #: None on the way (most nodes: a stream of 1000 ops makes 1000 of them)
        self.plans: dict[frozenset[int], Any] | None = None
        #: cut from the trie by an eviction: a form whose path runs through it walks anew
        self.dead = False


@dataclass(frozen=True)
class FormCopy:
    """A Form's state, storages as indices into a pool (``Form.copy_of``)."""

    root: TrieNode
    order: tuple[int, ...]  # pool index of each rel id
    entries: tuple[tuple[Any, ...], ...]
    refs: tuple[int, ...]
    produced: tuple[int, ...]
    marks: tuple[int, ...]
    path: tuple[TrieNode | None, ...]
    offs: tuple[tuple[tuple[int, int], int], ...]
    off_keys: tuple[tuple[int, int], ...]
    off_marks: tuple[int, ...]


root = TrieNode()  # replaced by ``reset`` (``plan.clear``); a Form started on an older root walks anew


class Form:
    """The relative form of the nodes a stream has recorded, kept as they are recorded.

    Per node: one entry ``(op name, attrs key, inputs, outputs)``, where an input is
    ``(rel id, shape, strides, offset, dtype name, pending)`` and an output the same
    without ``pending``; rel ids number storages by first appearance. The offset of a
    storage that exists before the flush is a placeholder, ``("offset", class)``, where
    operands of one storage at one offset share a class: a slice bound into such a
    tensor is given to kernels at run time, so ``x[i]`` for every i is one plan. The cursor
    (``path[-1]``) is the trie node this prefix of the stream leads to, or None once it
    fell off (a program never planned). Layouts go in as tuples of ints: hashing them
    stays in C, which keeps recording cheap.

    While the cursor is on the trie each node is numbered and its entry built as it is
    recorded: the entry is what takes the next step. Once the cursor fell off, nothing
    recorded can lead back to a stored plan, so recording does no more work for the
    plan cache and ``complete`` numbers the rest at the flush, which is a miss anyway
    (it schedules and compiles, or runs the reference executor): a program braze has not
    seen pays per op what it did before, a repeated one finds its plan with nothing left
    for the flush to hash. Everything is kept per node (``marks``, ``path``, the
    entries' rel ids), so ``truncate``, which ``Stream.atomic`` calls when a composite
    call fails half-way, restores exactly the state before the nodes it takes back.
    """

    __slots__ = ("root", "head", "entries", "storages", "key_of", "refs", "produced", "marks", "path", "offs",
                 "off_keys", "off_marks")

    def __init__(self, head: tuple[Any, ...] = ()) -> None:
        self.root = root
        #: entries before the nodes': another device's programs walk their own branch of
        #: the trie (``runtime/cuda.py`` stores its plans under ``("device", "cuda")``)
        self.head = head
        self.entries: list[tuple[Any, ...]] = []  # numbered nodes, in order
        self.storages: list[Any] = []  # by rel id
        self.key_of: dict[int, int] = {}  # id(storage) -> rel id
        self.refs: list[int] = []  # operand references to each storage from the nodes
        self.produced: list[int] = []  # rel ids written by pure nodes, ascending
        self.marks: list[int] = []  # storages known before node i
        self.path: list[TrieNode | None] = [_branch(head)]  # trie node after i nodes, up to the first None
        # Offsets into tensors that exist before the flush are placeholders, numbered by
        # first appearance of each (storage, offset): the form keeps which operands share
        # an offset (a kernel reads them through one argument), not the offset itself.
        self.offs: dict[tuple[int, int], int] = {}
        self.off_keys: list[tuple[int, int]] = []
        self.off_marks: list[int] = []  # offset classes known before node i

    @classmethod
    def of(cls, nodes: Sequence[Any], head: tuple[Any, ...] = ()) -> Form:
        """The form of nodes recorded while no form was kept (fusion was off then)."""
        form = cls(head)
        for node in nodes:
            form.add(node)
        form.complete(nodes)
        return form

    def add(self, node: Any) -> None:
        """Record ``node``: one step down the trie, or nothing once off it."""
        path = self.path
        cur = path[-1]
        if cur is None:
            return
        entry = self._number(node)
        try:
            path.append(cur.children.get(entry))
        except TypeError:  # an attribute braze cannot hash: never stored, never found
            path.append(None)

    def _number(self, node: Any) -> tuple[Any, ...]:
        """Number the node's storages, count its operands, append and return its entry.
        A storage pending or realised when its node is recorded still is at the flush
        (nothing runs in between), so numbering now or then gives the same entry."""
        self.marks.append(len(self.storages))
        self.off_marks.append(len(self.off_keys))
        ins = []
        for o in node.inputs:
            k, _ = self._rel(o.storage)
            lay, pending = o.layout, o.storage.array is None
            # The offset of a tensor that exists before the flush (a slice bound) is a
            # placeholder: kernels get it at run time (``KernelStep.refs``).
            ins.append((k, lay.shape, lay.strides, lay.offset if pending else self._offset(k, lay.offset),
                        o.storage.dtype.name, pending))
        outs = []
        pure = not node.op.inplace
        for o in node.outputs:
            k, new = self._rel(o.storage)
            if new and pure:
                self.produced.append(k)
            lay = o.layout
            outs.append((k, lay.shape, lay.strides,
                         lay.offset if o.storage.array is None else self._offset(k, lay.offset), o.storage.dtype.name))
        attrs = node.attrs
        entry = (node.op.name, _attrs_key(attrs) if attrs else (), tuple(ins), tuple(outs))
        self.entries.append(entry)
        return entry

    def _rel(self, st: Any) -> tuple[int, bool]:
        """The relative id of a storage (numbered at its first appearance, then True)
        and one more operand reference to it."""
        k = self.key_of.get(id(st))
        if k is None:
            k = self.key_of[id(st)] = len(self.storages)
            self.storages.append(st)
            self.refs.append(1)
            return k, True
        self.refs[k] += 1
        return k, False

    def _offset(self, k: int, offset: int) -> tuple[str, int]:
        c = self.offs.get((k, offset))
        if c is None:
            c = self.offs[(k, offset)] = len(self.off_keys)
            self.off_keys.append((k, offset))
        return ("offset", c)

    def complete(self, nodes: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Every node's entry, numbering those recorded after the cursor fell off."""
        if len(self.entries) < len(nodes):
            for node in itertools.islice(nodes, len(self.entries), None):
                self._number(node)
        return self.entries

    def truncate(self, n: int) -> None:
        """Forget every node from the ``n``-th on, as if it had never been recorded."""
        if n >= len(self.entries):
            return  # only nodes recorded off the trie, which left no trace
        mark = self.marks[n]
        refs = self.refs
        for entry in self.entries[n:]:
            for spec in entry[2]:
                refs[spec[0]] -= 1
            for spec in entry[3]:
                refs[spec[0]] -= 1
        for st in self.storages[mark:]:
            del self.key_of[id(st)]
        del self.storages[mark:], refs[mark:], self.entries[n:], self.marks[n:], self.path[n + 1:]
        om = self.off_marks[n]
        for ok in self.off_keys[om:]:
            del self.offs[ok]
        del self.off_keys[om:], self.off_marks[n:]
        produced = self.produced
        while produced and produced[-1] >= mark:
            produced.pop()

    def copy_of(self, pool: Sequence[Any]) -> FormCopy | None:
        """This form with its storages as indices into ``pool`` (``jit``: the form of a
        traced call recorded from an empty stream), or None while it is not numbered
        to the end (its cursor fell off the trie: no plan is stored for it yet)."""
        if (self.root is not root or len(self.path) != len(self.entries) + 1 or self.path[-1] is None
                or self.path[-1].dead):
            return None
        where = {id(st): i for i, st in enumerate(pool)}
        if len(where) != len(pool):  # one storage in two places: its form would not say which
            return None
        return FormCopy(self.root, tuple(where[id(st)] for st in self.storages), tuple(self.entries),
                        tuple(self.refs), tuple(self.produced), tuple(self.marks), tuple(self.path),
                        tuple(self.offs.items()), tuple(self.off_keys), tuple(self.off_marks))

    def restore(self, copy: FormCopy, pool: Sequence[Any]) -> bool:
        """Become ``copy`` over ``pool``'s storages, as if its nodes had been recorded
        into this (fresh) form one by one; False if the trie was replaced since."""
        last = copy.path[-1]
        if copy.root is not self.root or last is None or last.dead:
            return False
        self.storages = [pool[i] for i in copy.order]
        self.key_of = {id(st): k for k, st in enumerate(self.storages)}
        self.entries, self.refs, self.produced = list(copy.entries), list(copy.refs), list(copy.produced)
        self.marks, self.path = list(copy.marks), list(copy.path)
        self.offs, self.off_keys, self.off_marks = dict(copy.offs), list(copy.off_keys), list(copy.off_marks)
        return True

    def cursor(self) -> TrieNode | None:
        """The trie node of the whole stream, or None for a program not planned yet."""
        if self.root is root and (self.path[-1] is None or not self.path[-1].dead):
            return self.path[-1]
        # the trie was replaced (``clear``) or this path cut (an eviction) since this stream began: walk it
        node = root
        for entry in (*self.head, *self.entries):
            child = node.children.get(entry)
            if child is None:
                return None
            node = child
        return node

    def live(self) -> frozenset[int]:
        # While counting, a storage is referenced by the list and by getrefcount's
        # argument; anything beyond those and the stream's operands is a user's tensor
        # (or a harmless extra reference, which only makes braze store a value it could
        # have skipped).
        storages, refs = self.storages, self.refs
        live = set()
        for k in self.produced:
            if sys.getrefcount(storages[k]) > 2 + refs[k]:
                live.add(k)
        return frozenset(live)


def _branch(head: Sequence[tuple[Any, ...]]) -> TrieNode:
    """The trie node the entries ``head`` lead to from the root, made where missing: where
    a form whose nodes follow ``head`` starts, or where a plan is stored."""
    node = root
    for entry in head:
        child = node.children.get(entry)
        if child is None:
            child = node.children[entry] = TrieNode()
        node = child
    return node


def insert(entries: Sequence[tuple[Any, ...]], live: frozenset[int], plan: Any) -> None:
    """Store ``plan`` for the stream of these entries (a form's ``head`` first) and liveness."""
    node = _branch(entries)
    if node.plans is None:
        node.plans = {}
    node.plans[live] = plan


def forget(head: tuple[Any, ...]) -> None:
    """Drop the branch of the trie under ``head`` (another device's plans; tests)."""
    if not head:
        return
    parent: TrieNode | None = _branch(head[:-1])
    node = parent.children.pop(head[-1], None) if parent is not None else None
    if node is not None:
        todo = [node]
        while todo:  # a form or a jit copy holding one of these walks anew
            n = todo.pop()
            n.dead = True
            todo.extend(n.children.values())


def reset() -> None:
    """A new, empty trie (``plan.clear``): forms started on the old one walk anew."""
    global root
    root = TrieNode()
