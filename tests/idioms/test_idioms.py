"""Run every snippet of the idiom corpus: its result against its numpy oracle (both
executors), and, fused, the number of steps it takes against the count written beside
it. A snippet that stops fusing fails here."""

from __future__ import annotations

import importlib
import pkgutil
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import braze
from braze import plan
from braze.runtime.cpu import compiler_available
from braze.stream import fusion_enabled, stream_of

from .corpus import CASES, Idiom, draw

# Every other module of this package is a family of snippets; importing it registers them.
# (sorted: every xdist worker must collect the same cases in the same order)
for _m in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
    if _m.name not in ("corpus", "npref") and not _m.name.startswith("test_"):
        importlib.import_module(f"{__package__}.{_m.name}")

FUSED = fusion_enabled() and compiler_available()


@pytest.fixture(scope="module", autouse=True)
def _own_plans() -> Any:
    """The corpus starts from no stored plans and leaves none: its ~200 programs would
    otherwise count against BRAZE_PLAN_CAP (512) with the other tests of this worker's."""
    plan.clear()
    yield
    plan.clear()


def _params() -> list[Any]:
    out = []
    for c in CASES:
        marks = []
        if c.wrong:
            marks.append(pytest.mark.xfail(strict=True, reason=c.wrong))
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in _flat(item)]
    return [x]


def _to_braze(a: Any) -> Any:
    return braze.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a


def _check(case: Idiom, got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want), f"{len(got)} results, the oracle has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, braze.Tensor), f"result {i} is a {type(g).__name__}, not a Tensor"
        a, w = g.numpy(), np.asarray(w)
        assert a.shape == w.shape, f"result {i}: shape {a.shape}, numpy {w.shape}"
        assert a.dtype.kind == w.dtype.kind, f"result {i}: dtype {a.dtype}, numpy {w.dtype}"
        if w.dtype != np.float64:
            assert a.dtype == w.dtype, f"result {i}: dtype {a.dtype}, numpy {w.dtype}"
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, w, err_msg=f"result {i}")
        else:
            np.testing.assert_allclose(a.astype(np.float64), w.astype(np.float64), rtol=case.rtol, atol=case.atol,
                                       err_msg=f"result {i}")


def _steps(case: Idiom, args: list[Any]) -> list[str]:
    """The steps the snippet's plan takes (to say which one is too many)."""
    plan.clear()
    keep = case.fn(*[_to_braze(a) for a in args])  # noqa: F841  (its results stay reachable)
    ops = [n.op.name for n in stream_of(braze.device("cpu")).nodes]
    braze.synchronize()
    return [f"extern {ops[s.node]}" if isinstance(s, plan.ExternStep) else "kernel" for p in plan.stored_plans()
            for s in p.steps]


@pytest.mark.parametrize("case", _params())
def test_idiom(case: Idiom) -> None:
    seed = zlib.crc32(case.id.encode())
    args = draw(case, seed)
    want = _flat(case.oracle(*[a.copy() if isinstance(a, np.ndarray) else a for a in args]))
    for attempt in range(2):  # the second run replays the stored plan
        inputs = [_to_braze(a) for a in args]
        braze.synchronize()
        braze.reset_stats()
        got = _flat(case.fn(*inputs))
        braze.synchronize()
        st = braze.stats()
        _check(case, got, want)
        if FUSED:
            assert st["unfused_flushes"] == 0, "the fused executor left a flush to the reference executor"
            counted = st["kernel_launches"] == case.kernels
            known = case.pending or case.bug
            if known and counted:  # a strict xfail: the count is met, so the mark must go
                pytest.fail(f"[XPASS(strict)] takes {case.kernels} steps now: remove the mark ({known})")
            if known:  # the results were right; only the count waits on the named work
                pytest.xfail(known)
            assert counted, \
                f"run {attempt + 1}: {st['kernel_launches']} steps, expected {case.kernels}: {_steps(case, args)}"


def test_the_corpus_is_large_and_every_family_counts() -> None:
    families = Counter(c.family for c in CASES)
    assert sum(families.values()) >= 150, families
    assert all(n >= 5 for n in families.values()), families
