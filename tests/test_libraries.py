"""Machine-wide libraries (the quantized matmul per type) and compiling a step ahead."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import pytest

import braze
from braze import plan
from braze.ahead import compile_ahead
from braze.codegen import qlib
from braze.codegen.c import module_source
from braze.codegen.headers import QUANT_HEADERS, header
from braze.device import CPU
from braze.errors import BrazeError
from braze.runtime import cpu, libraries, units
from braze.stream import fusion_enabled, stream_of

# a kernel as codegen/quant.py renders one: Q8_0 rows of w against x, the epilogue storing y
_QKERNEL = """
static void k_ep(void **args, int64_t r0, int64_t nr, int64_t j0, int64_t nj, float *const *acc, int64_t ldc) {
    float *y = (float *)args[2];
    for (int64_t r = 0; r < nr; r++) for (int64_t j = 0; j < nj; j++) y[(r0 + r) * 64 + j0 + j] = acc[0][r * ldc + j];
}
void k(void **args, int64_t nthreads) {
    const uint8_t *const w[1] = {(const uint8_t *)args[1]};
    braze_qlinear_q8_0(2, 64, 64, (const float *)args[0], 64, w, 1, 68, k_ep, NULL, args, nthreads);
}
"""


def test_a_module_declares_what_it_links_against_and_holds_no_quant_h() -> None:
    src = module_source([_QKERNEL])
    assert f"#define braze_qlinear_q8_0 braze_qlinear_q8_0_{qlib.tag('Q8_0')}" in src  # the library's symbol
    assert all(header(h) not in src for h in QUANT_HEADERS)  # the library's, not here
    assert "#include <immintrin.h>" not in src
    assert libraries.needed([src]) == ["Q8_0"]
    # a kernel that merely has "row_" in a helper's name links against nothing (an attention
    # chain's braze_row_sum once pulled all of quant.h into its unit)
    other = module_source(["void k(void **a, int64_t n) { (void)a; (void)n; /* braze_row_sum */ }"])
    assert qlib.declarations(["braze_row_sum(x, 4)"]) == "" and libraries.needed([other]) == []


def test_a_library_source_exports_its_functions_under_its_tag() -> None:
    src = qlib.library_source("Q4_1")
    assert qlib.exported("Q4_1") == [f"{n}_{qlib.tag('Q4_1')}" for n in
                                      ("braze_qlinear_q4_1", "braze_rowf_q4_1", "braze_qrows")]
    assert all(f"void {s}(" in src for s in qlib.exported("Q4_1"))
    assert qlib.tag("Q4_1") != qlib.tag("Q4_0")  # each type its own library and names


def _q8_0(rows: np.ndarray) -> np.ndarray:
    """Rows of 64 floats as Q8_0 blocks (scale float16, then 32 int8), 68 bytes a row."""
    out = []
    for row in rows:
        for b in row.reshape(-1, 32):
            d = np.float16(np.abs(b).max() / 127)
            q = np.round(b / np.float32(d)).astype(np.int8)
            out.append(np.frombuffer(d.tobytes(), np.uint8))
            out.append(q.view(np.uint8))
    return np.concatenate(out).reshape(len(rows), 68)


def test_a_missing_library_is_built_with_the_units_and_loaded_before_them(monkeypatch: Any, tmp_path: Any) -> None:
    runtime = tmp_path / "runtime"
    monkeypatch.setenv("BRAZE_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(libraries, "_loaded", set())
    monkeypatch.setattr(cpu, "_loaded", {})  # as a new process: no library loaded by an earlier test
    module = (module_source([_QKERNEL]), ["k"])
    (lib,) = units.compile_units([module])
    assert lib is not None and [p.suffix for p in runtime.glob("*.so")] == [".so"]  # built there, once
    rng = np.random.default_rng(0)
    x, wf = rng.standard_normal((2, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    w, y = _q8_0(wf), np.zeros((2, 64), np.float32)
    args = (ctypes.c_void_p * 3)(x.ctypes.data, w.ctypes.data, y.ctypes.data)
    lib.function("k", ["ptr", "i64"])(args, 1)
    deq = np.concatenate([np.float32(np.frombuffer(r[i:i + 2].tobytes(), np.float16)[0])
                          * r[i + 2:i + 34].view(np.int8).astype(np.float32) for r in w for i in (0, 34)]).reshape(64, 64)
    np.testing.assert_allclose(y, x @ deq.T, rtol=2e-2, atol=2e-2)  # x rounded to 15 bits (int8x2)


@pytest.mark.skipif(not fusion_enabled(), reason="compiling ahead is for the fused executor")
def test_compile_ahead_compiles_the_steps_kernels_and_runs_nothing(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(units, "HEAVY_CHARS", 1)  # every kernel its own unit
    monkeypatch.setattr(units, "later", lambda modules, targets: None)  # no whole modules: the units stay
    plan.clear()
    rng = np.random.default_rng(1)
    x = braze.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
    table = braze.from_numpy(np.zeros((4, 16), np.float32))
    kept: list[braze.Tensor] = []

    def step() -> braze.Tensor:
        table[1:2] = x[0:1].exp() * 2.0  # an in-place write into a tensor that exists
        y = (x * table.sum(0)).tanh()
        kept.append(y)
        return y / y.abs().sum(-1, keepdim=True)

    compilers: list[tuple[str, str]] = []  # (thread, cache key) of every compiler run
    real = cpu._build

    def spy(*args: Any, **kwargs: Any) -> None:
        compilers.append((threading.current_thread().name, args[5]))
        real(*args, **kwargs)

    monkeypatch.setattr(cpu, "_build", spy)
    assert compile_ahead(step)
    assert not stream_of(CPU).nodes  # dropped, not run
    np.testing.assert_array_equal(table.numpy(), np.zeros((4, 16), np.float32))
    with pytest.raises(BrazeError, match="compile its kernels ahead"):
        kept[0].numpy()
    got = step().numpy()  # the real flush: its units compiled ahead, or being compiled (it waits)
    (p,) = plan.stored_plans()
    n_units = len({k.fn.__name__.rsplit("_", 1)[1] for k in p.steps if isinstance(k, plan.CompiledKernel)})
    # each unit compiled once: ahead, or by the flush where the ahead pool had not started it yet
    assert len(compilers) == len({k for _, k in compilers}) == n_units >= 3, compilers
    # some ahead (the first need not be: under load the flush can take a unit before the
    # pool's thread starts; seen once in make test on the 2-core AVX2 EPYC)
    assert any(t.startswith("braze-cc-ahead") for t, _ in compilers), compilers
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        table[1:2] = braze.from_numpy(np.zeros((1, 16), np.float32))
        want = step().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
