"""The KV cache's block allocator: which blocks of the pool are free, shared or cached.

A sequence's keys and values live in fixed-size blocks (``nn.paged``); this module
only counts them. Blocks are reference-counted. A *full* block of a prompt is also
registered under the hash of every token up to its end (a chain: the block's tokens
and the hash of the block before), so a later prompt with the same prefix shares it
instead of computing it again (prefix caching, as vLLM's). A shared block is never
written: only full blocks are shared, and a sequence always computes at least its
last prompt token itself, which lands in a block of its own (so copy-on-write never
arises; a fork of a sequence would need it, and braze serves n=1). A cached block
whose last user is gone stays cached, least recently used first in line to be
reused when the free list is empty.

Block 0 is never handed out: it is where the padding of a batch writes (``TRASH``).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Sequence

TRASH = 0


def prefix_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of each full block of ``tokens``."""
    out: list[int] = []
    h = 0
    for i in range(len(tokens) // block_size):
        h = hash((h, tuple(tokens[i * block_size:(i + 1) * block_size])))
        out.append(h)
    return out


class BlockPool:
    def __init__(self, blocks: int, block_size: int) -> None:
        if blocks < 2:
            raise ValueError(f"BlockPool: {blocks} blocks; at least 2 (block 0 is the padding's)")
        self.blocks, self.block_size = blocks, block_size
        # free blocks as a heap, the lowest handed out first: the pool's pages become
        # resident only when written (``PagedKVCache.pools``), so reusing low blocks keeps
        # what is resident to the most blocks ever in use, where a queue cycled through
        # the whole pool (257 MiB for SmolLM2) within a few hundred requests
        self.free: list[int] = list(range(1, blocks))
        self.refs = [0] * blocks
        self.by_hash: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached, unused: reusable, oldest first

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.blocks - 1 - len(self.free) - len(self.idle)

    @property
    def available(self) -> int:
        return len(self.free) + len(self.idle)

    def allocate(self) -> int | None:
        """A block for one user, or None when every block is held."""
        if self.free:
            b = heapq.heappop(self.free)
        elif self.idle:
            b, _ = self.idle.popitem(last=False)
            del self.by_hash[self.hash_of.pop(b)]
        else:
            return None
        self.refs[b] = 1
        return b

    def lookup(self, h: int) -> int | None:
        """The cached block of prefix hash ``h``, now held once more; None on a miss."""
        b = self.by_hash.get(h)
        if b is None:
            return None
        self.idle.pop(b, None)
        self.refs[b] += 1
        return b

    def register(self, b: int, h: int) -> None:
        """Block ``b`` is full and holds the prefix of hash ``h``."""
        if h not in self.by_hash and b not in self.hash_of:
            self.by_hash[h], self.hash_of[b] = b, h

    def release(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.hash_of:
                    self.idle[b] = None
                else:
                    heapq.heappush(self.free, b)
