"""``braze.jit``: a traced call replayed gives what running the function gives, on new
data, for every way a call can differ (shapes, scalars, aliasing), and the function's
Python runs only when it must."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import braze
from braze.jit import REPROBE
from braze.nn import functional as F


def _attention(q: braze.Tensor, k: braze.Tensor, v: braze.Tensor, scale: float) -> braze.Tensor:
    return braze.softmax(q @ k.mT * scale, -1) @ v


def _arrays(seed: int, n_q: int = 3, n_kv: int = 50, d: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, n, d), dtype=np.float32) for n in (n_q, n_kv, n_kv)]


def _counted(fn: Any) -> tuple[Any, list[int]]:
    calls = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return fn(*args, **kwargs)
    return braze.jit(wrapped), calls


def test_a_replay_computes_on_the_new_inputs_without_running_the_function() -> None:
    jitted, calls = _counted(_attention)
    for seed in range(4):
        arrays = _arrays(seed)
        got = jitted(*[braze.from_numpy(a) for a in arrays], 0.25).numpy()
        want = _attention(*[braze.from_numpy(a) for a in arrays], 0.25).numpy()
        np.testing.assert_array_equal(got, want)
    assert calls[0] == 1


def test_a_replay_records_the_same_nodes_and_runs_the_same_kernels() -> None:
    jitted, _ = _counted(_attention)
    counts = []
    for seed in range(4):
        ts = [braze.from_numpy(a) for a in _arrays(seed)]
        braze.reset_stats()
        jitted(*ts, 0.25).numpy()
        st = braze.stats()
        counts.append((st["nodes_recorded"], st["kernel_launches"]))
    # The first call traces; the later ones replay the same program: recorded again, or,
    # once a replay was seen flushed alone, its plan run at once with nothing recorded.
    # (A trace that kept its intermediates alive until a garbage collection would make
    # the first plan store them: more kernels.)
    assert len({launches for _, launches in counts}) == 1, counts
    assert all(nodes in (counts[0][0], 0) for nodes, _ in counts), counts
    if braze.stream.fusion_enabled():  # the later calls restored the stream's form, or ran directly
        (rec,) = jitted.recordings.values()
        assert rec is not None and rec.form_copy is not None
        assert counts[-1][0] == 0
    else:
        assert all(nodes == counts[0][0] for nodes, _ in counts), counts


def _scaled_exp(a: braze.Tensor, s: float) -> braze.Tensor:
    return (a * s).exp() + 1


def test_a_replay_flushed_alone_runs_at_once_and_one_that_work_joins_stays_recorded() -> None:
    jitted, calls = _counted(_scaled_exp)
    rng = np.random.default_rng(5)
    fused = braze.stream.fusion_enabled()

    def step(joined: bool) -> tuple[int, int]:
        a = rng.standard_normal((4, 33), dtype=np.float32)
        braze.reset_stats()
        y = jitted(braze.from_numpy(a), 0.5)
        recorded = braze.stats()["nodes_recorded"]
        want = np.exp(a.astype(np.float64) * 0.5) + 1
        if joined:
            y = y * 2  # later work: fused with the replay's nodes when they are recorded
            want = want * 2
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
        return recorded, braze.stats()["kernel_launches"]

    alone = [step(False) for _ in range(4)]
    assert alone[-1] == ((0, 1) if fused else (3, alone[-1][1])), alone
    # Work joins it now: the direct runs go on until a probe records it and sees that,
    # then every call records its nodes again, and the multiply fuses with them.
    joined = [step(True) for _ in range(REPROBE + 2)]
    assert joined[-1] == (3, 1) if fused else joined[-1][0] == 3, joined
    assert calls[0] == 1


def test_a_direct_replay_writes_its_arguments_in_place_and_frees_what_it_made() -> None:
    def bump(a: braze.Tensor, b: braze.Tensor) -> braze.Tensor:
        a.add_(b)
        return (a * b).sum(-1)

    jitted, calls = _counted(bump)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        x, y = rng.standard_normal((2, 3, 17), dtype=np.float32)
        a, b = braze.from_numpy(x.copy()), braze.from_numpy(y)
        braze.reset_stats()
        live = braze.stats()["live_bytes"]
        got = jitted(a, b).numpy()
        np.testing.assert_allclose(got, ((x + y) * y).sum(-1), rtol=1e-5)
        np.testing.assert_allclose(a.numpy(), x + y, rtol=1e-6)
        del got
        assert braze.stats()["live_bytes"] == live  # nothing but the (dropped) result was made
    assert calls[0] == 1


def test_a_direct_replay_reads_and_writes_views_at_their_offsets() -> None:
    # The kernels' arguments start inside their storages (a view of the argument, a
    # slice of a captured table, the function's own slices): a direct replay takes
    # those offsets once per recording (plan.shifts) and adds them to each call's addresses.
    table = braze.from_numpy(np.linspace(-1, 1, 80, dtype=np.float32).reshape(2, 40))

    def fn(a: braze.Tensor) -> braze.Tensor:
        return (a[:, 1:] * table[1:, 5:37]).exp() + a[:, :-1]

    jitted, calls = _counted(fn)
    t = table.numpy().astype(np.float64)
    recorded = []
    for seed in range(6):
        big = np.random.default_rng(seed).standard_normal((5, 50)).astype(np.float32)
        view = braze.from_numpy(big)[1:4, 7:40]  # offset 57 elements, rows 50 apart
        braze.reset_stats()
        got = jitted(view).numpy()
        recorded.append(braze.stats()["nodes_recorded"])
        a = big[1:4, 7:40].astype(np.float64)
        np.testing.assert_allclose(got, np.exp(a[:, 1:] * t[1:, 5:37]) + a[:, :-1], rtol=1e-5)
    assert calls[0] == 1
    if braze.stream.fusion_enabled():
        assert recorded[-1] == 0, recorded  # ran directly


@pytest.mark.parametrize("change", ["shape", "scale", "negative_zero", "dtype", "strides", "aliasing", "kwarg"])
def test_a_call_that_differs_is_traced_anew(change: str) -> None:
    def fn(a: braze.Tensor, b: braze.Tensor, s: float = 1.0, *, bias: float = 0.0) -> braze.Tensor:
        return (a * s + b).exp() + bias

    jitted, calls = _counted(fn)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    base = dict(a=braze.from_numpy(x), b=braze.from_numpy(x + 1), s=0.0, bias=1.0)
    variants = {
        "shape": dict(a=braze.from_numpy(x[:1]), b=braze.from_numpy(x[:1])),
        "scale": dict(s=2.0),
        "negative_zero": dict(s=-0.0),
        "dtype": dict(a=braze.from_numpy(x.astype(np.float64)), b=braze.from_numpy(x.astype(np.float64) + 1)),
        "strides": dict(a=braze.from_numpy(np.ascontiguousarray(x.T)).T),
        "aliasing": dict(b=base["a"]),  # the same storage twice: one key of its own
        "kwarg": dict(bias=2.0),
    }
    call = {**base, **variants[change]}
    for kw in (base, call, base, call):
        a, b, s = kw["a"], kw["b"], kw["s"]
        got = jitted(a, b, s, bias=kw["bias"]).numpy()
        np.testing.assert_array_equal(got, fn(a, b, s, bias=kw["bias"]).numpy())
    assert calls[0] == 2


def test_nan_scalars_share_a_signature() -> None:
    jitted, calls = _counted(lambda x, s: x + s)
    x = braze.from_numpy(np.ones(3, dtype=np.float32))
    for _ in range(3):
        assert np.isnan(jitted(x, math.nan).numpy()).all()
    assert calls[0] == 1


def test_in_place_writes_to_arguments_and_reads_of_captured_tensors_replay() -> None:
    """A KV-cache-like write into an argument at a fixed slot, and a captured weight that
    the caller updates in place between calls: the replay writes the new argument and
    reads the weight's current values, as running the function would."""
    weight = braze.from_numpy(np.full((4,), 2.0, dtype=np.float32))

    def step(cache: braze.Tensor, x: braze.Tensor) -> braze.Tensor:
        cache[1] = x * weight
        return cache.sum(0)

    jitted, calls = _counted(step)
    for i in range(3):
        cache = braze.from_numpy(np.zeros((3, 4), dtype=np.float32))
        x = braze.from_numpy(np.full((4,), float(i + 1), dtype=np.float32))
        weight.fill_(float(i + 2))
        total = jitted(cache, x).numpy()
        expected = np.zeros((3, 4), dtype=np.float32)
        expected[1] = (i + 1) * (i + 2)
        np.testing.assert_array_equal(cache.numpy(), expected)
        np.testing.assert_array_equal(total, expected.sum(0))
    assert calls[0] == 1


def test_a_direct_replay_reads_captured_tensors_where_they_are_now() -> None:
    """A direct replay's kernels take the captured tensors' addresses once: a captured
    tensor computed lazily (pending when traced), updated in place between calls, or
    given another array (as a capture's shared outputs are) is read where it is now."""
    weight = braze.from_numpy(np.arange(5, dtype=np.float32)) * 2  # pending when traced
    jitted, calls = _counted(lambda x: x * weight + 1)
    fused = braze.stream.fusion_enabled()
    want = np.arange(5, dtype=np.float32) * 2
    for i in range(12):
        x = np.full((5,), float(i), dtype=np.float32)
        if i == 6:
            weight.add_(1.0)
            want = want + 1
        if i == 9:
            moved = np.full((5,), 7.0, dtype=np.float32)
            weight._storage.array = moved  # another array at another address
            want = moved.copy()
        braze.reset_stats()
        got = jitted(braze.from_numpy(x)).numpy()
        np.testing.assert_array_equal(got, x * want + 1)
        if fused and i in (5, 8, 11):
            assert braze.stats()["nodes_recorded"] == 0  # run directly
    assert calls[0] == 1


def test_the_fast_lane_checks_every_field_of_the_signature() -> None:
    """Calls of tensors alone that repeat a direct replay take the fast lane, which
    checks each argument against the signature field by field: any call that differs
    (dtype, shape, strides, offset, aliasing, read-only, a captured tensor) gives what
    running the function gives, and a write into a read-only argument is refused."""
    bias = braze.from_numpy(np.float32([0.5, -1.5, 2.0]))
    jitted, calls = _counted(lambda x, y: (x * y + bias).exp())
    rng = np.random.default_rng(11)
    fused = braze.stream.fusion_enabled()

    def check(x: braze.Tensor, y: braze.Tensor) -> None:
        want = np.exp(x.numpy().astype(np.float64) * y.numpy() + bias.numpy())
        np.testing.assert_allclose(jitted(x, y).numpy(), want, rtol=1e-5)

    def fresh(*shape: int) -> braze.Tensor:
        return braze.from_numpy(rng.standard_normal(shape, dtype=np.float32))

    for _ in range(4):
        check(fresh(2, 3), fresh(2, 3))
    assert (jitted.fast is not None) == fused
    braze.reset_stats()
    check(fresh(2, 3), fresh(2, 3))
    if fused:
        assert braze.stats()["nodes_recorded"] == 0 and braze.stats()["kernel_launches"] == 1
    a = fresh(4, 3)
    variants = [
        (a[:2], a[2:]),  # one storage for both, at two offsets
        (a[1:3], fresh(2, 3)),  # an offset
        (fresh(3, 2).T, fresh(2, 3)),  # strides
        (fresh(2, 3).to(braze.float64), fresh(2, 3)),  # a dtype
        (fresh(5, 3), fresh(5, 3)),  # a shape
        (bias.expand(2, 3), fresh(2, 3)),  # a captured tensor as an argument
    ]
    for x, y in variants:
        for _ in range(3):
            check(x, y)
            check(fresh(2, 3), fresh(2, 3))  # and back to the lane's own signature

    def bump(x: braze.Tensor, y: braze.Tensor) -> braze.Tensor:
        x.add_(y)
        return x * y
    jitted_bump = braze.jit(bump)
    for i in range(6):
        data = rng.standard_normal((2, 3), dtype=np.float32)
        x, y = braze.from_numpy(data.copy()), braze.from_numpy(data.copy())
        np.testing.assert_allclose(jitted_bump(x, y).numpy(), 2 * data * data, rtol=1e-6)
    same = braze.from_numpy(data.copy())  # aliased arguments: the write is read back
    np.testing.assert_allclose(jitted_bump(same, same).numpy(), 4 * data * data, rtol=1e-6)

    def scale(x: braze.Tensor) -> braze.Tensor:
        x.mul_(2.0)
        return x[0]  # a view of the argument
    jitted_scale = braze.jit(scale)
    for i in range(5):
        data = rng.standard_normal((2, 3), dtype=np.float32)
        x = braze.from_numpy(data.copy())
        np.testing.assert_array_equal(jitted_scale(x).numpy(), data[0] * 2)
        np.testing.assert_array_equal(x.numpy(), data * 2)
    frozen = braze.from_numpy(np.ones((2, 3), dtype=np.float32))
    frozen._storage.readonly = True
    with pytest.raises(braze.errors.BrazeError):
        jitted_scale(frozen)
    np.testing.assert_array_equal(frozen.numpy(), 1.0)


def test_the_fast_lane_takes_values_and_gives_what_the_function_returns() -> None:
    """Plain values beside the tensors are checked by their key (a float by its bits,
    an int apart from a float or a bool), results keep their structure, and a function
    that returns nothing runs once a call (its in-place write is not done twice)."""
    jitted, calls = _counted(lambda x, s, n: (x * s, (x - s).abs() + n))
    rng = np.random.default_rng(12)
    fused = braze.stream.fusion_enabled()
    for s, n in [(2.0, 1)] * 5 + [(3.0, 1), (2.0, True), (2.0, 1.0), (-0.0, 1), (0.0, 1), (2.0, 1)] * 3:
        data = rng.standard_normal((3, 4), dtype=np.float32)
        got = jitted(braze.from_numpy(data), s, n)
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_array_equal(got[0].numpy(), data * s)
        np.testing.assert_array_equal(np.signbit(got[0].numpy()), np.signbit(data * s))  # -0.0 is not 0.0
        np.testing.assert_allclose(got[1].numpy(), np.abs(data - s) + n, rtol=1e-6)
        assert got[1].dtype is braze.float32
    assert calls[0] == 6 and (jitted.fast is not None) == fused

    def scale(x: braze.Tensor, s: float) -> None:
        x.mul_(s)
    jitted_scale = braze.jit(scale)
    x = braze.from_numpy(np.ones((2, 3), dtype=np.float32))
    for i in range(8):
        assert jitted_scale(x, 2.0) is None
        np.testing.assert_array_equal(x.numpy(), 2.0 ** (i + 1))


def test_a_read_only_argument_is_its_own_signature() -> None:
    """A write into an argument, traced with a writable tensor, is refused for a
    read-only one (an mmapped weight) as running the function would refuse it."""
    def write(x: braze.Tensor) -> braze.Tensor:
        x[0] = 1.0
        return x

    jitted = braze.jit(write)
    jitted(braze.from_numpy(np.zeros(3, dtype=np.float32))).numpy()
    frozen = np.zeros(3, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(braze.BrazeError):
        jitted(braze.from_numpy(frozen))


def test_results_keep_their_structure() -> None:
    def fn(x: braze.Tensor) -> Any:
        values, indices = x.max(-1)
        return (values, [x.T, 3, None], x.sort(-1))

    jitted = braze.jit(fn)
    for seed in range(3):
        x = braze.from_numpy(np.random.default_rng(seed).standard_normal((3, 5)).astype(np.float32))
        values, (xt, three, none), srt = jitted(x)
        np.testing.assert_array_equal(values.numpy(), x.numpy().max(-1))
        assert xt.shares_storage(x) and xt.shape == (5, 3)  # a view of the argument stays one
        assert three == 3 and none is None
        assert isinstance(srt, braze.ValuesIndices)
        np.testing.assert_array_equal(srt.values.numpy(), np.sort(x.numpy(), -1))


def test_recording_behind_other_nodes_replays_node_by_node() -> None:
    """A replay into a stream that already holds nodes cannot restore a form made from an
    empty one; it records each node, and the whole stream still fuses and agrees."""
    jitted, calls = _counted(_attention)
    for seed in range(3):
        q, k, v = (braze.from_numpy(a) for a in _arrays(seed))
        q2 = q * 2.0  # pending: recorded before the call
        got = (jitted(q2, k, v, 0.25) + 1.0).numpy()
        want = (_attention(q * 2.0, k, v, 0.25) + 1.0).numpy()
        np.testing.assert_array_equal(got, want)
    assert calls[0] == 1


def test_a_function_that_syncs_runs_without_replay_and_says_so_once(capfd: Any) -> None:
    def fn(x: braze.Tensor) -> braze.Tensor:
        return x * 2.0 if x.sum().item() > 0 else x * 3.0  # Python that depends on data

    jitted, calls = _counted(fn)
    for sign in (1, -1, 1):
        x = braze.from_numpy(np.full(3, sign, dtype=np.float32))
        np.testing.assert_array_equal(jitted(x).numpy(), fn(x).numpy())
    assert calls[0] == 3
    err = capfd.readouterr().err
    assert err.count("read tensor data while traced") == 1, err


def test_reading_a_computed_tensor_while_traced_is_seen(capfd: Any) -> None:
    """``.item()`` on an argument that is already computed flushes nothing, and indexing
    with a tensor reads its values while recording: both make the Python depend on
    data, so neither call is replayed."""
    def branch(x: braze.Tensor, n: braze.Tensor) -> braze.Tensor:
        return x * 2.0 if n.item() > 0 else x * 3.0

    def take(x: braze.Tensor, i: braze.Tensor) -> braze.Tensor:
        return x[i] * 1.0

    jb, jt = braze.jit(branch), braze.jit(take)
    x = braze.from_numpy(np.arange(5, dtype=np.float32))
    for n, i in ((1.0, [0, 1]), (-1.0, [3, 4])):
        n_t = braze.from_numpy(np.array(n, dtype=np.float32))
        i_t = braze.from_numpy(np.array(i, dtype=np.int64))
        np.testing.assert_array_equal(jb(x, n_t).numpy(), branch(x, n_t).numpy())
        np.testing.assert_array_equal(jt(x, i_t).numpy(), take(x, i_t).numpy())
    assert list(jb.recordings.values()) == [None] and list(jt.recordings.values()) == [None]
    assert capfd.readouterr().err.count("read tensor data while traced") == 2


def test_an_argument_that_is_a_captured_tensor_is_not_replayed() -> None:
    """Traced with an argument apart from the weight it adds, called with the weight
    itself: the recording would read the argument for both, so the function runs."""
    w = braze.from_numpy(np.array([10.0, 20.0, 30.0], dtype=np.float32))
    jitted, calls = _counted(lambda x: x + w)
    y = braze.from_numpy(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    for arg in (y, w, w, y):
        np.testing.assert_array_equal(jitted(arg).numpy(), (arg.numpy() + w.numpy()))
    assert calls[0] == 3  # the trace, and both calls with the weight


def test_tensors_made_inside_are_new_on_every_call() -> None:
    """``braze.empty`` written in place and ``braze.tensor`` returned: each replay gets
    its own, with the data the function made, as each call of the function does."""
    def fill(x: braze.Tensor) -> braze.Tensor:
        out = braze.empty(3)
        out.copy_(x * 2.0)
        return out

    def mask(x: braze.Tensor) -> tuple[braze.Tensor, braze.Tensor]:
        m = braze.tensor([1.0, 0.0, 1.0])
        return x * m, m

    jf, jm = braze.jit(fill), braze.jit(mask)
    outs = [jf(braze.from_numpy(np.full(3, float(i), dtype=np.float32))) for i in (1, 2, 3)]
    for i, out in zip((1, 2, 3), outs):
        np.testing.assert_array_equal(out.numpy(), [2.0 * i] * 3)
    assert not outs[0].shares_storage(outs[1])
    x = braze.from_numpy(np.ones(3, dtype=np.float32))
    for _ in range(3):
        y, m = jm(x)
        np.testing.assert_array_equal(y.numpy(), [1.0, 0.0, 1.0])
        m.fill_(5.0)  # the caller's write to a returned tensor reaches no later call


def test_numpy_scalars_key_by_their_bits() -> None:
    jitted, calls = _counted(lambda x, s: x * s)
    x = braze.from_numpy(np.ones(2, dtype=np.float32))
    with np.errstate(divide="ignore"):
        assert (1 / jitted(x, np.float32(0.0)).numpy() > 0).all()
        assert (1 / jitted(x, np.float32(-0.0)).numpy() < 0).all()
    for _ in range(2):
        assert np.isnan(jitted(x, np.float32("nan")).numpy()).all()
    assert calls[0] == 3


def test_objects_key_by_identity_and_take_their_recordings_with_them() -> None:
    """Two modules that compare equal are still two keys (their weights differ), and a
    module that goes away takes its recordings (and the weights they captured) along."""
    import gc
    import weakref

    class Scale:
        def __init__(self, s: float) -> None:
            self.w = braze.from_numpy(np.full(2, s, dtype=np.float32))

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scale)

        def __hash__(self) -> int:
            return 0

        @braze.jit
        def __call__(self, x: braze.Tensor) -> braze.Tensor:
            return x * self.w

    x = braze.from_numpy(np.ones(2, dtype=np.float32))
    a, b = Scale(2.0), Scale(3.0)
    np.testing.assert_array_equal(a(x).numpy(), [2.0, 2.0])
    np.testing.assert_array_equal(b(x).numpy(), [3.0, 3.0])
    weight = weakref.ref(b.w._storage)
    assert len(Scale.__call__.recordings) == 2
    del b
    gc.collect()
    assert len(Scale.__call__.recordings) == 1 and weight() is None


def test_an_argument_returned_is_the_same_object() -> None:
    def bump(x: braze.Tensor) -> tuple[braze.Tensor, braze.Tensor]:
        return x.add_(1.0), x

    jitted = braze.jit(bump)
    for _ in range(3):
        x = braze.from_numpy(np.zeros(2, dtype=np.float32))
        a, b = jitted(x)
        assert a is x and b is x
        np.testing.assert_array_equal(x.numpy(), [1.0, 1.0])


def test_a_form_copy_from_a_cleared_trie_is_taken_again() -> None:
    from braze import plan
    if not braze.stream.fusion_enabled():
        pytest.skip("the form is the fused executor's")
    jitted = braze.jit(lambda x: (x + 1.0).exp())
    x = braze.from_numpy(np.ones(4, dtype=np.float32))
    for _ in range(2):
        jitted(x).numpy()
    (rec,) = jitted.recordings.values()
    assert rec is not None and rec.form_copy is not None
    plan.clear()
    for _ in range(3):
        np.testing.assert_allclose(jitted(x).numpy(), np.exp(2.0), rtol=1e-6)
    assert rec.form_copy is not None and rec.form_copy.root is plan.plan_trie.root


def test_unhashable_arguments_and_other_results_run_without_replay(capfd: Any) -> None:
    jitted, calls = _counted(lambda x, opts: x * opts["k"])
    x = braze.from_numpy(np.ones(2, dtype=np.float32))
    for k in (2.0, 3.0):
        np.testing.assert_array_equal(jitted(x, {"k": k}).numpy(), [k, k])
    assert calls[0] == 2
    odd, odd_calls = _counted(lambda x: {"y": x + 1.0})
    for _ in range(2):
        np.testing.assert_array_equal(odd(x)["y"].numpy(), [2.0, 2.0])
    assert odd_calls[0] == 2
    err = capfd.readouterr().err
    assert err.count("cannot key a call") == 1 and err.count("it returned a dict") == 1, err


def test_errors_are_raised_on_every_call_and_nothing_is_kept() -> None:
    jitted, calls = _counted(lambda a, b: a @ b)
    a = braze.from_numpy(np.ones((2, 3), dtype=np.float32))
    for _ in range(2):
        with pytest.raises(braze.ShapeMismatch):
            jitted(a, a)
    assert calls[0] == 2 and not jitted.recordings


def test_a_replay_checks_the_memory_budget_and_records_nothing_past_it() -> None:
    jitted = braze.jit(lambda x: (x + 1.0).exp())
    x = braze.from_numpy(np.ones(1024, dtype=np.float32))
    jitted(x).numpy()
    braze.synchronize()
    before = braze.stats()["nodes_recorded"]
    limit = braze.memory_limit()
    braze.set_memory_limit(braze.stats()["live_bytes"] + 100)
    try:
        with pytest.raises(braze.OutOfMemory) as info:
            jitted(x)
    finally:
        braze.set_memory_limit(limit)
    assert info.value.op == "add" and braze.stats()["nodes_recorded"] == before


def test_a_method_keys_by_its_object() -> None:
    class Scale:
        def __init__(self, s: float) -> None:
            self.w = braze.from_numpy(np.full(2, s, dtype=np.float32))

        @braze.jit
        def __call__(self, x: braze.Tensor) -> braze.Tensor:
            return x * self.w

    x = braze.from_numpy(np.ones(2, dtype=np.float32))
    two, three = Scale(2.0), Scale(3.0)
    for _ in range(2):
        np.testing.assert_array_equal(two(x).numpy(), [2.0, 2.0])
        np.testing.assert_array_equal(three(x).numpy(), [3.0, 3.0])


def test_sdpa_is_jitted_and_replays_into_one_kernel() -> None:
    """``scaled_dot_product_attention`` is written from primitive ops under ``jit``: a
    decoding step replays its recording and still fuses into one kernel."""
    rng = np.random.default_rng(3)
    k, v = (braze.from_numpy(rng.standard_normal((1, 2, 300, 16), dtype=np.float32)) for _ in "kv")
    for _ in range(4):
        q = braze.from_numpy(rng.standard_normal((1, 8, 1, 16), dtype=np.float32))
        braze.reset_stats()
        got = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).numpy()
        if braze.stream.fusion_enabled():
            assert braze.stats()["kernel_launches"] == 1
        qn, kn, vn = q.numpy().reshape(1, 2, 4, 16), k.numpy(), v.numpy()
        s = qn @ kn.swapaxes(-1, -2) / 4.0
        p = np.exp(s - s.max(-1, keepdims=True))
        want = ((p / p.sum(-1, keepdims=True)) @ vn).reshape(1, 8, 1, 16)
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    assert len(F.scaled_dot_product_attention.recordings) >= 1


def test_the_fast_lane_rearms_after_its_direct_run_is_replaced() -> None:
    """Once the recording's direct run is rebuilt (its plan evicted, or the plan
    cache cleared), the lane made for the old one must be replaced, not kept missing."""
    if not braze.stream.fusion_enabled():
        pytest.skip("direct replays are fused only")
    f = braze.jit(lambda x: (x * 2).exp() + 1)

    def call() -> None:
        f(braze.from_numpy(np.ones(7, dtype=np.float32))).numpy()
    for _ in range(6):
        call()
    braze.plan.clear()  # as an eviction under BRAZE_PLAN_CAP would
    for _ in range(10):
        call()
    (rec,) = f.recordings.values()
    assert rec is not None and rec.direct is not None
    assert f.fast is not None and f.fast.direct is rec.direct  # the lane of the run in use


def test_a_direct_run_does_not_keep_a_replaced_captured_array_alive() -> None:
    """A captured tensor given another array: the old one is freed as before
    (the direct run's launch check must not hold it)."""
    import gc
    import weakref
    w = braze.from_numpy(np.ones(1 << 16, dtype=np.float32))
    f = braze.jit(lambda x: x * w + 1)
    for _ in range(6):
        f(braze.from_numpy(np.ones(1 << 16, dtype=np.float32))).numpy()
    old = weakref.ref(w._storage.array)
    w._storage.array = np.full(1 << 16, 2.0, dtype=np.float32)
    gc.collect()
    assert old() is None


def test_the_c_lane_takes_a_direct_replay_and_steps_aside_for_any_change(monkeypatch: Any) -> None:
    """The fast lane's C guard-and-run (runtime/lane.c) takes the calls the Python lane
    takes, with the same result and counters; any state it was built in that changes (a
    pending stream, a memory budget, the plan cache cleared, a kernel swapped, a value's
    bits) makes it step aside, and the call still gives what the function gives."""
    import ctypes
    import sysconfig
    from pathlib import Path

    from braze.jit import _MISS
    from braze.runtime import lane
    if not braze.stream.fusion_enabled():
        pytest.skip("direct replays are fused only")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers: jit keeps its Python lane")
    assert lane.available()
    f = braze.jit(lambda x, s: (x * s).exp() + s)
    rng = np.random.default_rng(21)
    data = rng.standard_normal((4, 5), dtype=np.float32)
    x = braze.from_numpy(data)

    def want(s: float) -> np.ndarray:
        return np.exp(data * np.float32(s)) + np.float32(s)
    for _ in range(4):
        f(x, 0.5).numpy()
    fast = f.fast
    assert fast is not None and fast.native is not None
    taken: list[bool] = []
    real = fast.native

    def watched(args: tuple[Any, ...]) -> Any:
        out = real(args)
        taken.append(out is not _MISS)
        return out
    fast.native = watched

    def call(s: float = 0.5) -> None:
        np.testing.assert_allclose(f(x, s).numpy(), want(s), rtol=1e-6)

    (rec,) = [r for r in f.recordings.values() if r is not None]
    rec.direct_runs = 0  # (no reprobe among the next calls)
    braze.reset_stats()
    call()
    assert taken == [True]
    stats = braze.stats()
    assert stats["nodes_recorded"] == 0 and stats["kernel_launches"] == 1 and stats["flushes"] == 1

    taken.clear()
    pending = x * 3.0  # the stream holds a node: the call must join it, not run alone
    call()
    np.testing.assert_allclose(pending.numpy(), data * 3, rtol=1e-6)
    braze.set_memory_limit(1 << 30)
    try:
        call()
    finally:
        braze.set_memory_limit(None)
    call(-0.0)  # another value by its bits: another signature
    assert taken[:3] == [False, False, False]

    for _ in range(3):
        call()
    taken.clear()
    step = f.fast.direct.plan.steps[0]
    kernel = step.fn
    # the same kernel through another function object, as a whole module's swaps it in (runtime/units.py)
    step.fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(ctypes.cast(kernel, ctypes.c_void_p).value)
    call()
    assert taken == [False]  # its Python lane ran it, and armed the C lane anew
    assert f.fast.native is not watched and f.fast.native is not None
    call()

    braze.plan.clear()
    for _ in range(6):
        call()
    assert f.fast is not None and f.fast.native is not None and f.fast.direct is rec.direct

    nan, other_nan = float("nan"), -float("nan")  # one value to jit's key (float.hex), whatever the bits
    for _ in range(5):
        assert np.isnan(f(x, nan).numpy()).all()
    fast = f.fast
    assert fast is not None and fast.native is not None
    native = fast.native
    got = native((x, other_nan))
    assert got is not _MISS and np.isnan(got.numpy()).all()


def test_the_c_lane_is_not_made_where_it_cannot_take_the_call(monkeypatch: Any) -> None:
    """Without the C lane (no compiler or headers) jit keeps its Python lane, which
    gives the same results."""
    from braze.runtime import lane
    if not braze.stream.fusion_enabled():
        pytest.skip("direct replays are fused only")
    monkeypatch.setattr(lane, "available", lambda: False)
    f = braze.jit(lambda x, s: (x * s).exp() + s)
    data = np.random.default_rng(22).standard_normal((4, 5), dtype=np.float32)
    for _ in range(6):
        np.testing.assert_allclose(f(braze.from_numpy(data), 0.25).numpy(), np.exp(data * 0.25) + 0.25, rtol=1e-6)
    assert f.fast is not None and f.fast.native is None
    g = braze.jit(lambda x, s: x * float(s))
    monkeypatch.undo()
    for _ in range(6):  # a value of a type the C lane does not compare (a numpy scalar): the Python lane alone
        np.testing.assert_allclose(g(braze.from_numpy(data), np.float32(2.0)).numpy(), data * 2, rtol=1e-6)
    assert g.fast is not None and g.fast.native is None


def test_probes_grow_apart_while_a_direct_replay_stays_alone() -> None:
    """A direct replay is probed (recorded, to see whether later work joins it) at its
    64th call, then its 128th, 256th ... up to every REPROBE_MAX-th while it stays
    alone: a probe costs a recording and a flush. Work that joins it is found by the
    next probe, after which every call records again (and fuses with the work); alone
    again, the probes start again at the first interval."""
    from braze.jit import REPROBE_MAX
    if not braze.stream.fusion_enabled():
        pytest.skip("direct replays are fused only")
    f = braze.jit(lambda x: (x * 2).exp() + 1)
    x = braze.from_numpy(np.ones((4, 33), dtype=np.float32))

    def call(joined: bool = False) -> tuple[bool, int]:
        before = braze.stats()
        y = f(x)
        recorded = braze.stats()["nodes_recorded"] != before["nodes_recorded"]
        np.testing.assert_allclose((y * 2 if joined else y).numpy(), (np.exp(2.0) + 1) * (2 if joined else 1), rtol=1e-6)
        return recorded, braze.stats()["kernel_launches"] - before["kernel_launches"]

    probes = [i for i in range(3000) if call()[0]]
    late = [i for i in probes if i > 8]  # (the trace, and a first replay where its plan was not stored yet)
    gaps = np.diff(late).tolist()
    assert gaps[0] == REPROBE and all(b == min(2 * a, REPROBE_MAX) for a, b in zip(gaps, gaps[1:])), probes
    assert len(probes) <= 2 + 1 + 5 + 2  # 64, 128, ..., 1024, then every 1024: against 46 at a fixed 64
    for i in range(REPROBE_MAX + 2):  # work joins: the next probe sees it
        if call(joined=True)[1] == 1:  # one kernel: the replay's nodes fused with the multiply
            break
    else:
        raise AssertionError("work joining the call never fused with it")
    assert [call(joined=True)[1] for _ in range(5)] == [1] * 5
    again = [i for i in range(3 * REPROBE) if call()[0]]
    assert again[0] <= 1 and any(REPROBE - 2 <= i - again[0] <= REPROBE + 2 for i in again[1:]), again
