"""Plans: matched op by op through the trie as the stream records, and their internal
buffers placed by liveness in one arena.

These tests force fusion on (as test_fusion.py does), except where they check what the
reference executor pays, so they check the plan cache in both runs of the suite.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import braze
from braze import arena, plan
from braze.runtime import memory
from braze.runtime.cpu import compiler_available
from braze.stats import COUNTERS
from braze.stream import stream

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")

N = 256  # (N, N) float32 is 256 KiB: big enough for the pool (64 KiB and up)


@pytest.fixture(autouse=True)
def fused(monkeypatch: Any, tmp_path: Any) -> Iterator[None]:
    monkeypatch.setenv("BRAZE_FUSION", "1")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))  # no stored plans from elsewhere
    braze.synchronize()
    plan.clear()
    gc.collect()
    yield
    braze.synchronize()
    plan.clear()


def _form() -> plan.Form:
    form = stream("cpu").nodes.form
    assert isinstance(form, plan.Form)
    return form


def _state(form: plan.Form) -> tuple[Any, ...]:
    return (list(form.entries), [id(s) for s in form.storages], dict(form.key_of), list(form.refs),
            list(form.produced), list(form.marks), [id(n) for n in form.path])


def _randn(*shape: int, seed: int = 0) -> braze.Tensor:
    return braze.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _reference(fn: Callable[[], braze.Tensor], monkeypatch: Any) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        return fn().numpy().copy()


# -- matching op by op ---------------------------------------------------------------------

def test_a_repeated_stream_finds_its_plan_with_no_work_at_the_flush(monkeypatch: Any) -> None:
    x, w = _randn(8, 16), _randn(16, seed=1)

    def prog() -> braze.Tensor:
        return ((x * w + 1.0).exp() - x).relu()

    prog().numpy()
    y = prog()
    assert _form().cursor() is not None, "the cursor walked the trie while recording"
    assert len(_form().entries) == 5
    numbered = []
    real = plan.Form._number
    monkeypatch.setattr(plan.Form, "_number", lambda self, node: numbered.append(node) or real(self, node))
    braze.reset_stats()
    y.numpy()
    assert braze.stats()["plan_hits"] == 1 and braze.stats()["plan_misses"] == 0
    assert numbered == [], "a hit hashes nothing at the flush"


def test_a_new_program_falls_off_the_trie_and_its_path_is_inserted() -> None:
    x = _randn(4, 8)
    y = (x * 2.0).exp()
    assert _form().cursor() is None  # never planned
    assert len(_form().entries) == 1, "off the trie, recording leaves the rest to the flush"
    braze.reset_stats()
    y.numpy()
    assert braze.stats()["plan_misses"] == 1
    y = (x * 2.0).exp()
    node = _form().cursor()
    assert node is not None and node.plans is not None and len(node.plans) == 1
    y.numpy()
    assert braze.stats()["plan_hits"] == 1


def test_a_prefix_of_a_planned_stream_gets_its_own_plan() -> None:
    x = _randn(4, 8)
    ((x + 1.0) * 3.0).sigmoid().numpy()
    braze.reset_stats()
    y = (x + 1.0) * 3.0  # on the trie all the way, but no stream ended here
    assert _form().cursor() is not None
    np.testing.assert_allclose(y.numpy(), (x.numpy() + 1) * 3, rtol=1e-6)
    assert braze.stats()["plan_misses"] == 1
    y = (x + 1.0) * 3.0
    y.numpy()
    ((x + 1.0) * 3.0).sigmoid().numpy()  # both streams are found again
    assert braze.stats()["plan_hits"] == 2 and braze.stats()["plan_misses"] == 1


def test_liveness_keys_plans_at_the_same_trie_node() -> None:
    x = _randn(4, 8)
    (x * 2.0).exp().numpy()
    a = x * 2.0  # now the intermediate is held
    b = a.exp()
    node = _form().cursor()
    assert node is not None
    np.testing.assert_allclose(b.numpy(), np.exp(x.numpy() * 2), rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), x.numpy() * 2)
    assert node.plans is not None and len(node.plans) == 2


def test_a_call_that_fails_half_way_rolls_the_form_and_the_cursor_back() -> None:
    x, y = _randn(8, 8), _randn(8, 8, seed=1)
    u = x * y
    (u + u).exp().numpy()  # planned with u held, as below
    s = stream("cpu")
    u = x * y
    before = _state(_form())
    with pytest.raises(RuntimeError):
        with s.atomic():  # nodes that are on the trie, taken back
            v = u + u
            v.exp()
            assert _form().cursor() is not None
            raise RuntimeError("a later check of the call")
    assert _state(_form()) == before
    with pytest.raises(braze.ShapeMismatch):
        u.add_(_randn(2, 8, 8))  # records u + big (off the trie, a new storage), then refuses
    assert _state(_form()) == before
    assert len(s.nodes) == 1
    out = (u + u).exp()
    braze.reset_stats()
    got = out.numpy()
    assert braze.stats()["plan_hits"] == 1
    np.testing.assert_allclose(got, np.exp(2 * x.numpy() * y.numpy()), rtol=1e-6)


def test_the_form_kept_while_recording_is_the_form_of_the_whole_stream() -> None:
    x, w = _randn(4, 6), _randn(6, seed=2)
    ((x * w).sum(-1, keepdim=True) + x).numpy()
    a = x * w  # on the trie for two nodes, then off
    b = a.sum(-1, keepdim=True) - x
    c = b.T.exp()
    nodes = list(stream("cpu").nodes)
    form = _form()
    assert len(form.entries) < len(nodes)
    form.complete(nodes)
    fresh = plan.Form.of(nodes)
    assert form.entries == fresh.entries and form.refs == fresh.refs and form.produced == fresh.produced
    assert form.storages == fresh.storages and form.marks == fresh.marks
    np.testing.assert_allclose(c.numpy(), np.exp((x.numpy() * w.numpy()).sum(-1, keepdims=True) - x.numpy()).T,
                               rtol=1e-5)
    del a


def test_the_reference_executor_keeps_no_form(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "0")
    x = _randn(4, 4)
    y = x + x
    assert stream("cpu").nodes.form is None
    np.testing.assert_allclose(y.numpy(), 2 * x.numpy())


def test_a_stream_recorded_unfused_runs_fused_when_fusion_is_back(monkeypatch: Any) -> None:
    x = _randn(4, 4)
    (x * 3.0 + 1.0).numpy()
    monkeypatch.setenv("BRAZE_FUSION", "0")
    y = x * 3.0 + 1.0
    assert stream("cpu").nodes.form is None
    monkeypatch.setenv("BRAZE_FUSION", "1")
    braze.reset_stats()
    np.testing.assert_allclose(y.numpy(), x.numpy() * 3 + 1, rtol=1e-6)
    assert braze.stats()["plan_hits"] == 1


def test_a_form_started_before_clear_walks_the_new_trie() -> None:
    x = _randn(4, 4)
    x.exp().numpy()
    y = x.exp()
    assert _form().cursor() is not None
    plan.clear()  # the cursor points into the old trie
    braze.reset_stats()
    y.numpy()
    assert braze.stats()["plan_misses"] == 1 and braze.stats()["plan_hits"] == 0


def test_a_new_process_finds_the_stored_plan_by_the_hash_of_the_form(monkeypatch: Any) -> None:
    x = _randn(N, N)

    def prog() -> braze.Tensor:
        return _chain(x)

    want = prog().numpy().copy()
    (stored,) = plan.stored_plans()
    plan.clear()  # as a new process: an empty trie, the plans on disk

    def no_scheduling(*args: Any) -> Any:
        raise AssertionError("scheduled again")

    monkeypatch.setattr(plan, "schedule", no_scheduling)
    np.testing.assert_array_equal(prog().numpy(), want)
    (loaded,) = plan.stored_plans()
    assert loaded.offsets == stored.offsets and loaded.arena_bytes == stored.arena_bytes


def test_plan_cap_evicts_the_program_used_least_recently(monkeypatch: Any, capfd: Any) -> None:
    """Past BRAZE_PLAN_CAP programs the least recently used one loses its plans: every
    program stays fused, and one that comes back is planned again (from disk)."""
    monkeypatch.setenv("BRAZE_PLAN_CAP", "2")
    monkeypatch.setattr(plan, "_warned", set())
    x = _randn(4, 4)

    def run(op: str) -> None:
        got = getattr(x * 1.5, op)().numpy()
        np.testing.assert_allclose(got, _reference(lambda: getattr(x * 1.5, op)(), monkeypatch), rtol=1e-6)

    unfused = COUNTERS["unfused_flushes"]
    run("exp")
    run("tanh")
    run("exp")  # exp is now the most recent: tanh goes next
    misses = COUNTERS["plan_misses"]
    run("sigmoid")
    stored = [str(p.program) for p in plan.stored_plans()]
    assert len(stored) == 2 and any("exp" in s for s in stored) and not any("tanh" in s for s in stored)
    assert COUNTERS["plan_misses"] == misses + 1
    run("tanh")  # evicted: planned again, still fused
    assert COUNTERS["plan_misses"] == misses + 2 and len(list(plan.stored_plans())) == 2
    assert COUNTERS["unfused_flushes"] == unfused
    assert "reference executor" not in capfd.readouterr().err


def test_an_evicted_jit_plan_is_found_again(monkeypatch: Any) -> None:
    """A jit function whose plan was evicted is planned again once, then found in the
    trie on every later call (a hit), not planned each call."""
    monkeypatch.setenv("BRAZE_PLAN_CAP", "1")
    x = _randn(4, 4)

    @braze.jit
    def f(a: braze.Tensor) -> braze.Tensor:
        return (a * 2.0).exp() - 1.0

    want = np.exp(x.numpy() * 2.0) - 1.0
    for _ in range(3):
        np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-5)
    (x * 3.0).tanh().numpy()  # another program: f's plan is evicted
    assert len(list(plan.stored_plans())) == 1
    np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-5)
    hits = COUNTERS["plan_hits"]
    np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-5)
    assert COUNTERS["plan_hits"] == hits + 1  # found in the trie again, not planned each call


def test_new_shapes_of_a_program_replay_its_generic_kernels(monkeypatch: Any, capfd: Any,
                                                          plan_builds: list[bool]) -> None:
    """Element-wise kernels are generic in their sizes (``codegen/generic.py``): every
    shape of the program, of any rank, is planned and fused. The first gets kernels
    specialised to it, the second generic ones, and no later shape compiles anything."""
    monkeypatch.setenv("BRAZE_SHAPE_VARIANTS", "2")
    monkeypatch.setattr(plan, "_warned", set())
    for shape in [(3, 7), (4, 7), (50, 9), (2, 3, 5), (6, 1, 11), (129, 2)]:
        x = _randn(*shape)
        np.testing.assert_allclose((x * 2.0).exp().numpy(), np.exp(x.numpy() * 2), rtol=1e-6)
    assert len(plan_builds) == 6 and not any(plan_builds[2:]), plan_builds
    assert "reference executor" not in capfd.readouterr().err


def test_shapes_that_need_compiling_past_the_bound_run_unfused(monkeypatch: Any, capfd: Any, tmp_path: Any) -> None:
    """A program compiles kernels for at most BRAZE_SHAPE_VARIANTS of its shapes (a
    bound for what still compiles per shape: a size-dependent choice of the renderer's,
    a new dtype of constant); a shape past it that would compile runs on the reference
    executor, and says so. Here the bound is 1: the first shape's specialised kernels,
    and no generic ones."""
    monkeypatch.setenv("BRAZE_SHAPE_VARIANTS", "1")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))  # nothing compiled before
    monkeypatch.setattr(plan, "_warned", set())
    plan.clear()
    braze.reset_stats()
    for n in (37, 41, 43):
        x = _randn(3, n, seed=n)
        want = np.exp(np.concatenate([x.numpy(), x.numpy() * 2], -1))
        np.testing.assert_allclose(braze.cat([x, x * 2], -1).exp().numpy(), want, rtol=1e-6)
    assert braze.stats()["unfused_flushes"] == 2 and len(list(plan.stored_plans())) == 1
    assert "new shapes" in capfd.readouterr().err


def test_negative_zero_attributes_are_their_own_program() -> None:
    """``full(..., -0.0)`` after ``full(..., 0.0)``: the attribute's sign is part of the
    plan's key (-0.0 == 0.0 in Python, and the kernel bakes the value in)."""
    with np.errstate(divide="ignore"):
        for v in (0.0, -0.0, 0.0, -0.0):
            got = (1.0 / braze.full((3,), v)).numpy()
            np.testing.assert_array_equal(got, 1.0 / np.full(3, v, dtype=np.float32))


def test_the_same_program_in_other_dtypes_is_not_a_new_shape(monkeypatch: Any, capfd: Any) -> None:
    """float32, float16, bfloat16 and float64 versions of one program are four programs,
    each compiled: only new shapes of one program count against BRAZE_SHAPE_VARIANTS."""
    monkeypatch.setenv("BRAZE_SHAPE_VARIANTS", "2")
    monkeypatch.setattr(plan, "_warned", set())
    misses = 0
    for dtype in (braze.float32, braze.float16, braze.bfloat16, braze.float64):
        x = _randn(3, 7).to(dtype).realize()
        braze.reset_stats()
        (x * 2.0).exp().numpy()
        misses += braze.stats()["plan_misses"]
    assert misses == 4
    assert "new shapes" not in capfd.readouterr().err


# -- the arena -----------------------------------------------------------------------------

def _chain(x: braze.Tensor) -> braze.Tensor:
    """Three buffers only the plan needs: each transposed read closes a kernel, and none
    is cheap enough to recompute where it is read (the first has a reduction)."""
    a = x - x.amax(-1, keepdim=True)
    return (((a.T + 1).T * 3).T - 1)


def test_internal_buffers_share_one_arena_by_liveness(monkeypatch: Any) -> None:
    x = _randn(N, N)
    arenas: list[int] = []
    real = memory.arena_at
    monkeypatch.setattr(memory, "arena_at", lambda n: arenas.append(n) or real(n))
    braze.reset_stats()
    got = _chain(x).numpy().copy()
    st = braze.stats()
    assert st["kernel_launches"] == 4
    assert st["allocations"] + st["pool_hits"] == 2  # the arena and the result
    (p,) = plan.stored_plans()
    buf = N * N * 4
    assert len(p.offsets) == 3 and arenas == [p.arena_bytes]
    # lifetimes [0, 1], [1, 2], [2, 3]: the first and the last never meet
    assert p.arena_bytes == 2 * buf < 3 * buf
    assert all(off % memory.ARENA_ALIGN == 0 for off in p.offsets.values())
    np.testing.assert_allclose(got, _reference(lambda: _chain(x), monkeypatch), rtol=1e-6)


def test_a_chain_broken_by_matmul_places_only_kernel_results_in_the_arena(monkeypatch: Any) -> None:
    x, w = _randn(N, N), _randn(N, N, seed=1)
    runs: list[tuple[plan.Plan, Any, list[Any]]] = []
    real_run = plan._run

    def spy_run(p: plan.Plan, nodes: Any, storages: list[Any]) -> None:
        runs.append((p, nodes, storages))
        real_run(p, nodes, storages)

    monkeypatch.setattr(plan, "_run", spy_run)

    def prog() -> braze.Tensor:
        h = x - x.amax(-1, keepdim=True)
        m = h @ w
        return ((m + 1.0).sigmoid().T * h).sum(-1)

    got = prog().numpy().copy()
    ((p, nodes, storages),) = runs
    kernel_out = {k for st in p.steps if isinstance(st, plan.CompiledKernel) for k in st.step.outputs}
    extern_out = {id(o.storage) for st in p.steps if isinstance(st, plan.ExternStep) for o in nodes[st.node].outputs}
    assert p.offsets and set(p.offsets) <= kernel_out
    assert not {id(storages[k]) for k in p.offsets} & extern_out, "an extern result is what its reference returns"
    np.testing.assert_allclose(got, _reference(prog, monkeypatch), rtol=1e-5, atol=1e-5)


def test_a_loop_over_fresh_inputs_takes_the_arena_from_the_pool() -> None:
    rng = np.random.default_rng(5)
    counts = []
    for _ in range(4):
        x = braze.from_numpy(rng.standard_normal((N, N)).astype(np.float32))
        braze.reset_stats()
        y = _chain(x)
        y.numpy()
        counts.append((braze.stats()["allocations"], braze.stats()["pool_hits"]))
        del y
    assert all(a == 0 and h == 2 for a, h in counts[1:]), counts


def test_an_error_mid_plan_leaves_no_view_of_the_arena(monkeypatch: Any) -> None:
    x = _randn(N, N)
    blocks: list[weakref.ref[np.ndarray]] = []  # weak: the pool reuses only a block nothing else holds
    runs: list[tuple[plan.Plan, list[Any]]] = []
    real_arena, real_run = memory.arena_at, plan._run

    def spy_arena(n: int) -> tuple[np.ndarray, int]:
        view, address = real_arena(n)
        blocks.append(weakref.ref(view.base))
        return view, address

    def spy_run(p: plan.Plan, nodes: Any, storages: list[Any]) -> None:
        runs.append((p, storages))
        real_run(p, nodes, storages)

    monkeypatch.setattr(memory, "arena_at", spy_arena)
    monkeypatch.setattr(plan, "_run", spy_run)
    memory.pool_clear()  # so the block below is the only free one of its size

    def prog(at: int) -> tuple[braze.Tensor, braze.Tensor]:
        a = x - x.amax(-1, keepdim=True)
        c = (a.T + 1).T * 3  # a and the + 1 in the arena, c live
        # the exp is in the arena too, read by gather (an extern step) after c is done
        return c, braze.gather(c.T.exp(), 0, braze.full((2, N), at, dtype=braze.int64))

    c, g = prog(N + 5)
    with pytest.raises(IndexError):
        g.numpy()
    xs = x.numpy()
    want = ((xs - xs.max(-1, keepdims=True)).T + 1).T * 3
    np.testing.assert_allclose(c.numpy(), want, rtol=1e-6)  # computed before the error, as unfused
    with pytest.raises(braze.BrazeError):
        g.numpy()  # lost, and says why
    (p, storages), = runs
    assert len(p.offsets) >= 3
    assert all(storages[k].array is None for k in p.offsets), "no storage points into the arena"
    del c, g, storages, runs[:]
    gc.collect()  # the error (kept by g, which it poisoned) held the failed step's frames
    refs = sys.getrefcount(blocks[0]())  # outside the assert, which pytest rewrites into temporaries
    assert len(blocks) == 1 and refs == 2, "only the pool holds the block"
    c, g = prog(3)
    np.testing.assert_allclose(g.numpy(), np.exp(want.T)[[3, 3]], rtol=1e-6)
    assert blocks[1]() is blocks[0](), "the next run takes the same block"


def test_place_is_greedy_by_size_and_respects_lifetimes() -> None:
    offsets, top = arena.place({1: (0, 1), 2: (1, 2), 3: (2, 3), 4: (0, 3)}, {1: 100, 2: 1000, 3: 64, 4: 10})
    assert offsets[2] == 0  # biggest first
    assert offsets[1] == 1024 and offsets[3] == 1024  # 1 and 3 never meet: same bytes
    assert offsets[4] == 1152  # meets all of them: after 1 (100 bytes, padded to 128)
    assert top == 1216 and all(o % 64 == 0 for o in offsets.values())
    assert arena.place({}, {}) == ({}, 0)


def test_the_arena_block_is_aligned() -> None:
    for n in (10, 100_000, 1_000_000):
        a, address = memory.arena_at(n)
        assert a.ctypes.data == address and address % memory.ARENA_ALIGN == 0 and a.nbytes == n


def test_a_pool_allocation_says_its_address() -> None:
    """``allocate_at``'s address is its array's (kept per pool block, not asked of numpy),
    also for a block the pool hands out again, and 0 (unknown) for a small array."""
    for _ in range(3):
        for n in (70_000, 1_000_000, 10):
            a, address = memory.allocate_at(np.dtype(np.float32), n)
            assert address in (a.ctypes.data, 0) and (address != 0) == (4 * n >= 1 << 16)
            assert a.ctypes.data % (memory.BLOCK_ALIGN if address else 1) == 0 and a.size == n
            del a


def test_an_arrays_address_is_numpys_for_every_kind_of_array() -> None:
    """``memory.address_of`` (a ctypes view of the buffer where it can, numpy's own
    where not) gives numpy's address for writable, read-only, offset, strided and
    empty arrays, and for a read-only memory map."""
    base = np.arange(40, dtype=np.float32)
    ro = base.copy()
    ro.flags.writeable = False
    mapped = np.frombuffer(bytes(64), dtype=np.uint8)
    for a in (base, base[3:], base[::2], ro, ro[5:], base[:0], mapped, base.reshape(5, 8)[:, 1:]):
        assert memory.address_of(a) == a.ctypes.data


def test_a_program_key_is_its_tuple_wherever_it_is_hashed(new_processes: Any) -> None:
    """``plan._Program`` keeps its hash; equal to, and hashed as, the plain tuple, also
    unpickled in another process (whose strings hash otherwise)."""
    import pickle
    from braze.plan import _Program
    ops = (("mul", ("float32", "float32")), ("exp", ("float32",)))
    key = _Program(ops)
    assert key == ops and hash(key) == hash(ops) and {ops: 1}[key] == 1
    code = ("import pickle, sys\n"
            f"key = pickle.loads({pickle.dumps(key)!r})\n"
            f"print(hash(key) == hash({ops!r}), key == {ops!r}, type(key).__name__)\n")
    for out in new_processes(code):
        assert out.split() == ["True", "True", "_Program"]


def test_a_warm_cache_in_a_new_process_compiles_and_schedules_nothing(new_processes: Any) -> None:
    code = ("import braze, numpy as np\n"
            "from braze import plan\n"
            "x = braze.from_numpy(np.ones((256, 256), np.float32))\n"
            "def chain(a):\n"
            "    return (((a.T + 1).T * 3).T - 1)\n"
            "y = chain(x - x.amax(-1, keepdim=True)).numpy()\n"
            "(p,) = plan.stored_plans()\n"
            "print(braze.stats()['kernels_compiled'], len(p.offsets), p.arena_bytes, float(y[0, 0]))\n")
    first, second = (out.split() for out in new_processes(code))
    assert int(first[0]) >= 1 and int(second[0]) == 0
    assert first[1:] == second[1:] == ["3", str(2 * 256 * 256 * 4), "2.0"]


def test_every_dtype_pickles_to_its_singleton() -> None:
    """Stored plans pickle dtypes; a plan with a bool value (a mask) must be storable
    (it was not, and every new process scheduled attention again)."""
    import pickle
    from braze import dtypes
    for d in dtypes.ALL:
        assert pickle.loads(pickle.dumps(d)) is d


def test_the_stored_plan_path_does_not_depend_on_which_equal_tuples_are_one_object() -> None:
    """A layout memoised in one run (``x * 2``'s broadcast constant) shares its shape
    tuple with another operand's; made anew in the next run it does not. The key is
    equal either way, so the plan on disk must be found under the same name."""
    shape = (64, 64)
    shared = (("add", (), ((0, shape, (64, 1)), (1, shape, (0, 0)))),)
    apart = (("add", (), ((0, (64, 64), (64, 1)), (1, tuple([64, 64]), (0, 0)))),)
    assert shared == apart and shared[0][2][0][1] is shared[0][2][1][1] and apart[0][2][0][1] is not apart[0][2][1][1]
    assert plan._plan_path(shared) == plan._plan_path(apart)
