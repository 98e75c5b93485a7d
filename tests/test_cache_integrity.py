"""The compile and plan caches never run the wrong code: an entry swapped for another
kernel's, or a stored plan with any byte changed, is rebuilt and the result is right."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import braze
from braze import plan, plan_store
from braze.runtime import cpu
from braze.stats import COUNTERS
from braze.stream import fusion_enabled

pytestmark = pytest.mark.skipif(not cpu.compiler_available(), reason="no C compiler on this machine")

KERNEL = r"""
#include <stdint.h>
void kern(float* restrict out, const float* restrict a, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] %s 2.0f;
}
"""

CHILD = """
import sys
import numpy as np
from braze.runtime import cpu
from braze.stats import COUNTERS
op = sys.argv[1]
lib = cpu.compile_c({kernel!r} % op, ["kern"])
fn = lib.function("kern", ["ptr", "ptr", "i64"])
a = np.arange(8, dtype=np.float32); out = np.zeros(8, np.float32)
fn(out.ctypes.data, a.ctypes.data, 8)
want = a + 2 if op == "+" else a * 2
print(COUNTERS["kernels_compiled"], bool((out == want).all()), lib.path.name)
"""


def _child(cache: Path, op: str) -> tuple[int, bool, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BRAZE_DEBUG", "CC")}
    env["BRAZE_CACHE_DIR"] = str(cache)
    # a fresh process: this one would find an already-loaded path in the loader's table
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(kernel=KERNEL)), op], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    compiled, right, name = proc.stdout.split()
    return int(compiled), right == "True", name


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)


@pytest.mark.parametrize("what", ["objects and sidecars", "objects, sidecars rewritten to match"])
def test_swapped_cache_entries_are_rebuilt(tmp_path: Path, what: str) -> None:
    cache = tmp_path / "cache"
    _, ok_add, add_name = _child(cache, "+")
    _, ok_mul, mul_name = _child(cache, "*")
    assert ok_add and ok_mul and add_name != mul_name
    add, mul = cache / add_name, cache / mul_name
    _swap(add, mul)
    if what == "objects and sidecars":
        _swap(Path(f"{add}.sha256"), Path(f"{mul}.sha256"))
    else:  # as if someone made each sidecar name its entry and the bytes now there
        for so in (add, mul):
            Path(f"{so}.sha256").write_text(cpu._sidecar(so.name[:-3], so.read_bytes()))
    for op in "+*":  # each finds the other's object: refused, rebuilt, right
        compiled, right, _ = _child(cache, op)
        assert right and compiled == 1
    for op in "+*":  # and the rebuilt entries are used from then on
        assert _child(cache, op)[:2] == (0, True)


def test_every_symbol_carries_its_entry_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    cpu._clear_memory_cache()
    lib = cpu.compile_c(KERNEL % "-", ["kern"])
    assert hasattr(lib.cdll, f"kern_{lib.key[:16]}") and not hasattr(lib.cdll, "kern")
    assert Path(f"{lib.path}.sha256").read_text().split()[0] == lib.key
    assert cpu.cache_key(KERNEL % "-", symbols=["kern"]) == lib.key != cpu.cache_key(KERNEL % "-", symbols=["k"])
    cpu._clear_memory_cache()


# -- stored plans -----------------------------------------------------------------------


@pytest.fixture
def plan_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if not fusion_enabled():
        pytest.skip("plans are the fused executor's")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    plan.clear()
    yield tmp_path / "plans"
    plan.clear()


X = np.linspace(-1, 1, 48, dtype=np.float32).reshape(4, 12)
WANT = np.exp(X * 3 + 1).sum(-1)


def _program() -> np.ndarray:
    x = braze.from_numpy(X.copy())
    return ((x * 3 + 1).exp().sum(-1)).numpy()


def _stored(directory: Path) -> Path:
    (path,) = directory.glob("*.json")
    return path


def test_stored_plans_are_json_that_runs_no_code(plan_cache: Path) -> None:
    np.testing.assert_allclose(_program(), WANT, rtol=1e-5)
    path = _stored(plan_cache)
    head, _, body = path.read_bytes().partition(b"\n")
    assert b"braze-plan" in head and body.startswith(b"{")
    assert plan_store.loads(path.stem, path.read_bytes()) is not None
    assert plan_store.loads("another" + path.stem, path.read_bytes()) is None  # not this plan's name


def test_flipping_any_byte_of_a_stored_plan_rebuilds_it(plan_cache: Path) -> None:
    _program()
    path = _stored(plan_cache)
    good = path.read_bytes()
    head = good.index(b"\n") + 1
    # every byte of the header, and bytes spread over the body (make fuzz: every byte)
    positions = sorted(set(range(head)) | set(range(head, len(good), max(1, (len(good) - head) // 300))))
    misses = COUNTERS["plan_misses"]
    for i in positions:
        bad = bytearray(good)
        bad[i] ^= 0x0B  # '+' <-> ' ', digits to others, quotes to ')' ...
        path.write_bytes(bytes(bad))
        plan.clear()
        np.testing.assert_allclose(_program(), WANT, rtol=1e-5, err_msg=f"byte {i}")
        assert path.read_bytes() == good, f"byte {i}: not rebuilt"
    assert COUNTERS["plan_misses"] == misses + len(positions)


def test_a_plan_whose_c_changed_is_rebuilt_even_with_a_fixed_checksum(plan_cache: Path) -> None:
    """One changed operator in the C, the header's checksum made to match: the C no
    longer hashes to the digest the plan records, so it is rebuilt, not compiled."""
    _program()
    path = _stored(plan_cache)
    good = path.read_bytes()
    body = good.partition(b"\n")[2]
    tampered = body.replace(b" * ", b" - ", 1)
    assert tampered != body
    header = ('{"format": "braze-plan", "version": %d, "sha256": "%s"}'
              % (plan_store.VERSION, cpu.sha256(tampered).hexdigest())).encode()
    path.write_bytes(header + b"\n" + tampered)
    plan.clear()
    compiled = COUNTERS["kernels_compiled"]
    np.testing.assert_allclose(_program(), WANT, rtol=1e-5)
    assert COUNTERS["kernels_compiled"] == compiled and path.read_bytes() == good


def test_stored_plan_round_trip_keeps_dtype_identity(plan_cache: Path) -> None:
    _program()
    path = _stored(plan_cache)
    stored: Any = plan_store.loads(path.stem, path.read_bytes())
    assert stored is not None
    again = plan_store.dumps(path.stem, stored)
    assert again == path.read_bytes()
    kernels = [s.kernel for s in stored[0] if hasattr(s, "kernel")]
    assert kernels and all(d is braze.float32 for k in kernels for d, _ in k.args if d.name == "float32")
