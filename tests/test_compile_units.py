"""Compile units (runtime/units.py): a plan's kernels in several translation units,
compiled in parallel, computing what one module computed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import braze
from braze import plan
from braze.capture import StepCapture
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
    real = cpu.build  # the compiler runs there, in parallel; compile_c loads afterwards

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu, "build", spy)
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


def test_meanwhile_runs_once_beside_the_compilers(monkeypatch: Any) -> None:
    """``meanwhile`` (storing a new plan) runs once, while the units compile (a compiler
    has started by then), and once when there is nothing to compile."""
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "1")  # one job: still beside the compiler
    started = threading.Event()
    real = cpu.build

    def spy(*args: Any, **kwargs: Any) -> Any:
        started.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu, "build", spy)
    seen: list[bool] = []
    modules = [(_kernel("g", 3.0), ["g"])]
    (lib,) = units.compile_units(modules, lambda: seen.append(started.wait(60)))
    assert seen == [True] and lib is not None and cpu.is_cached(*modules[0])
    units.compile_units(modules, lambda: seen.append(False))
    assert seen == [True, False]


# -- plans ---------------------------------------------------------------------------------

def _randn(*shape: int, seed: int = 0) -> braze.Tensor:
    return braze.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _program(x: braze.Tensor, w: braze.Tensor) -> braze.Tensor:
    # float32 matmuls are extern steps: each element-wise stretch between them is a kernel
    a = (x.exp() * 0.5 + 1.0) @ w
    b = (a.tanh() - x * 2.0) @ w
    c = (b.abs().sqrt() + a) @ w
    return (c * c - b).sigmoid() + 3.0


@pytest.fixture
def held(monkeypatch: Any) -> Iterator[threading.Event]:
    """Background compiles (the whole modules) wait until the test sets the event."""
    go = threading.Event()
    real = units._compile_elsewhere

    class Slow:  # the compiler process starts only once the test says so
        def __init__(self, todo: Any) -> None:
            self.todo = todo

        def wait(self) -> int:
            assert go.wait(60)
            return real(self.todo).wait()

    def slow(todo: Any) -> Slow:
        return Slow(todo)

    monkeypatch.setattr(units, "_compile_elsewhere", slow)
    monkeypatch.setattr(units, "HEAVY_CHARS", 1)  # every kernel heavy: each its own unit
    monkeypatch.setenv("BRAZE_COMPILE_JOBS", "2")
    yield go
    go.set()
    units.wait()


def _libs(p: Any) -> set[str]:
    """The objects a plan's kernels come from (their symbols' key tags)."""
    return {k.fn.__name__.rsplit("_", 1)[1] for k in p.steps if isinstance(k, plan.CompiledKernel)}


def test_a_plan_runs_on_its_units_then_on_its_modules(monkeypatch: Any, tmp_path: Any,
                                                       held: threading.Event) -> None:
    x, w = _randn(16, 16), _randn(16, 16, seed=1) * 0.1
    w.numpy()  # its own flush: the program's stream is the same every time
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        want = _program(x, w).numpy().copy()
    plan.clear()  # w's own plan
    before = COUNTERS["kernels_compiled"]
    first = _program(x, w).numpy().copy()  # on the units: the whole module is held back
    (p,) = plan.stored_plans()
    n_kernels = len(_libs(p))
    assert n_kernels >= 3 and COUNTERS["kernels_compiled"] - before == n_kernels  # one object per kernel
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
    swaps = units.swaps()
    held.set()
    assert units.wait(60)
    assert units.swaps() == swaps + 1 and COUNTERS["kernels_compiled"] - before == n_kernels  # compiled elsewhere
    assert len(_libs(p)) == 1  # every kernel now from the whole module
    np.testing.assert_array_equal(_program(x, w).numpy(), first)  # the same C, the same flags: the same bits
    # a new process finds the module compiled and never uses the units
    plan.clear()
    before = COUNTERS["kernels_compiled"]
    np.testing.assert_array_equal(_program(x, w).numpy(), first)
    (again,) = plan.stored_plans()
    assert len(_libs(again)) == 1 and COUNTERS["kernels_compiled"] == before and not units.failures


def test_a_captured_step_replays_the_swapped_kernels(held: threading.Event) -> None:
    table, m = _randn(32, 16), _randn(16, 16, seed=1)
    m.numpy()

    def step(pos: int) -> braze.Tensor:  # two kernels (rows, then columns), no extern step
        a = (table[pos:pos + 1] * m).exp()
        b = a / a.sum(-1, keepdim=True)
        return (b - (b * 3.0).sum(0, keepdim=True)).tanh() * 2.0 + (pos + 100.5)

    cap = StepCapture()
    for pos in range(9):
        cap.observe(pos, lambda: step(pos))
        if cap.ready:
            break
    assert cap.ready, cap.reason
    driver = cap.driver
    assert driver is not None and driver.n >= 2
    got = [cap.replay(p).copy() for p in (12, 20)]
    on_units = list(driver.fns)
    held.set()
    assert units.wait(60)
    again = [cap.replay(p).copy() for p in (12, 20)]
    assert list(driver.fns) != on_units  # the replay calls the whole module's kernels now
    assert [ctypes.cast(k.fn, ctypes.c_void_p).value for k in driver.kernels] == list(driver.fns)
    for p, g, a in zip((12, 20), got, again):
        np.testing.assert_array_equal(a, g)
        np.testing.assert_allclose(g, step(p).numpy(), rtol=1e-5, atol=1e-5)


def test_a_module_of_one_unit_is_the_module_it_always_was() -> None:
    x, w = _randn(16, 16), _randn(16, 16, seed=1) * 0.1
    _program(x, w).numpy()
    (p,) = plan.stored_plans()
    steps = [s for s in p.steps if isinstance(s, plan.CompiledKernel)]
    rendered = plan._render([s.step for s in steps])
    generic, (source, names) = rendered[0]  # no generic kernels; the specialised ones
    assert generic == ("", [])
    assert rendered[3] == [] and rendered[4] == []  # one unit per module: no units, no tiers
    bodies = [plan.kernel_source(s.step.kernel, "KERNEL") for s in steps]
    unique = list(dict.fromkeys(bodies))
    assert source == module_source([b.replace("KERNEL", n) for b, n in zip(unique, names)])


def test_identical_units_of_two_programs_compile_once(monkeypatch: Any, held: threading.Event) -> None:
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


def test_the_whole_modules_land_in_the_cache_after_a_short_process_ends(tmp_path: Any) -> None:
    """A process that ends before its modules are built leaves them building (a process
    of their own): the next process finds them and compiles nothing."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    code = (
        "import numpy as np, braze\n"
        "from braze import plan\n"
        "from braze.runtime import units\n"
        "from braze.stats import COUNTERS\n"
        "units.HEAVY_CHARS = 1\n"
        "x = braze.from_numpy(np.arange(256, dtype=np.float32).reshape(16, 16) / 256)\n"
        "w = braze.from_numpy(np.eye(16, dtype=np.float32) * 0.5)\n"
        "a = (x.exp() * 0.5 + 1.0) @ w\n"
        "b = (a.tanh() - x * 2.0) @ w\n"
        "y = ((b.abs().sqrt() + a) * 3.0).numpy()\n"
        "(p,) = [q for q in plan.stored_plans() if len(q.steps) > 2]\n"
        "libs = {k.fn.__name__.rsplit('_', 1)[1] for k in p.steps if isinstance(k, plan.CompiledKernel)}\n"
        "print(COUNTERS['kernels_compiled'], len(libs), float(y.sum()))\n")
    cache = tmp_path / "cache"
    env = dict(os.environ, BRAZE_CACHE_DIR=str(cache), BRAZE_FUSION="1", BRAZE_COMPILE_JOBS="2",
               PYTHONPATH=str(Path(braze.__file__).resolve().parents[1]))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    deadline = time.monotonic() + 240
    while list(cache.glob(".later-*")) and time.monotonic() < deadline:  # removed once its modules are built
        time.sleep(0.2)
    second = None
    while time.monotonic() < deadline:
        second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        if second.stdout.split()[1] == "1":
            break
        time.sleep(1)  # the background compile is still running
    assert second is not None, f"the background compile never started: {list(cache.glob('.later-*'))}"
    compiled, libs, total = second.stdout.split()
    assert compiled == "0" and libs == "1"  # every kernel from the whole module, nothing compiled
    assert total == first.stdout.split()[2]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no idle scheduling class here")
def test_the_background_compile_runs_in_the_idle_class_and_so_do_its_compilers() -> None:
    # a process of its own: the class cannot be left again without privileges
    code = ("import os, subprocess, sys\n"
            "from braze.runtime import units\n"
            "units._idle_class()\n"
            "child = subprocess.run([sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'],\n"
            "                       capture_output=True, text=True, check=True)\n"
            "print(os.sched_getscheduler(0), child.stdout.strip())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(Path(braze.__file__).parents[1]),
                                                                  os.environ.get("PYTHONPATH")) if p))
    assert os.sched_getscheduler(0) != os.SCHED_IDLE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == [str(os.SCHED_IDLE)] * 2
