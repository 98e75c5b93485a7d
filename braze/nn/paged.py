"""A paged KV cache (Kwon et al., vLLM's PagedAttention): keys and values of many
sequences in one pool of fixed-size blocks.

The pool of a layer is a (blocks * block_size, kv_heads, head_dim) tensor. Which
blocks a sequence owns is its row of a *block table*; where each new token goes is
its *slot* (block * block_size + offset). A step over B sequences of T new tokens
each is ordinary tensor code over four integer tensors that the caller writes in
place before each step (``PagedIndex``): the token positions (B, T), their slots
(B * T,), the block table (B, NB) and nothing else. So every step of the same sizes
records the same program, and a captured step replays it with new indices:

- the new keys and values are written into the pool by ``index_copy_`` at the slots
  (a scatter, bounds-checked in its kernel);
- the keys and values to attend over are read through the table,
  ``pool.view(blocks, bs, ...)[table]``, which the attention kernel reads as a
  gathered load (row = table[b, j // bs] * bs + j % bs), never a copy; a pool of a
  half type (``braze serve``'s is float16) is cast to the queries' dtype as it is
  gathered, and the kernel converts each row as it loads it;
- the mask lets query i of row b see key j where ``j <= pos[b, i]`` (and, with a
  sliding window, ``j > pos[b, i] - window``): keys past a sequence's length, and the
  padding of a short table row, are masked.

Positions that are padding (a batch or a chunk rounded up to a bucket) write to a
slot the allocator never hands out (``PagedIndex.TRASH``'s block) and read their own.
"""

from __future__ import annotations

import numpy as np

from ..creation import arange, from_numpy, zeros_untouched
from ..dtypes import DType, float32
from ..tensor import Tensor


class PagedIndex:
    """The integer inputs of one step shape (B sequences, T new tokens, NB table
    columns): numpy arrays the caller fills, and tensors over the same memory."""

    def __init__(self, batch: int, tokens: int, table_width: int) -> None:
        self.pos = np.zeros((batch, tokens), np.int64)
        self.slots = np.zeros(batch * tokens, np.int64)
        self.table = np.zeros((batch, table_width), np.int64)
        self.pos_t, self.slots_t, self.table_t = from_numpy(self.pos), from_numpy(self.slots), from_numpy(self.table)


class PagedKVCache:
    """One layer's view of the pool for a step: what ``Attention`` calls. ``positions``
    is the (B, T) tensor the rotary embedding gathers its angles at."""

    def __init__(self, k_pool: Tensor, v_pool: Tensor, block_size: int, index: PagedIndex) -> None:
        self.k_pool, self.v_pool, self.block_size, self.index = k_pool, v_pool, block_size, index

    @classmethod
    def pools(cls, blocks: int, block_size: int, kv_heads: int, head_dim: int,
              dtype: DType = float32) -> tuple[Tensor, Tensor]:
        """Zeroed key and value pools of ``blocks`` blocks. Their pages stay out of memory
        until a block in them is written (``zeros_untouched``): a server sized for its
        whole budget holds only what its sequences used (blocks are handed out lowest
        first, ``serve/blocks.py``), where a recorded fill made all of it resident."""
        shape = (blocks * block_size, kv_heads, head_dim)
        return zeros_untouched(*shape, dtype=dtype), zeros_untouched(*shape, dtype=dtype)

    @property
    def positions(self) -> Tensor:
        return self.index.pos_t

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new (B, KVH, T, D) keys and values at their slots; return every
        key and value the table reaches, (B, KVH, NB * block_size, D)."""
        b, h, t, d = k.shape
        for pool, new in ((self.k_pool, k), (self.v_pool, v)):
            pool.index_copy_(0, self.index.slots_t, new.transpose(1, 2).reshape(b * t, h, d).to(pool.dtype))
        return self._gather(self.k_pool, b, k.dtype), self._gather(self.v_pool, b, v.dtype)

    def _gather(self, pool: Tensor, b: int, dtype: DType) -> Tensor:
        """The table's blocks in ``dtype`` (the queries'): a half-type pool is cast as it
        is gathered, so the attention kernel reads it where it lies, converting each load."""
        n, h, d = pool.shape
        bs = self.block_size
        width = self.index.table.shape[1]
        rows = pool.view(n // bs, bs, h, d)[self.index.table_t].to(dtype)
        return rows.reshape(b, width * bs, h, d).transpose(1, 2)

    def update(self, k: Tensor, v: Tensor, window: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``append``, and the mask (B, 1, T, L): query i of row b sees key j where
        j <= pos[b, i] (and j > pos[b, i] - window)."""
        b, _, t, _ = k.shape
        keys, values = self.append(k, v)
        n = keys.shape[-2]
        j = arange(n).reshape(1, n)
        p = self.index.pos_t.reshape(b * t, 1)
        seen = j <= p
        if window is not None:
            seen = seen & (j > p - window)
        return keys, values, seen.reshape(b, 1, t, n)
