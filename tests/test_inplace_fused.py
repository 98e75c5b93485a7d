"""In-place writes stored by the group that computes what they write (schedule/inplace.py).

Each program writes into a tensor computed in the same flush or given to it, and reads
it before and after the write, through the view written and through others. Its results
(and the given tensors, which writes change) must equal numpy's and the reference
executor's; where the write fuses, the plan takes the steps it should.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
from braze.runtime.cpu import compiler_available

Program = Callable[..., Any]


def _x(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(fn: Program, args: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """The program's results then its (possibly written) inputs, and the steps it took."""
    ts = [braze.tensor(a.copy()) for a in args]
    braze.synchronize()
    braze.reset_stats()
    out = fn(*ts)
    outs = list(out) if isinstance(out, tuple) else [out]
    got = [o.numpy().copy() for o in outs] + [t.numpy().copy() for t in ts]
    return got, braze.stats()["kernel_launches"]


# -- the programs, each with its numpy twin (which writes its copies of the inputs) --------

def slice_assign_pending(x: Any) -> Any:
    y = x * 2
    y[:, :3] = x[:, 3:6] + 1
    return y, y.sum(-1)


def slice_assign_pending_np(x: np.ndarray) -> Any:
    y = x * 2
    y[:, :3] = x[:, 3:6] + 1
    return y, y.sum(-1)


def masked_write_given(x: Any) -> Any:
    x[x > 0.5] = -1.0
    return x.sum(-1)


def masked_write_given_np(x: np.ndarray) -> Any:
    x[x > 0.5] = -1.0
    return x.sum(-1)


def masked_write_pending(x: Any) -> Any:
    y = x.exp()
    y[y > 1.5] = 0.0
    return y.softmax(-1)


def masked_write_pending_np(x: np.ndarray) -> Any:
    y = np.exp(x)
    y[y > 1.5] = 0.0
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def masked_fill_given(x: Any) -> Any:
    return x.masked_fill_(x < 0, 0.25) * 3


def masked_fill_given_np(x: np.ndarray) -> Any:
    x[x < 0] = 0.25
    return x * 3


def iadd_pending(x: Any, b: Any) -> Any:
    y = x.exp()
    y += b
    return y


def iadd_pending_np(x: np.ndarray, b: np.ndarray) -> Any:
    return np.exp(x) + b


def iadd_after_matmul(x: Any, w: Any, b: Any) -> Any:  # a linear layer's bias, in place
    y = x @ w
    y += b
    return y.relu()


def iadd_after_matmul_np(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> Any:
    return np.maximum(x @ w + b, 0)


def view_of_target(x: Any) -> Any:
    y = x * 2
    v = y[1:]  # a view taken before the write sees it
    t = y.T
    y.add_(1.0)
    return v, t * 3


def view_of_target_np(x: np.ndarray) -> Any:
    y = x * 2 + 1
    return y[1:], y.T * 3


def read_before_write(x: Any) -> Any:
    y = x * 2
    s = y.sum(-1)  # the old values
    first = y[:, 0] * 1
    y.mul_(3.0)
    return s, first, y, y.sum(-1)


def read_before_write_np(x: np.ndarray) -> Any:
    y = x * 2
    return y.sum(-1), y[:, 0] * 1, y * 3, (y * 3).sum(-1)


def read_before_write_given(x: Any) -> Any:
    old = x * 1
    x += 1.0
    return old, x * 2


def read_before_write_given_np(x: np.ndarray) -> Any:
    old = x * 1
    x += 1.0
    return old, x * 2


def repeated_writes(x: Any) -> Any:
    x += 1.0
    x *= 2.0
    x[x > 2.5] = 0.0
    x.clamp_(-1.0, 2.0)
    return x.sum(-1)


def repeated_writes_np(x: np.ndarray) -> Any:
    x += 1.0
    x *= 2.0
    x[x > 2.5] = 0.0
    np.clip(x, -1.0, 2.0, out=x)
    return x.sum(-1)


def two_views(x: Any) -> Any:
    y = x * 2
    flat = y.view(-1)
    row = y[1]
    flat += 1.0  # through one view ...
    return row * 3, y  # ... read through another


def two_views_np(x: np.ndarray) -> Any:
    y = x * 2 + 1
    return y[1] * 3, y


def overlapping_views_given(x: Any) -> Any:
    a, b = x[0:2], x[1:3]
    a += 1.0
    return b * 1


def overlapping_views_given_np(x: np.ndarray) -> Any:
    x[0:2] += 1.0
    return x[1:3] * 1


def shifted_read(x: Any) -> Any:  # reads elements of the target other than those written
    y = x * 2
    y[:, :3] += y[:, 3:6]
    y[1:] = y[:-1] * 2
    return y


def shifted_read_np(x: np.ndarray) -> Any:
    y = x * 2
    y[:, :3] += y[:, 3:6]
    y[1:] = y[:-1] * 2
    return y


def shifted_read_given(x: Any) -> Any:
    x[:, :3] += x[:, 3:6]
    return x * 1


def shifted_read_given_np(x: np.ndarray) -> Any:
    x[:, :3] += x[:, 3:6]
    return x * 1


def row_value_into_read_target(x: Any) -> Any:
    x[:, :1] = x.sum(-1, keepdim=True)
    return x.exp()


def row_value_into_read_target_np(x: np.ndarray) -> Any:
    x[:, :1] = x.sum(-1, keepdims=True)
    return np.exp(x)


def row_value_in_place(x: Any) -> Any:  # T5's norm scale, in place on the mean
    return x.pow(2).mean(-1, keepdim=True).add_(1e-6).rsqrt_()


def row_value_in_place_np(x: np.ndarray) -> Any:
    return 1 / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)


def softmax_plus_old(x: Any) -> Any:  # the store reads the old x: no stash into x
    return x.copy_(x.softmax(-1) + x)


def softmax_plus_old_np(x: np.ndarray) -> Any:
    e = np.exp(x - x.max(-1, keepdims=True))
    x[...] = e / e.sum(-1, keepdims=True) + x
    return x


def max_after_masked_write(x: Any, m: Any) -> Any:  # sentence-transformers' max pooling
    x[m.unsqueeze(-1).expand(x.size()) == 0] = -1e9
    return braze.max(x, 1)[0]


def max_after_masked_write_np(x: np.ndarray, m: np.ndarray) -> Any:
    x[np.broadcast_to(m[:, :, None], x.shape) == 0] = -1e9
    return x.max(1)


def two_targets(x: Any, y: Any) -> Any:  # the second write's value reads x as it was before the first
    u = x * 3 + y
    x.copy_(y * 2)
    y.copy_(u)
    return x, y


def two_targets_np(x: np.ndarray, y: np.ndarray) -> Any:
    u = x * 3 + y
    x[...] = y * 2
    y[...] = u
    return x.copy(), y.copy()


def gather_after_write(x: Any, idx: Any) -> Any:  # picks written elements, never recomputes them
    x += 1.0
    return x.gather(-1, idx) * 2


def gather_after_write_np(x: np.ndarray, idx: np.ndarray) -> Any:
    x += 1.0
    return np.take_along_axis(x, idx, -1) * 2


def cumsum_in_place(x: Any) -> Any:
    return x.copy_(x.cumsum(-1) + x)


def cumsum_in_place_np(x: np.ndarray) -> Any:
    x[...] = np.cumsum(x, -1) + x
    return x


def half_masked_write(x: Any) -> Any:
    x[x > 0.5] = 0.25
    return x


def half_masked_write_np(x: np.ndarray) -> Any:
    x[x > 0.5] = 0.25
    return x


def scalar_in_place(x: Any) -> Any:
    s = x.sum()
    s += 1.0
    return s * 2


def scalar_in_place_np(x: np.ndarray) -> Any:
    return (x.astype(np.float64).sum() + 1) * 2


def _mask() -> np.ndarray:
    m = np.ones((3, 7), np.int64)
    m[1, 4:] = 0
    m[2, 2:] = 0
    return m


#: name -> (program, numpy twin, inputs, steps when fused: None where not counted)
CASES: dict[str, tuple[Program, Program, list[np.ndarray], int | None]] = {
    "slice_assign_pending": (slice_assign_pending, slice_assign_pending_np, [_x(4, 8)], None),
    "masked_write_given": (masked_write_given, masked_write_given_np, [_x(5, 40)], 1),
    "masked_write_given_large": (masked_write_given, masked_write_given_np, [_x(64, 2048)], 1),
    "masked_write_pending": (masked_write_pending, masked_write_pending_np, [_x(6, 33)], 1),
    "masked_fill_given": (masked_fill_given, masked_fill_given_np, [_x(3, 16)], 1),
    "iadd_pending": (iadd_pending, iadd_pending_np, [_x(4, 8), _x(8, seed=1)], 1),
    "iadd_after_matmul": (iadd_after_matmul, iadd_after_matmul_np, [_x(4, 8), _x(8, 5, seed=1), _x(5, seed=2)], 2),
    "view_of_target": (view_of_target, view_of_target_np, [_x(4, 6)], None),
    "read_before_write": (read_before_write, read_before_write_np, [_x(4, 6)], None),
    "read_before_write_given": (read_before_write_given, read_before_write_given_np, [_x(4, 6)], 1),
    "repeated_writes": (repeated_writes, repeated_writes_np, [_x(4, 6)], 1),
    "two_views": (two_views, two_views_np, [_x(4, 6)], None),
    "overlapping_views_given": (overlapping_views_given, overlapping_views_given_np, [_x(3, 5)], None),
    "shifted_read": (shifted_read, shifted_read_np, [_x(4, 6)], None),
    "shifted_read_given": (shifted_read_given, shifted_read_given_np, [_x(4, 6)], None),
    "row_value_into_read_target": (row_value_into_read_target, row_value_into_read_target_np, [_x(4, 6)], None),
    "row_value_in_place": (row_value_in_place, row_value_in_place_np, [_x(6, 64)], 1),
    "softmax_plus_old": (softmax_plus_old, softmax_plus_old_np, [_x(4, 300)], 1),
    "two_targets": (two_targets, two_targets_np, [_x(4, 6), _x(4, 6, seed=1)], 1),
    "gather_after_write": (gather_after_write, gather_after_write_np,
                           [_x(8, 64), np.random.default_rng(3).integers(0, 64, (8, 64))], 2),
    "cumsum_in_place": (cumsum_in_place, cumsum_in_place_np, [_x(4, 300)], 1),
    "half_masked_write": (half_masked_write, half_masked_write_np, [_x(4, 40).astype(np.float16)], 1),
    "scalar_in_place": (scalar_in_place, scalar_in_place_np, [_x(5, 7)], 1),
    "max_after_masked_write": (max_after_masked_write, max_after_masked_write_np, [_x(3, 7, 16), _mask()], 1),
}


def _check(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, np.asarray(w, dtype=g.dtype), rtol=1e-5, atol=1e-5, err_msg=f"{what} {i}")


@pytest.mark.parametrize("name", CASES)
def test_against_numpy_and_reference(name: str, monkeypatch: Any) -> None:
    fn, twin, args, _ = CASES[name]
    copies = [a.copy() for a in args]
    out = twin(*copies)
    want = (list(out) if isinstance(out, tuple) else [out]) + copies
    _check(_run(fn, args)[0], want, "numpy")  # as the suite runs (fused, or BRAZE_FUSION=0)
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        ref, _ = _run(fn, args)
    _check(ref, want, "reference")


@pytest.mark.skipif(not compiler_available(), reason="no C compiler")
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[3] is not None])
def test_fused_write_takes_no_step_of_its_own(name: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")
    fn, twin, args, steps = CASES[name]
    for _ in range(2):  # planned, then replayed
        got, taken = _run(fn, args)
        copies = [a.copy() for a in args]
        out = twin(*copies)
        _check(got, (list(out) if isinstance(out, tuple) else [out]) + copies, "fused")
        assert taken == steps


@pytest.mark.skipif(not compiler_available(), reason="no C compiler")
def test_a_write_at_a_moving_offset_replays_one_plan(monkeypatch: Any) -> None:
    """The target's offset is given at run time: writes into rows i of one given tensor
    replay one plan, each into its own row."""
    monkeypatch.setenv("BRAZE_FUSION", "1")
    a = _x(4, 6)
    x = braze.tensor(a.copy())
    braze.synchronize()
    braze.reset_stats()
    for i in range(4):
        row = x[i]
        row[row > 0] = 2.0
        braze.synchronize()
    assert braze.stats()["plan_hits"] == 3
    want = a.copy()
    for i in range(4):
        want[i][want[i] > 0] = 2.0
    np.testing.assert_array_equal(x.numpy(), want)


# -- random programs of writes and reads through views of one tensor ------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: views of a (4, 6) tensor, the same on a braze tensor and a numpy array
VIEWS: list[Callable[[Any], Any]] = [
    lambda t: t, lambda t: t[1:3], lambda t: t[:, 2:5], lambda t: t.T, lambda t: t[2],
    lambda t: t.reshape(24)[5:17], lambda t: t[0], lambda t: t[:, 0:3], lambda t: t[:, 3:6],
    lambda t: t[0:3], lambda t: t[1:4], lambda t: t.reshape(24)[0:19], lambda t: t.reshape(24)[5:24],
]
#: (destination view, source view) of one shape: a write of values read elsewhere (some overlapping)
PAIRS = [(4, 6), (6, 4), (7, 8), (8, 7), (1, 1), (0, 0), (9, 10), (10, 9), (11, 12), (12, 11)]


def _write(kind: int, v: Any, c: float, src: Any) -> None:
    if kind == 0:
        v += c
    elif kind == 1:
        v *= c
    elif kind == 2:
        v[v > c] = -c
    elif kind == 3:
        v[...] = src * 2 + c
    else:
        v[...] = v * src + c


def _apply(steps: list[tuple[int, int, float]], t: Any) -> list[Any]:
    """Run the program on ``t``: each step writes (kinds 0-4) through a view, or keeps a
    copy of a view's values then (5) or their sum (6)."""
    kept = []
    for kind, n, c in steps:
        dst, src = PAIRS[n % len(PAIRS)]
        v = VIEWS[n % len(VIEWS)](t) if kind != 3 and kind != 4 else VIEWS[dst](t)
        if kind < 5:
            _write(kind, v, c, VIEWS[src](t) if kind >= 3 else None)
        elif kind == 5:
            kept.append(v * 1)
        else:
            kept.append(v.sum(-1))
    return kept + [t * 1]


@pytest.mark.parametrize("made", [False, True])
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 40), st.sampled_from([0.5, -0.25, 1.5])),
                      min_size=1, max_size=7))
def test_random_writes_and_reads(made: bool, steps: list[tuple[int, int, float]]) -> None:
    """Writes and reads through overlapping views of a tensor given to the flush (or
    made in it), in any order: as numpy, which runs them one by one."""
    a = _x(4, 6, seed=5)
    want = _apply(steps, a.copy() * (2 if made else 1))
    x = braze.tensor(a.copy())
    got = [g.numpy() for g in _apply(steps, x * 2 if made else x)]
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"result {i}")


def test_two_groups_that_write_in_place_merged_keep_both_writes() -> None:
    """The same in-place program twice in one flush, on other tensors: the groups that
    compute them merge into one kernel, which stores every write (it once kept only
    the second group's: the first arguments were left as they were)."""
    def fn(a: Any, b: Any) -> None:
        a.mul_(2.0)
        b.add_(b.amax(0) - a)
    x, y = _x(3, 4, seed=1), _x(3, 4, seed=2)
    want_a = x * 2
    want_b = y + (y.max(0) - want_a)
    pairs = [(braze.tensor(x.copy()), braze.tensor(y.copy())) for _ in range(3)]
    for a, b in pairs:
        fn(a, b)
    for a, b in pairs:
        np.testing.assert_allclose(a.numpy(), want_a, rtol=1e-6)
        np.testing.assert_allclose(b.numpy(), want_b, rtol=1e-6)


def test_a_tensor_written_in_place_is_never_the_plans_to_place_or_free() -> None:
    """A given tensor written in place by a kernel, read by a later one and not held
    by any result: it keeps its own memory (it was placed in the plan's arena, read
    there before it was written, and freed)."""
    x = (np.arange(10, dtype=np.float32).reshape(2, 5) / 10)
    a = braze.tensor(x.copy())
    t0 = braze.softmax(a - a.amax(0), -1)
    a.mul_(2.0)
    t1 = t0.amax(0) - a
    e = np.exp(x - x.max(0))
    want = (e / e.sum(-1, keepdims=True)).max(0) - 2 * x
    np.testing.assert_allclose(t1.numpy(), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(a.numpy(), 2 * x, rtol=1e-6)


def _program(steps: list[tuple[int, int, int, float]], ts: list[Any], softmax: Callable[[Any], Any]) -> list[Any]:
    """In-place writes of values computed from reductions of given tensors, and reads
    kept for later, on braze tensors or numpy arrays alike."""
    kept: list[Any] = []
    for kind, i, j, c in steps:
        x, y = ts[i % len(ts)], ts[j % len(ts)]
        if kind == 0:
            x *= c
        elif kind == 1:
            x += x.max(0) - y if isinstance(x, np.ndarray) else x.amax(0) - y
        elif kind == 2:
            x += y.sum(-1, keepdims=True) * c if isinstance(x, np.ndarray) else y.sum(-1, keepdim=True) * c
        elif kind == 3:
            kept.append(softmax(x - (x.max(0) if isinstance(x, np.ndarray) else x.amax(0))))
        elif kind == 4 and kept:
            kept.append((kept[-1].max(0) if isinstance(x, np.ndarray) else kept[-1].amax(0)) - x)
        else:
            x[...] = y * c + 1
    return kept


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 2),
                                st.sampled_from([0.5, -1.5, 2.0])), min_size=1, max_size=6),
       runs=st.integers(1, 3))
def test_random_in_place_programs_run_together(steps: list[tuple[int, int, int, float]], runs: int) -> None:
    """A program of in-place writes and reads over three given tensors, run ``runs``
    times on other tensors before anything is read (one flush: the copies' groups may
    fuse and merge), gives numpy's results and leaves numpy's values in every tensor."""
    arrays = [_x(3, 4, seed=s) for s in range(3)]
    want_ts = [a.copy() for a in arrays]
    want = _program(steps, want_ts, _np_softmax)
    sets = [[braze.tensor(a.copy()) for a in arrays] for _ in range(runs)]
    got = [_program(steps, ts, lambda v: braze.softmax(v, -1)) for ts in sets]
    for ts, kept in zip(sets, got):
        for g, w in zip(kept, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)
        for t, w in zip(ts, want_ts):
            np.testing.assert_allclose(t.numpy(), w, rtol=1e-5, atol=1e-5)
