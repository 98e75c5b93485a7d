"""A paged KV cache's kernels (vLLM's PagedAttention): the write is a scatter into a
pool of blocks (``index_copy_`` / ``x[slots] = v``: one kernel over the new rows, each
stored at its checked slot), and attention reads keys and values through a block
table inside its one chain kernel (no gathered copy). Every case against the
reference executor, fused and with ``BRAZE_FUSION=0``."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional as F
from braze.errors import IndexOutOfRange
from braze.nn.paged import PagedKVCache
from braze.runtime.cpu import compiler_available
from braze.serve.blocks import BlockPool

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")

RNG = np.random.default_rng(17)


def _both(monkeypatch: Any, run: Callable[[], Any]) -> tuple[Any, Any, dict[str, int]]:
    """``run()`` fused (with its stats) and on the reference executor."""
    monkeypatch.setenv("BRAZE_FUSION", "1")
    braze.reset_stats()
    fused = run()
    st = braze.stats()
    monkeypatch.setenv("BRAZE_FUSION", "0")
    return fused, run(), st


# -- the write: a scatter -------------------------------------------------------------------

@pytest.mark.parametrize("setitem", [False, True], ids=["index_copy_", "setitem"])
def test_the_kv_write_is_one_scatter_kernel(setitem: bool, monkeypatch: Any) -> None:
    pool0 = RNG.standard_normal((64, 3, 8)).astype(np.float32)
    k = RNG.standard_normal((4, 3, 8)).astype(np.float32)
    slots = np.array([5, 17, 63, 0], dtype=np.int64)

    def run() -> np.ndarray:
        pool = braze.from_numpy(pool0.copy())
        new = braze.from_numpy(k) * 2 + 1  # computed in the step (rotary's output, here)
        s = braze.from_numpy(slots)
        if setitem:
            pool[s] = new
        else:
            pool.index_copy_(0, s, new)
        return pool.numpy().copy()

    fused, ref, st = _both(monkeypatch, run)
    want = pool0.copy()
    want[slots] = k * 2 + 1
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(fused, want)
    assert st["kernel_launches"] == 2, st  # the step's own kernel, then the scatter: O(rows), not O(pool)


def test_a_scatter_replays_one_plan_at_new_slots(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")
    pool = braze.zeros(32, 2, 4)
    slots = braze.from_numpy(np.zeros(3, dtype=np.int64))
    want = np.zeros((32, 2, 4), np.float32)
    pool.numpy()
    braze.reset_stats()
    for t in range(5):
        rows = RNG.standard_normal((3, 2, 4)).astype(np.float32)
        slots.numpy()[:] = [t, 10 + 2 * t, 31 - t]  # written in place between steps
        pool.index_copy_(0, slots, braze.from_numpy(rows) + 0)
        want[[t, 10 + 2 * t, 31 - t]] = rows
        np.testing.assert_array_equal(pool.numpy(), want)
    st = braze.stats()
    assert st["plan_misses"] == 1 and st["kernels_compiled"] <= 2, st


def test_a_scatter_along_an_inner_dim_of_a_strided_target(monkeypatch: Any) -> None:
    base = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    src = RNG.standard_normal((4, 5, 2)).astype(np.float32)

    def run() -> np.ndarray:
        x = braze.from_numpy(base.copy())
        x.transpose(1, 2).index_copy_(2, braze.tensor([4, 1]), braze.from_numpy(src) - 1)
        return x.numpy().copy()

    fused, ref, _ = _both(monkeypatch, run)
    want = base.copy()
    want.transpose(0, 2, 1)[:, :, [4, 1]] = src - 1
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(fused, want)


def test_setitem_wraps_negative_rows_and_broadcasts(monkeypatch: Any) -> None:
    def run() -> np.ndarray:
        x = braze.zeros(6, 3)
        x[braze.tensor([-1, 2])] = braze.tensor([1.0, 2.0, 3.0])
        x[braze.tensor([0, -2]) + 0] = 7.0  # pending indices: wrapped on the stream
        return x.numpy().copy()

    fused, ref, _ = _both(monkeypatch, run)
    want = np.zeros((6, 3), np.float32)
    want[[-1, 2]] = [1, 2, 3]
    want[[0, -2]] = 7
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(fused, want)


@pytest.mark.parametrize("fusion", ["1", "0"])
def test_an_out_of_range_slot_raises_and_writes_nothing(fusion: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", fusion)
    pool0 = RNG.standard_normal((16, 2, 4)).astype(np.float32)
    pool = braze.from_numpy(pool0.copy())
    for bad in (16, -1, 1 << 40):
        slots = braze.tensor([3, bad, 5])
        with pytest.raises(IndexOutOfRange) as e:
            pool.index_copy_(0, slots + 0, braze.ones(3, 2, 4))  # pending: found in the kernel
            pool.numpy()
        assert e.value.index == bad and e.value.size == 16
        np.testing.assert_array_equal(pool.numpy(), pool0)
    # a realised index is checked as it is recorded
    with pytest.raises(IndexOutOfRange):
        pool.index_copy_(0, braze.tensor([16]), braze.ones(1, 2, 4))
    np.testing.assert_array_equal(pool.numpy(), pool0)


# -- the read: attention through a block table ----------------------------------------------

def _np_attention(q: np.ndarray, kp: np.ndarray, vp: np.ndarray, table: np.ndarray, pos: np.ndarray,
                  bs: int) -> np.ndarray:
    """float64 attention over the keys the table names, GQA by repeating KV heads."""
    b, h, t, d = q.shape
    kvh = kp.shape[1]
    nb = table.shape[1]
    L = nb * bs

    def rows(p: np.ndarray) -> np.ndarray:
        return p.reshape(-1, bs, kvh, d)[table].reshape(b, L, kvh, d).transpose(0, 2, 1, 3).astype(np.float64)

    k, v = np.repeat(rows(kp), h // kvh, 1), np.repeat(rows(vp), h // kvh, 1)
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    mask = (np.arange(L)[None, :] <= pos.reshape(b * t, 1)).reshape(b, 1, t, L)
    s = np.where(mask, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def paged_attention(q: braze.Tensor, kp: braze.Tensor, vp: braze.Tensor, table: braze.Tensor, pos: braze.Tensor,
                    bs: int) -> braze.Tensor:
    """As the serving engine's model code writes it (see the module doc)."""
    b, h, t, d = q.shape
    kvh = kp.shape[1]
    L = table.shape[1] * bs
    blocks = kp.shape[0] // bs
    k = kp.view(blocks, bs, kvh, d)[table].to(q.dtype).reshape(b, L, kvh, d).transpose(1, 2)
    v = vp.view(blocks, bs, kvh, d)[table].to(q.dtype).reshape(b, L, kvh, d).transpose(1, 2)
    mask = (braze.arange(L).reshape(1, L) <= pos.reshape(b * t, 1)).reshape(b, 1, t, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _case(b: int, h: int, kvh: int, t: int, d: int, bs: int, blocks: int, nb: int, shared: bool = False,
          short: bool = False) -> dict[str, np.ndarray]:
    """A pool, queries, a table (blocks repeated across sequences when ``shared``: a
    common prefix) and positions (``short``: most of L past each sequence's end)."""
    table = np.stack([RNG.choice(blocks, nb, replace=False) for _ in range(b)]).astype(np.int64)
    if shared:
        table[:, : nb // 2 + 1] = table[0, : nb // 2 + 1]
    L = nb * bs
    ends = RNG.integers(1, 4, b) if short else RNG.integers(L - t - bs, L - t + 1, b)
    pos = (ends[:, None] + np.arange(t)[None, :]).astype(np.int64)
    return {"q": RNG.standard_normal((b, h, t, d)).astype(np.float32),
            "kp": RNG.standard_normal((blocks * bs, kvh, d)).astype(np.float32),
            "vp": RNG.standard_normal((blocks * bs, kvh, d)).astype(np.float32),
            "table": table, "pos": pos}


ATTENTION_CASES = {
    "decoding, gqa": dict(b=4, h=6, kvh=3, t=1, d=16, bs=16, blocks=40, nb=9),
    "decoding, mha, long": dict(b=2, h=2, kvh=2, t=1, d=64, bs=16, blocks=80, nb=40),
    "prefill chunk": dict(b=1, h=4, kvh=2, t=24, d=32, bs=16, blocks=20, nb=6),
    "mixed t, small blocks": dict(b=3, h=4, kvh=1, t=3, d=8, bs=4, blocks=50, nb=13),
    "shared prefix": dict(b=4, h=4, kvh=2, t=1, d=16, bs=16, blocks=30, nb=8, shared=True),
    "mostly masked": dict(b=3, h=4, kvh=2, t=2, d=16, bs=16, blocks=40, nb=12, short=True),
    "long chunk (tiles packed once)": dict(b=1, h=4, kvh=2, t=100, d=16, bs=8, blocks=20, nb=16),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", list(ATTENTION_CASES))
def test_attention_reads_through_the_block_table_in_one_chain_kernel(name: str, dtype: str, monkeypatch: Any) -> None:
    """One chain kernel, its keys and values gathered as it reads them. A float16 or
    bfloat16 pool (``braze serve``'s default KV cache is float16) is cast to float32 as
    it is gathered (``PagedKVCache``): the kernel converts each key and value as it
    loads it, with no gathered or converted copy; the result is the float32 attention
    of the rounded pool's values."""
    cfg = ATTENTION_CASES[name]
    c = _case(**cfg)  # type: ignore[arg-type]
    bs = int(cfg["bs"])
    b, h, t, d = c["q"].shape
    kp, vp = (braze.from_numpy(c[p]).to(getattr(braze, dtype)).realize() for p in ("kp", "vp"))

    def run() -> np.ndarray:
        table, pos = braze.from_numpy(c["table"]), braze.from_numpy(c["pos"])
        q = braze.from_numpy(c["q"])
        return paged_attention(q, kp, vp, table, pos, bs).numpy().copy()

    fused, ref, st = _both(monkeypatch, run)
    rounded = [p.to(braze.float32).numpy() for p in (kp, vp)]
    want = _np_attention(c["q"], *rounded, c["table"], c["pos"], bs)
    np.testing.assert_allclose(ref, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(fused, want, rtol=2e-5, atol=2e-5)
    assert st["kernel_launches"] == 1, st  # the chain, its keys and values gathered as it reads them
    assert st["bytes_allocated"] <= b * h * t * d * 4 + 4096, st  # the output only: no gathered keys or values


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_write_after_the_gather_is_seen_by_nothing_that_read_before_it(dtype: str, monkeypatch: Any) -> None:
    """Keys gathered (and cast to float32) before the pool is written, attended after:
    the attention sees the pool as it was at the gather (the chain reads through the
    gather and the cast only when nothing writes the pool in between; here it does)."""
    c = _case(b=2, h=4, kvh=2, t=1, d=16, bs=16, blocks=12, nb=3)
    half = getattr(braze, dtype)
    kp0, vp0 = (braze.from_numpy(c[p]).to(half).numpy() for p in ("kp", "vp"))
    slots = np.concatenate([c["table"][0, :1] * 16, c["table"][1, :1] * 16 + 3]).astype(np.int64)

    def run() -> np.ndarray:
        kp, vp = (braze.from_numpy(a.copy()) for a in (kp0, vp0))
        b, h, t, d = c["q"].shape
        table, L = braze.from_numpy(c["table"]), c["table"].shape[1] * 16
        k, v = (p.view(-1, 16, 2, d)[table].to(braze.float32) for p in (kp, vp))
        for p in (kp, vp):
            p.index_copy_(0, braze.from_numpy(slots), braze.full((2, 2, d), 9.0).to(half))
        k, v = (x.reshape(b, L, 2, d).transpose(1, 2) for x in (k, v))
        mask = (braze.arange(L).reshape(1, L) <= braze.from_numpy(c["pos"]).reshape(b * t, 1)).reshape(b, 1, t, L)
        return F.scaled_dot_product_attention(braze.from_numpy(c["q"]), k, v, attn_mask=mask,
                                              enable_gqa=True).numpy().copy()

    fused, ref, _ = _both(monkeypatch, run)
    want = _np_attention(c["q"], kp0.astype(np.float32), vp0.astype(np.float32), c["table"], c["pos"], 16)
    np.testing.assert_allclose(ref, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(fused, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fusion", ["1", "0"])
def test_an_out_of_range_table_entry_raises(fusion: str, monkeypatch: Any) -> None:
    """A table known when the step records is checked then (as any index); one that
    changes later is checked by the chain kernel: see the captured step below."""
    monkeypatch.setenv("BRAZE_FUSION", fusion)
    c = _case(b=2, h=2, kvh=1, t=1, d=8, bs=4, blocks=10, nb=5, short=True)
    c["table"][1, 4] = 10  # past every position (masked), still an error, as in PyTorch
    args = [braze.from_numpy(c[n]) for n in ("q", "kp", "vp", "table", "pos")]
    with pytest.raises(IndexOutOfRange) as e:
        paged_attention(*args, 4).numpy()  # type: ignore[call-arg]
    assert e.value.index == 10 and e.value.size == 10


# -- a captured step: embedding, rotary at per-row positions, the writes, paged attention ------

class Toy:
    """A two-layer decoder step over paged KV pools, as the serving engine writes one:
    B sequences of T new tokens, their slots in the pools, block tables and positions
    all tensors the caller writes in place between steps."""

    C, H, KVH, D, BS, BLOCKS, VOCAB, LAYERS = 32, 4, 2, 8, 4, 24, 50, 2

    def __init__(self) -> None:
        r = np.random.default_rng(3)
        self.emb = braze.from_numpy(r.standard_normal((self.VOCAB, self.C)).astype(np.float32))
        half = lambda *s: braze.from_numpy((r.standard_normal(s) * 0.2).astype(np.float16))  # noqa: E731
        self.w = [{n: half(o, i) for n, o, i in (("q", self.H * self.D, self.C), ("k", self.KVH * self.D, self.C),
                                                ("v", self.KVH * self.D, self.C), ("o", self.C, self.H * self.D))}
                  for _ in range(self.LAYERS)]
        ang = np.arange(64)[:, None] / 10000 ** (np.arange(self.D // 2)[None, :] * 2 / self.D)
        self.cos, self.sin = braze.from_numpy(np.cos(ang).astype(np.float32)), braze.from_numpy(np.sin(ang).astype(np.float32))

    def pools(self) -> list[tuple[braze.Tensor, braze.Tensor]]:
        z = lambda: braze.from_numpy(np.zeros((self.BLOCKS * self.BS, self.KVH, self.D), np.float32))  # noqa: E731
        return [(z(), z()) for _ in range(self.LAYERS)]

    def rope(self, x: braze.Tensor, cos: braze.Tensor, sin: braze.Tensor) -> braze.Tensor:
        h = self.D // 2
        x1, x2 = x[..., :h], x[..., h:]
        return braze.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def step(self, pools: list[tuple[braze.Tensor, braze.Tensor]], ids: braze.Tensor, slots: braze.Tensor,
             table: braze.Tensor, pos: braze.Tensor) -> braze.Tensor:
        b, t = ids.shape
        n, D = b * t, self.D
        x = F.embedding(ids.reshape(-1), self.emb)  # (n, C)
        cos = self.cos.index_select(0, pos.reshape(-1)).reshape(n, 1, D // 2)
        sin = self.sin.index_select(0, pos.reshape(-1)).reshape(n, 1, D // 2)
        for w, (kp, vp) in zip(self.w, pools):
            q = self.rope(F.linear(x, w["q"]).reshape(n, self.H, D), cos, sin)
            k = self.rope(F.linear(x, w["k"]).reshape(n, self.KVH, D), cos, sin)
            kp.index_copy_(0, slots, k)
            vp[slots] = F.linear(x, w["v"]).reshape(n, self.KVH, D)
            a = paged_attention(q.reshape(b, t, self.H, D).transpose(1, 2), kp, vp, table, pos, self.BS)
            x = x + F.linear(a.transpose(1, 2).reshape(n, self.H * D), w["o"])
        return x.reshape(b, t, self.C)


def _toy_inputs(b: int, t: int, nb: int, step: int) -> dict[str, np.ndarray]:
    """Step ``step`` of b sequences of different lengths, each with its own blocks
    (sequence 0's first block shared by sequence 1: a common prefix), t new tokens."""
    BS = Toy.BS
    table = np.array([[(s * nb + j) % Toy.BLOCKS for j in range(nb)] for s in range(b)], np.int64)
    if b > 1:
        table[1, 0] = table[0, 0]
    start = np.array([3 + 2 * s + step * t for s in range(b)])
    pos = (start[:, None] + np.arange(t)[None, :]).astype(np.int64)
    slots = np.array([table[s, p // BS] * BS + p % BS for s in range(b) for p in pos[s]], np.int64)
    ids = np.random.default_rng(step).integers(0, Toy.VOCAB, (b, t)).astype(np.int64)
    return {"ids": ids, "slots": slots, "table": table, "pos": pos}


@pytest.mark.parametrize("b,t", [(3, 1), (1, 4)], ids=["decoding", "prefill chunk"])
def test_a_paged_step_is_captured_and_replays_at_new_slots_tables_and_positions(b: int, t: int,
                                                                               monkeypatch: Any) -> None:
    from braze.capture import StepCapture
    toy, nb = Toy(), 8
    first = _toy_inputs(b, t, nb, 0)
    bufs = {k: v.copy() for k, v in first.items()}
    ins = {k: braze.from_numpy(v) for k, v in bufs.items()}  # the caller's tensors, written in place
    fused_pools, ref_pools = toy.pools(), toy.pools()

    def fused_step() -> braze.Tensor:
        return toy.step(fused_pools, ins["ids"], ins["slots"], ins["table"], ins["pos"])

    def ref_step(x: dict[str, np.ndarray]) -> np.ndarray:
        monkeypatch.setenv("BRAZE_FUSION", "0")
        out = toy.step(ref_pools, *(braze.from_numpy(x[k].copy()) for k in ("ids", "slots", "table", "pos"))).numpy()
        monkeypatch.setenv("BRAZE_FUSION", "1")
        return out

    def check(x: dict[str, np.ndarray], got: np.ndarray) -> None:
        np.testing.assert_allclose(got, ref_step(x), rtol=1e-4, atol=1e-4)
        for (fk, fv), (rk, rv) in zip(fused_pools, ref_pools):
            np.testing.assert_allclose(fk.numpy(), rk.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(fv.numpy(), rv.numpy(), rtol=1e-5, atol=1e-5)

    monkeypatch.setenv("BRAZE_FUSION", "1")
    cap = StepCapture(static=True)
    for _ in range(2):  # observed twice at the same inputs (a static capture)
        for k in bufs:
            bufs[k][...] = first[k]
        got = cap.observe(0, fused_step)
    assert cap.ready, cap.reason
    kernels = [[seg.names[n] for n in st.step.nodes]
               for seg in cap.segments or [] for st in seg.plan.steps]
    # per layer: the two scatters (one kernel each) and one attention chain; the only
    # gathers stored are the embedding's rows and the rotary tables' (read by 4 kernels
    # a layer): the keys and values are read through the tables by the chains
    assert kernels.count(["index_copy"]) == 2 * Toy.LAYERS, kernels
    assert sum("matmul" in k for k in kernels) == Toy.LAYERS, kernels
    assert sum(k.count("index_select") for k in kernels) == 3, kernels
    check(first, got)
    for s in range(1, 6):
        x = _toy_inputs(b, t, nb, s)
        if s == 3:
            x["table"] = x["table"][::-1].copy()  # other sequences' blocks
            x["slots"] = np.array([x["table"][i, p // Toy.BS] * Toy.BS + p % Toy.BS
                                   for i in range(b) for p in x["pos"][i]], np.int64)
        for k in bufs:
            bufs[k][...] = x[k]
        braze.reset_stats()
        got = cap.replay(0).copy()
        assert braze.stats()["nodes_recorded"] == 0
        check(x, got)
    # an entry out of range, written after the capture: found by the kernels, nothing stored
    before = [(k.numpy().copy(), v.numpy().copy()) for k, v in fused_pools]
    bufs["table"][0, 1] = Toy.BLOCKS
    with pytest.raises(IndexOutOfRange) as e:
        cap.replay(0)
    assert e.value.index == Toy.BLOCKS and e.value.size == Toy.BLOCKS
    bufs["table"][0, 1] = x["table"][0, 1]
    bufs["slots"][-1] = Toy.BLOCKS * Toy.BS + 7
    with pytest.raises(IndexOutOfRange) as e:
        cap.replay(0)
    assert e.value.index == Toy.BLOCKS * Toy.BS + 7
    assert all(np.array_equal(k.numpy(), bk) and np.array_equal(v.numpy(), bv)
               for (k, v), (bk, bv) in zip(fused_pools, before))  # the first write failed: none ran
    bufs["slots"][-1] = x["slots"][-1]
    check(x, cap.replay(0).copy())


def test_new_batch_sizes_and_table_widths_compile_nothing(monkeypatch: Any, plan_builds: list[bool]) -> None:
    """A decoding step's write and attention at a new (B, NB): from the program's
    second shape on, its kernels are generic in their sizes (``codegen/generic.py``)."""
    from braze import plan
    from braze.stream import fusion_enabled
    if not fusion_enabled():
        pytest.skip("the fused executor's kernels")
    monkeypatch.setattr(plan, "_plan_path", lambda key: None)  # render now: compiled objects may be cached
    bs, blocks, kvh, d = 16, 64, 2, 32
    kp0, vp0 = (RNG.standard_normal((blocks * bs, kvh, d)).astype(np.float32) for _ in range(2))
    for b, nb in ((2, 4), (3, 6), (5, 9), (4, 7), (6, 3)):
        kp, vp = braze.from_numpy(kp0.copy()), braze.from_numpy(vp0.copy())
        table = np.stack([RNG.choice(blocks, nb, replace=False) for _ in range(b)]).astype(np.int64)
        pos = RNG.integers(1, nb * bs, (b, 1)).astype(np.int64)
        slots = np.array([table[i, p // bs] * bs + p % bs for i, p in enumerate(pos[:, 0])], np.int64)
        q = RNG.standard_normal((b, 4, 1, d)).astype(np.float32)
        new = RNG.standard_normal((b, kvh, d)).astype(np.float32)
        kp.index_copy_(0, braze.from_numpy(slots), braze.from_numpy(new) * 1.0)
        out = paged_attention(braze.from_numpy(q), kp, vp, braze.from_numpy(table), braze.from_numpy(pos), bs)
        got = out.numpy()
        kw = kp0.copy()
        kw[slots] = new
        np.testing.assert_allclose(got, _np_attention(q, kw, vp0, table, pos, bs), rtol=2e-5, atol=2e-5)
    assert len(plan_builds) == 5 and not any(plan_builds[2:]), plan_builds


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_the_kv_pool_is_resident_only_where_written() -> None:
    # a server's pool is sized for its whole budget; only the blocks written may cost memory
    live = braze.stats()["live_bytes"]
    before = _rss_kib()
    k, v = PagedKVCache.pools(4096, 16, 3, 64)  # 48 MiB each
    n = k._storage.array.nbytes
    assert braze.stats()["live_bytes"] - live == 2 * n  # accounted for as held
    assert _rss_kib() - before < 8 << 10
    arr = k._storage.array
    assert arr.ctypes.data % 4096 == 0 and arr.flags.writeable
    arr[16 * 3 * 64:32 * 3 * 64] = 1.0  # block 1
    assert _rss_kib() - before < 8 << 10
    assert float(k.numpy()[:16].sum()) == 0 and float(k.numpy()[16:32].sum()) == 16 * 3 * 64
    assert not v.numpy().any()


def test_blocks_are_handed_out_lowest_first() -> None:
    # so the pool's pages in use stay the most blocks ever held, not the whole pool
    pool = BlockPool(8, 16)
    got = [pool.allocate() for _ in range(4)]
    assert got == [1, 2, 3, 4]
    pool.release([3])
    pool.release([1])
    assert [pool.allocate(), pool.allocate(), pool.allocate()] == [1, 3, 5]
