"""Runs the engine's sequences on the model: batched decoding steps and chunked
prefills over one paged KV cache.

Each turn, every sequence that has one token to feed (its last sampled token)
decodes in ONE step: a (B, 1) batch whose matmuls read each weight once for all B
rows, each row at its own position, attending over its own blocks (``nn.paged``). A
sequence with more than one token to feed (a new prompt, or one preempted and
resumed) feeds its tokens as more rows of those steps: in the step's padding rows
alone where that feeds it soon (one step a turn, the others' latency untouched), else
a few per turn (``turn_rows``), so a prompt that arrives delays the others by at most
about half a step. With no sequence decoding, a short prompt is fed as rows of a few
steps in one turn, a long one as a chunk of at most ``chunk`` tokens through the
prefill program.

Steps are padded to buckets (the batch to a power of two up to ``max_batch``, the
chunk to ``PREFILL_BUCKETS``, the block table to a power of two), so the programs
that run are few; each bucket's step is captured (``StepCapture(static=True)``) after
its first runs and then replays with one call into compiled code, the indices written
in place. Padding rows feed token 0 at position 0, write to the trash block and
read only it.

When the pool has no block for a sequence that must grow, the youngest other
sequence is preempted: its blocks are freed and it goes back to the queue, to
compute its tokens again when there is room (vLLM's recompute preemption).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from ..capture import StepCapture
from ..codegen.quant import FEW
from ..creation import from_numpy
from ..dtypes import DType
from ..generate import KV_DTYPE, PREFILL_BUCKETS, before_replay
from ..nn.paged import PagedIndex, PagedKVCache
from ..runtime.cpu_replay import SharedArena
from ..stream import fusion_enabled
from .blocks import TRASH, BlockPool, prefix_hashes


class Fed(Protocol):
    """What the runner reads and sets of a sequence (the engine's own record of it)."""

    history: list[int]  # prompt and generated tokens
    state: Any  # the runner's ``SeqState`` while admitted, else None
    logits: np.ndarray | None  # the next token's, once due


S = TypeVar("S", bound=Fed)

BLOCK_SIZE = 16
# Rows per decoding step: 8 (codegen/quant.py's FEW). The quantized matmul's strips
# read each weight once for every row, and from 8 rows on a row costs about the same
# (16 rows 1.6-2x 8: bench/RESULTS.md, twelfth session), so a bigger step saves nothing
# per row and makes each of its rows wait for all.
DECODE_ROWS = FEW
# A prompt fed beside decoding rows takes only the step's padding rows (free: the step
# costs the same) while that feeds all waiting prompt tokens within FREE_TURNS turns, else
# a second, smaller step per turn (1.6x a decoding turn) feeds it. 16 turns (a whole
# block's remainder at 7 decoders) kept that second step out of the 8-client ITL tail on
# the Intel Xeon; on the AMD EPYC, 4 turns gave the same ITL P99 (38.7 ms both, 20 s runs)
# at half the time to first token (P50 127-137 ms against 261-271, P99 222 against
# 430-495; bench/RESULTS.md, eleventh session).
FREE_TURNS = 4
# With nobody decoding, a prompt of at most ROW_STEPS steps' rows is fed as rows of
# decoding steps in one turn, a longer one as a prefill chunk. Chosen while prefill's
# GEMM dequantized every weight (~6x a step of 8 rows for 16 tokens). On the strips, at
# 1 thread, a step of 8 rows takes 25 ms and the prefill program 43 ms for 16 tokens,
# 60 for 32 (bench/RESULTS.md, twelfth session): about even for 9-16 tokens, the chunk
# up to 40 ms sooner for 17-32. Tried at 1 (before `warm` captured the chunks' buckets):
# no gain at 1 client in `braze bench serve`'s mix, whose prompts are mostly longer.
ROW_STEPS = 4
KV_BUDGET = 256 << 20  # the pool's default size in bytes (at least one full context; at most max_batch)


@dataclass
class SeqState:
    blocks: list[int]
    cached: int  # tokens whose keys and values are in the pool
    hashes: list[int]  # the prompt's full blocks' prefix hashes


@dataclass
class _Bucket:
    index: PagedIndex
    ids: np.ndarray
    ids_t: Any
    at: np.ndarray
    at_t: Any
    caches: list[PagedKVCache]
    capture: StepCapture | None


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class PagedRunner:
    def __init__(self, model: Any, context_length: int, max_batch: int, kv_tokens: int | None = None,
                 chunk: int = 256, capture: bool = True, turn_rows: int | None = None,
                 kv_dtype: DType = KV_DTYPE) -> None:
        c = model.config
        self.model, self.ctx, self.max_batch, self.capture = model, context_length, max_batch, capture
        self.chunk = max(b for b in PREFILL_BUCKETS if b <= max(chunk, PREFILL_BUCKETS[0]))
        per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * kv_dtype.itemsize  # keys and values
        tokens = kv_tokens or min(max_batch * context_length, max(context_length, KV_BUDGET // per_token))
        blocks = -(-tokens // BLOCK_SIZE) + 1  # and the trash block
        self.pool = BlockPool(blocks, BLOCK_SIZE)
        self.pools = [PagedKVCache.pools(blocks, BLOCK_SIZE, c.n_kv_heads, c.head_dim, kv_dtype)
                      for _ in range(c.n_layers)]
        self.max_width = -(-context_length // BLOCK_SIZE)
        model.reserve_positions(context_length)
        self.buckets: dict[tuple[int, int, int], _Bucket] = {}
        # the captured buckets' logits, one buffer per size: steps run one at a time and
        # each copies the rows it needs before the next (a bucket's own was 20 MiB in all)
        self.outputs: dict[Any, np.ndarray] = {}
        self.arena = SharedArena()  # and one arena: steps run one at a time
        self.rows = min(max_batch, DECODE_ROWS)  # rows of one decoding step
        # rows per turn while sequences decode: a full batch's step and half a step of
        # prompt tokens, so a prompt's turn costs ~1.6x a decoding step, not a prefill
        self.turn_rows = turn_rows or self.rows + self.rows // 2

    # -- the pool ---------------------------------------------------------------------------
    def blocks(self) -> tuple[int, int]:
        return self.pool.used, self.pool.blocks - 1

    def can_admit(self, s: S) -> bool:
        hashes = prefix_hashes(s.history, BLOCK_SIZE)
        hits = 0
        for h in hashes[:(len(s.history) - 1) // BLOCK_SIZE]:
            if h not in self.pool.by_hash:
                break
            hits += 1
        need = -(-(len(s.history) + 1) // BLOCK_SIZE) - hits
        return need <= self.pool.available

    def admit(self, s: S) -> int:
        """Take the cached blocks of the longest prefix of ``s`` (all but its last token);
        returns how many tokens they hold."""
        hashes = prefix_hashes(s.history, BLOCK_SIZE)
        blocks: list[int] = []
        for h in hashes[:(len(s.history) - 1) // BLOCK_SIZE]:
            b = self.pool.lookup(h)
            if b is None:
                break
            blocks.append(b)
        s.state = SeqState(blocks, len(blocks) * BLOCK_SIZE, hashes)
        return s.state.cached

    def release(self, s: S) -> None:
        st: SeqState | None = s.state
        if st is not None:
            self.pool.release(st.blocks)
        s.state = None

    def _grow(self, s: S, upto: int, running: list[S], preempted: list[S]) -> bool:
        """Blocks for positions < ``upto``; preempt the youngest other sequence when the
        pool is out. False when ``s`` itself had to go."""
        st: SeqState = s.state
        while len(st.blocks) * BLOCK_SIZE < upto:
            b = self.pool.allocate()
            if b is None:
                victims = [v for v in reversed(running) if v is not s and v not in preempted]
                victim = victims[0] if victims else s
                self.release(victim)
                preempted.append(victim)
                if victim is s:
                    return False
                continue
            st.blocks.append(b)
        return True

    def warm(self) -> int:
        """Record and capture every step the runner can take before any request, as a
        server captures its CUDA graphs at start: every decoding bucket (batch sizes x
        table widths up to the context) and a prompt's first chunk in every prefill
        bucket up to ``chunk``. A bucket's first runs record the model (~100 ms each, on
        a cold kernel cache seconds of compiling), which would otherwise land in some
        request's time to first token or between two tokens of a running sequence. Each
        captured bucket holds ~3.5 MiB (its program's recorded form and buffers): every
        width of every prefill bucket (44 at --ctx 1024) would be ~160 MiB more, for
        later chunks and prompts after a cached prefix only. Rows are all padding (block
        0). Returns the number of buckets."""
        sizes = sorted({min(_pow2(n), self.rows) for n in range(1, self.max_batch + 1)})
        widths = sorted({min(_pow2(w), self.max_width) for w in range(1, self.max_width + 1)})
        steps = [(b, 1, w) for b in sizes for w in widths]
        # a prompt's first chunk: its bucket at the width its blocks take (one per bucket);
        # a later chunk's, or one after a cached prefix, is recorded on its first use
        for t in PREFILL_BUCKETS:
            steps.append((1, t, min(_pow2(-(-min(t, self.ctx) // BLOCK_SIZE)), self.max_width)))
            if t >= min(self.chunk, self.ctx):  # the last bucket a chunk can take
                break
        for b, t, w in steps:
            k = self._bucket(b, t, w)
            k.ids[:] = 0
            k.index.pos[:] = 0
            k.index.slots[:] = TRASH * BLOCK_SIZE
            k.index.table[:] = TRASH
            k.at[0] = t - 1
            for _ in range(4):  # a static capture is ready after two matching runs
                self._run(k, [0], prefill=t > 1)
                if k.capture is None or k.capture.ready or k.capture.reason:
                    break
        return len(steps)

    # -- a turn -----------------------------------------------------------------------------
    def step(self, running: list[S]) -> list[S]:
        """Feed every running sequence what it can this turn; set ``logits`` on those
        whose next token is due. Returns the sequences preempted (state released).

        While some sequence decodes, prompt tokens ride in its decoding steps as rows of
        their own (a row per token, each at its position: a row's key is in the pool
        before any row reads it, so a prompt's later tokens see its earlier ones), as
        ``_prompt_rows`` says: a turn costs at most about half a decoding step more,
        however long the prompts that arrive, and nothing more for short ones. With
        nobody decoding, a prompt of up to ``ROW_STEPS`` steps' rows is fed as rows, a
        longer one as one chunk through the prefill program (fastest to its first
        token)."""
        preempted: list[S] = []
        prompts = [s for s in running if len(s.history) - s.state.cached > 1]
        decoding = [s for s in running if len(s.history) - s.state.cached == 1]
        pending = sum(len(s.history) - s.state.cached for s in prompts)
        if not decoding and (not prompts or len(prompts[0].history) - prompts[0].state.cached > ROW_STEPS * self.rows):
            if prompts:
                self._prefill(prompts[0], running, preempted)
            return preempted
        rows = [(s, s.state.cached) for s in decoding
                if s not in preempted and self._grow(s, s.state.cached + 1, running, preempted)]
        room = self._prompt_rows(len(rows), pending)
        fed: list[tuple[S, int]] = []  # the prompts fed, from where
        for s in prompts:
            if room <= 0:
                break
            if s in preempted:
                continue
            start = s.state.cached
            n = min(room, len(s.history) - start)
            if self._grow(s, start + n, running, preempted):
                rows += [(s, p) for p in range(start, start + n)]
                fed.append((s, start))
                room -= n
        rows = [(s, p) for s, p in rows if s not in preempted]  # a prompt's blocks may have cost a decoder its own
        for i in range(0, len(rows), self.rows):
            self._decode(rows[i:i + self.rows])
        for s, start in fed:
            if s not in preempted:
                self._register(s.state, start)
        return preempted

    def _prompt_rows(self, decoding: int, pending: int) -> int:
        """Prompt tokens a turn with ``decoding`` decoding rows takes of ``pending``: with
        nobody decoding, up to ``ROW_STEPS`` steps; else the padding of its last step
        (one step a turn: a prompt costs the others nothing) where that feeds them all
        within ``FREE_TURNS`` turns, otherwise up to ``turn_rows`` rows in all, and at
        least the padding plus half a step where the padding is under half a step (so a
        full batch still feeds its prompts)."""
        if not decoding:
            return ROW_STEPS * self.rows
        pad, half = -decoding % self.rows, max(1, self.rows // 2)
        if pending <= pad * FREE_TURNS:
            return pad
        return max(self.turn_rows - decoding, pad if pad >= half else pad + half)

    def _register(self, st: SeqState, start: int) -> None:
        """Offer the prompt's full blocks computed since position ``start`` to the prefix cache."""
        for i in range(start // BLOCK_SIZE, min(st.cached, len(st.hashes) * BLOCK_SIZE) // BLOCK_SIZE):
            self.pool.register(st.blocks[i], st.hashes[i])

    def _prefill(self, s: S, running: list[S], preempted: list[S]) -> None:
        st: SeqState = s.state
        start = st.cached
        n = min(self.chunk, len(s.history) - start)
        if not self._grow(s, start + n, running, preempted):
            return
        t = next(b for b in PREFILL_BUCKETS if b >= n)
        k = self._bucket(1, t, _pow2(len(st.blocks)))
        k.ids[0, :n], k.ids[0, n:] = s.history[start:start + n], 0
        pos = np.arange(start, start + t)
        pos[n:] = start  # padding: a real position's angles, keys written to the trash
        k.index.pos[0] = pos
        k.index.slots[:n] = [st.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, start + n)]
        k.index.slots[n:] = TRASH * BLOCK_SIZE
        self._table(k.index.table[0], st.blocks)
        k.at[0] = n - 1
        logits = self._run(k, s.history[start:start + n], prefill=True)
        st.cached = start + n
        self._register(st, start)
        if st.cached == len(s.history):
            s.logits = np.array(logits[0])

    def _decode(self, rows: list[tuple[S, int]]) -> None:
        """One decoding step over ``rows``: (sequence, position of the token it feeds);
        a row at a sequence's last token gives its logits."""
        b = min(_pow2(len(rows)), self.rows)
        width = _pow2(max(len(s.state.blocks) for s, _ in rows))
        k = self._bucket(b, 1, width)
        k.ids[:] = 0
        k.index.pos[:] = 0
        k.index.slots[:] = TRASH * BLOCK_SIZE
        k.index.table[:] = TRASH
        for i, (s, p) in enumerate(rows):
            st: SeqState = s.state
            k.ids[i, 0] = s.history[p]
            k.index.pos[i, 0] = p
            k.index.slots[i] = st.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
            self._table(k.index.table[i], st.blocks)
        logits = self._run(k, [s.history[p] for s, p in rows], prefill=False)
        for i, (s, p) in enumerate(rows):
            s.state.cached = p + 1
            if p + 1 == len(s.history):
                s.logits = np.array(logits[i])

    @staticmethod
    def _table(row: np.ndarray, blocks: list[int]) -> None:
        row[:len(blocks)] = blocks
        row[len(blocks):] = TRASH

    def _bucket(self, batch: int, tokens: int, width: int) -> _Bucket:
        width = min(width, self.max_width)
        key = (batch, tokens, width)
        k = self.buckets.get(key)
        if k is None:
            index = PagedIndex(batch, tokens, width)
            ids, at = np.zeros((batch, tokens), np.int64), np.zeros(1, np.int64)
            caches = [PagedKVCache(kp, vp, BLOCK_SIZE, index) for kp, vp in self.pools]
            cap = (StepCapture(static=True, outputs=self.outputs, arena=self.arena)
                   if self.capture and fusion_enabled() else None)
            k = self.buckets[key] = _Bucket(index, ids, from_numpy(ids), at, from_numpy(at), caches, cap)
        return k

    def _run(self, k: _Bucket, tokens: list[int], prefill: bool) -> np.ndarray:
        """The step's logits, (B, vocab) for a decode, (1, vocab) for a prefill chunk."""
        before_replay(self.model, tokens)

        def fn() -> Any:
            out = self.model(k.ids_t, k.caches, at=k.at_t) if prefill else self.model(k.ids_t, k.caches)
            return out[:, -1]
        cap = k.capture
        if cap is not None and cap.ready and fusion_enabled():
            return cap.replay(0)
        if cap is not None and not cap.reason:
            return cap.observe(0, fn)
        return fn().numpy()
