"""Compile units (runtime/units.py): a plan's kernels in several translation units,
compiled in parallel, computing what one module computed."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import pytest

import braze
from braze import plan
from braze.codegen.c import module_source
from braze.errors import CompileError
from braze.runtime import cpu, units
from braze.runtime.cpu import compiler_available
from braze.stats import COUNTERS
from test_plan import fused  # noqa: F401  (autouse: fused, a fresh cache dir, no plans)

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")


# -- partition -----------------------------------------------------------------------------

def test_a_small_module_stays_one_unit() -> None:
    bodies = ["a" * 100] * 3
    assert units.partition(bodies, 8) == [[0, 1, 2]]
    assert units.partition([], 8) == []
    assert units.partition(["b" * 100_000, "c"], 1) == [[0, 1]]  # one job: nothing to gain


def test_a_heavy_kernel_is_compiled_alone_and_light_ones_balanced() -> None:
    heavy = "h" * units.HEAVY_CHARS
    bodies = ["a" * 10, heavy, "b" * 30, "c" * 20, "d" * 25]
    assert units.partition(bodies, 2) == [[1], [0, 2, 3, 4]]
    parts = units.partition(bodies, 3)
    assert parts[0] == [1] and sorted(i for p in parts[1:] for i in p) == [0, 2, 3, 4] and len(parts) == 3
    assert parts == units.partition(bodies, 3)  # deterministic: the units are cache entries


def test_many_light_kernels_are_split() -> None:
    bodies = [str(i) * (10 + i) for i in range(units.LIGHT_SPLIT)]
    parts = units.partition(bodies, 2)
    assert len(parts) == 2 and sorted(i for p in parts for i in p) == list(range(len(bodies)))
    assert units.partition(bodies[:-1], 2) == [list(range(len(bodies) - 1))]


def test_jobs_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "3")
    assert units.jobs() == 3
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "nonsense")
    assert units.jobs() >= 1


# -- compiling -----------------------------------------------------------------------------

def _kernel(name: str, k: float) -> str:
    return (f"#include <stdint.h>\nvoid {name}(void **args, int64_t nthreads) {{ (void)nthreads;\n"
            f"    float *x = (float *)args[0]; for (int i = 0; i < 4; i++) x[i] = x[i] * {k}f + 1.0f; }}\n")


def test_units_compile_concurrently_and_each_runs_its_own_code(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "4")
    threads: set[str] = set()
    real = cpu.compile_c

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu, "compile_c", spy)
    modules = [(_kernel("f", float(k)), ["f"]) for k in range(2, 6)] + [("", [])]
    before = COUNTERS["kernels_compiled"]
    libs = units.compile_units(modules)
    assert COUNTERS["kernels_compiled"] == before + 4 and libs[-1] is None
    assert any(t.startswith("braze-cc") for t in threads)
    for k, lib in zip(range(2, 6), libs):
        assert lib is not None
        x = np.ones(4, np.float32)
        lib.function("f", ["ptr", "i64"])((ctypes.c_void_p * 1)(x.ctypes.data), 1)
        np.testing.assert_array_equal(x, np.full(4, k + 1.0, np.float32))
    assert units.compile_units(modules[:1])[0] is libs[0]  # cached: no compile
    assert COUNTERS["kernels_compiled"] == before + 4


def test_a_unit_that_does_not_compile_raises_after_the_others(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    modules = [(_kernel("f", 7.0), ["f"]), ("void f(void **args, long n) { this is not C }", ["f"])]
    with pytest.raises(CompileError):
        units.compile_units(modules)
    assert cpu.is_cached(*modules[0])


# -- plans ---------------------------------------------------------------------------------

def _randn(*shape: int, seed: int = 0) -> braze.Tensor:
    return braze.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _program(x: braze.Tensor, w: braze.Tensor) -> braze.Tensor:
    # float32 matmuls are extern steps: each element-wise stretch between them is a kernel
    a = (x.exp() * 0.5 + 1.0) @ w
    b = (a.tanh() - x * 2.0) @ w
    c = (b.abs().sqrt() + a) @ w
    return (c * c - b).sigmoid() + 3.0


def test_a_plan_split_into_units_computes_what_one_module_does(monkeypatch: Any, tmp_path: Any) -> None:
    x, w = _randn(16, 16), _randn(16, 16, seed=1) * 0.1
    w.numpy()  # its own flush: the program's stream is the same both times
    plan.clear()
    whole = _program(x, w).numpy().copy()
    (one,) = plan.stored_plans()
    n_kernels = len({s.fn.__name__ for s in one.steps if isinstance(s, plan.CompiledKernel)})  # distinct
    assert n_kernels >= 3
    plan.clear()
    monkeypatch.setattr(units, "HEAVY_CHARS", 1)  # every kernel heavy: each its own unit
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "split"))  # not the stored one-module plan
    before = COUNTERS["kernels_compiled"]
    split = _program(x, w).numpy()
    np.testing.assert_array_equal(split, whole)  # the same C, the same flags: the same bits
    assert COUNTERS["kernels_compiled"] - before == n_kernels
    (two,) = plan.stored_plans()
    libs = {s.fn.__name__.rsplit("_", 1)[1] for s in two.steps if isinstance(s, plan.CompiledKernel)}
    assert len(libs) == n_kernels  # one object per kernel


def test_a_module_of_one_unit_is_the_module_it_always_was() -> None:
    x, w = _randn(16, 16), _randn(16, 16, seed=1) * 0.1
    _program(x, w).numpy()
    (p,) = plan.stored_plans()
    steps = [s for s in p.steps if isinstance(s, plan.CompiledKernel)]
    rendered = plan._render([s.step for s in steps])
    (source, names), = rendered[0]
    bodies = [plan.kernel_source(s.step.kernel, "KERNEL") for s in steps]
    unique = list(dict.fromkeys(bodies))
    assert source == module_source([b.replace("KERNEL", n) for b, n in zip(unique, names)])


def test_identical_units_of_two_programs_compile_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(units, "HEAVY_CHARS", 1)
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    x, w = _randn(16, 16), _randn(16, 16, seed=1) * 0.1
    _program(x, w).numpy()
    before = COUNTERS["kernels_compiled"]
    # another program (one more op at the end) whose first kernels are the same text
    got = ((_program(x, w) @ w) * 2.0).numpy()
    assert COUNTERS["kernels_compiled"] - before <= 2
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        want = ((_program(x, w) @ w) * 2.0).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
