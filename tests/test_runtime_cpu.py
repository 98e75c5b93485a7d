"""The CPU runtime: compiling C, the on-disk cache, no-compiler fallback, threads, launch.

Every test compiles into its own temporary ``BRAZE_CACHE_DIR``, never the user's cache.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from braze.errors import CompileError
from braze.runtime import cpu
from braze.stats import COUNTERS

pytestmark = pytest.mark.skipif(not cpu.compiler_available(), reason="no C compiler on this machine")

ADD = r"""
#include <stdint.h>
void add(float* restrict out, const float* restrict a, const float* restrict b, int64_t n, int64_t nt) {
  #pragma omp parallel for num_threads(nt) if(n > 4096)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""
ADD_ARGS = ["ptr", "ptr", "ptr", "i64", "i64"]


def _source(tag: str) -> str:
    """A source unique to one test, so no test reuses another's library."""
    return f"/* {tag} */\n{ADD}"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = tmp_path / "braze-cache"
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(d))
    monkeypatch.delenv("BRAZE_DEBUG", raising=False)
    cpu._clear_memory_cache()
    yield d
    cpu._clear_memory_cache()


def _run_add(lib: cpu.CompiledLibrary, n: int = 10000) -> None:
    fn = lib.function("add", ADD_ARGS)
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.5, np.float32)
    out = np.zeros(n, np.float32)
    before = COUNTERS["kernel_launches"]
    cpu.launch(fn, out.ctypes.data, a.ctypes.data, b.ctypes.data, n, cpu.get_num_threads())
    assert COUNTERS["kernel_launches"] == before + 1
    np.testing.assert_array_equal(out, a + b)


def _child_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BRAZE_DEBUG", "CC")}
    env["BRAZE_CACHE_DIR"] = str(cache_dir)
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


CHILD_COMPILE = """
import numpy as np
from braze.runtime import cpu
from braze.stats import COUNTERS
lib = cpu.compile_c(open({path!r}).read(), ["add"])
fn = lib.function("add", ["ptr", "ptr", "ptr", "i64", "i64"])
a = np.arange(100, dtype=np.float32); out = np.zeros(100, np.float32)
fn(out.ctypes.data, a.ctypes.data, a.ctypes.data, 100, 2)
assert (out == 2 * a).all()
print(COUNTERS["kernels_compiled"])
"""


def test_compile_and_run(cache: Path) -> None:
    before = COUNTERS["kernels_compiled"]
    lib = cpu.compile_c(_source("run"), ["add"])
    assert COUNTERS["kernels_compiled"] == before + 1
    _run_add(lib)
    _run_add(lib, n=100)  # below the parallel threshold
    assert lib.path.parent == cache and lib.path.name == f"{lib.key}.so"
    # in-process: the same source is a dict lookup, not a load or a compile
    assert cpu.compile_c(_source("run"), ["add"]) is lib
    assert COUNTERS["kernels_compiled"] == before + 1
    # the raw function and a missing symbol
    assert lib["add"] is lib.functions["add"]
    with pytest.raises(CompileError, match="does not export nope"):
        cpu.compile_c(_source("run"), ["nope"])


def test_cache_dir_is_private(cache: Path) -> None:
    assert not cache.exists()
    cpu.compile_c(_source("private"), ["add"])
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    entries = sorted(p.name for p in cache.iterdir())
    assert [e for e in entries if e.endswith(".tmp")] == []
    assert any(e.endswith(".so") for e in entries) and any(e.endswith(".so.sha256") for e in entries)


def test_cache_hit_in_a_fresh_process(cache: Path, tmp_path: Path) -> None:
    src = tmp_path / "add.c"
    src.write_text(_source("fresh-process"))
    cpu.compile_c(src.read_text(), ["add"])
    proc = _python(CHILD_COMPILE.format(path=str(src)), _child_env(cache))
    assert proc.stdout.split() == ["0"], proc.stdout + proc.stderr


def test_cache_key_covers_source_flags_version(cache: Path) -> None:
    src = _source("key")
    k = cpu.cache_key(src)
    assert k == cpu.cache_key(src) and len(k) == 64
    assert cpu.cache_key(src + "\n") != k
    assert cpu.cache_key(src, (*cpu.FLAGS, "-DBRAZE_X=1")) != k
    assert cpu.cache_key(src, [f for f in cpu.FLAGS if f != "-O3"] + ["-O2"]) != k
    assert cpu.cache_key(src, version="999.0") != k
    import braze
    assert cpu.cache_key(src, version=braze.__version__) == k
    # different flags build a different library
    a = cpu.compile_c(src, ["add"])
    b = cpu.compile_c(src, ["add"], flags=(*cpu.FLAGS, "-DBRAZE_X=1"))
    assert a.path != b.path
    _run_add(b)


def test_loose_cache_dir_is_refused(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    lib = cpu.compile_c(_source("loose"), ["add"])
    err = capsys.readouterr().err
    assert "refusing the cache directory" in err and "0755" in err
    assert lib.path.parent != cache and list(cache.iterdir()) == []
    assert stat.S_IMODE(lib.path.parent.stat().st_mode) == 0o700
    _run_add(lib)
    cpu._clear_memory_cache()
    cpu.compile_c(_source("loose-2"), ["add"])
    assert "refusing" not in capsys.readouterr().err  # once


def test_cache_dir_owned_by_someone_else_is_refused(cache: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cache.mkdir(mode=0o700)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    assert cpu.cache_dir() != cache
    assert "owned by uid" in capsys.readouterr().err


def _replace_bytes(path: Path, data: bytes) -> None:
    """Corrupt a cache entry without writing into the file this process has mapped
    (truncating a loaded library in place would crash the process with SIGBUS)."""
    tmp = path.with_suffix(".corrupting")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_corrupt_entry_is_rebuilt(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lib = cpu.compile_c(_source("corrupt"), ["add"])
    so = lib.path
    _replace_bytes(so, so.read_bytes()[:1000])  # truncated
    cpu._clear_memory_cache()
    before = COUNTERS["kernels_compiled"]
    lib2 = cpu.compile_c(_source("corrupt"), ["add"])
    assert COUNTERS["kernels_compiled"] == before + 1
    assert "corrupt" in capsys.readouterr().err
    _run_add(lib2)
    # garbage whose sidecar matches: dlopen itself fails (in a fresh process, since
    # this one already has that path loaded)
    # (naming the entry's symbol, so that it passes the check before dlopen)
    garbage = b"not an ELF file" * 100 + f"add_{cpu.symbol_tag(lib2.key)}\0".encode()
    _replace_bytes(so, garbage)
    Path(f"{so}.sha256").write_text(cpu._sidecar(lib2.key, garbage))
    src = cache.parent / "corrupt.c"
    src.write_text(_source("corrupt"))
    proc = _python(CHILD_COMPILE.format(path=str(src)), _child_env(cache))
    assert proc.stdout.split() == ["1"] and "dlopen failed" in proc.stderr
    assert so.read_bytes() != garbage


def _concurrent_child(cache_dir: str, source: str, barrier: Any, results: Any) -> None:
    os.environ["BRAZE_CACHE_DIR"] = cache_dir
    import numpy as np

    from braze.runtime import cpu
    from braze.stats import COUNTERS

    cpu.cache_key(source)  # compiler identity first, so the race is on the compile
    barrier.wait()
    lib = cpu.compile_c(source, ["add"])
    fn = lib.function("add", ["ptr", "ptr", "ptr", "i64", "i64"])
    a = np.arange(50000, dtype=np.float32)
    out = np.zeros_like(a)
    fn(out.ctypes.data, a.ctypes.data, a.ctypes.data, a.size, 2)
    results.put((bool((out == 2 * a).all()), COUNTERS["kernels_compiled"]))


def test_concurrent_compiles_do_not_collide(cache: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # fork and OpenMP do not mix
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [ctx.Process(target=_concurrent_child, args=(str(cache), _source("race"), barrier, results))
             for _ in range(4)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(ok for ok, _ in got)
    assert sum(n for _, n in got) == 1  # one compiled, three waited and loaded it
    names = [p.name for p in cache.iterdir()]
    assert not [n for n in names if n.endswith(".tmp")]
    assert len([n for n in names if n.endswith(".so")]) == 1


def test_compile_error_names_compiler_output_and_source(cache: Path) -> None:
    bad = "/* bad */\nvoid broken(int n) {\n  return n +;\n}\n"
    with pytest.raises(CompileError) as info:
        cpu.compile_c(bad, ["broken"])
    msg = str(info.value)
    assert "error" in msg and "C compiler failed" in msg
    assert "return n +;" in msg and "   3  " in msg  # numbered source lines
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_debug_prints_source(cache: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BRAZE_DEBUG", "2")
    cpu.compile_c(_source("debug-me"), ["add"])
    assert "/* debug-me */" in capsys.readouterr().err


def test_no_compiler_warns_once(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    code = """
    import sys
    from braze.errors import CompileError
    from braze.runtime import cpu
    assert not cpu.compiler_available()
    assert cpu.have_compiler() is False and cpu.have_compiler() is False
    try:
        cpu.compile_c("void f(void) {}", ["f"])
    except CompileError as e:
        print("raised:", e)
    """
    proc = _python(code, _child_env(tmp_path / "c", CC="/nonexistent", PATH=str(empty)))
    assert proc.stderr.count("braze: no C compiler found (tried $CC, cc, gcc): running the reference "
                             "executor, which is slower") == 1, proc.stderr
    assert "raised: no C compiler found" in proc.stdout


def test_missing_cc_falls_back_to_cc_with_a_warning(tmp_path: Path) -> None:
    code = """
    from braze.runtime import cpu
    assert cpu.have_compiler()
    cpu.compile_c("void f(void) {}", ["f"])
    """
    proc = _python(code, _child_env(tmp_path / "c", CC="/nonexistent"))
    assert "$CC='/nonexistent' was not found" in proc.stderr
    assert "no C compiler" not in proc.stderr


def test_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = cpu.physical_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    monkeypatch.setenv("BRAZE_NUM_THREADS", "3")
    assert cpu.default_num_threads() == 3
    monkeypatch.setenv("BRAZE_NUM_THREADS", "zero")
    with pytest.raises(ValueError, match="BRAZE_NUM_THREADS"):
        cpu.default_num_threads()
    monkeypatch.delenv("BRAZE_NUM_THREADS")
    assert cpu.default_num_threads() == cores
    old = cpu.get_num_threads()
    try:
        cpu.set_num_threads(1)
        assert cpu.get_num_threads() == 1
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError):
                cpu.set_num_threads(bad)  # type: ignore[arg-type]
    finally:
        cpu.set_num_threads(old)


def test_wait_policy_default_respects_the_user(tmp_path: Path) -> None:
    code = """
    import os
    from braze.runtime import cpu
    cpu.compile_c("void f(void) {}", ["f"])
    print(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
    """
    env = _child_env(tmp_path / "c")
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    # a short spin, then sleep (see runtime/cpu.py); a user's policy or spin count wins
    assert _python(code, env).stdout.split() == ["None", "30000"]
    assert _python(code, {**env, "OMP_WAIT_POLICY": "active"}).stdout.split() == ["active", "None"]
    assert _python(code, {**env, "GOMP_SPINCOUNT": "5"}).stdout.split() == ["None", "5"]
