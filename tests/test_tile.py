"""braze/codegen/tile.h's GEMM tiles against numpy, at both of its vector widths.

The tiles pick 16-float vectors where the compiler targets AVX-512 and 8-float ones
otherwise, with different blocks (4-row blocks only with 16), so each width is built
and checked here, with braze's own compiler flags: ``-march=native`` and
``-march=native -mno-avx512f`` (on a machine without AVX-512 both are the 8-float
build). Shapes cover every edge: rows past the
6-row and 4-row blocks, columns past a block and past a vector, an odd last 8 of k.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from braze.runtime import cpu

HEADER_DIR = Path(__file__).resolve().parent.parent / "braze" / "codegen"
CC = shutil.which("gcc") or shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (gcc/cc) on PATH")

DRIVER = r"""
#include <math.h>
#include "cmath.h"
#include "tile.h"
int vector_floats(void) { return BRAZE_VL; }
void mm(long m, long n, long k, const float *A, long lda, const float *B, long ldb, float *C, long ldc, int acc) {
    braze_mm(m, n, k, A, lda, B, ldb, C, ldc, acc);
}
void mm_scaled_max(long m, long n, long k, const float *A, long lda, const float *B, long ldb, float *C, long ldc,
                   const float *s, const float *bias, long ldbias, long nv, float *mx, int *nanf) {
    const float *rows[64];
    for (long r = 0; r < m; r++) rows[r] = bias ? bias + r * ldbias : 0;
    braze_mm_scaled_max(m, n, k, A, lda, B, ldb, C, ldc, s, bias ? rows : 0, nv, mx, nanf);
}
float row_sum(const float *x, long n) { return braze_row_sum(x, n); }
void mm_nt(long m, long n, long k, const float *A, long lda, const float *Bt, long ldbt, float *C, long ldc) {
    braze_mm_nt(m, n, k, A, lda, Bt, ldbt, C, ldc);
}
"""

WIDTHS = {"native": [], "no-avx512": ["-mno-avx512f"]}


@pytest.fixture(scope="module", params=list(WIDTHS))
def lib(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    (tmp / "driver.c").write_text(DRIVER)
    so = tmp / "driver.so"
    cmd = [CC, *cpu.FLAGS, *WIDTHS[request.param], f"-I{HEADER_DIR}", str(tmp / "driver.c"), "-o", str(so)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(so))
    L, P = ctypes.c_long, ctypes.c_void_p
    lib.vector_floats.restype = ctypes.c_int
    lib.mm.argtypes = [L, L, L, P, L, P, L, P, L, ctypes.c_int]
    lib.mm_scaled_max.argtypes = [L, L, L, P, L, P, L, P, L, P, P, L, L, P, P]
    lib.mm_nt.argtypes = [L, L, L, P, L, P, L, P, L]
    lib.row_sum.argtypes, lib.row_sum.restype = [P, L], ctypes.c_float
    for f in (lib.mm, lib.mm_scaled_max, lib.mm_nt):
        f.restype = None
    lib.width = request.param
    return lib


def _p(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_vector_width(lib):
    w = lib.vector_floats()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert w == (16 if lib.width == "native" and " avx512f" in flags else 8)


SHAPES = [(m, n, k) for m in (1, 3, 4, 5, 6, 7, 11, 48) for n in (1, 15, 16, 24, 33, 40, 64, 96, 100)
          for k in (8, 24, 64)]


@pytest.mark.parametrize("acc", [0, 1])
def test_mm(lib, acc):
    rng = np.random.default_rng(1)
    for m, n, k in SHAPES:
        a, b = _rand(rng, m, k + 3), _rand(rng, k, n + 5)  # row strides past the row
        c = _rand(rng, m, n + 2)
        want = (c[:, :n].astype(np.float64) if acc else 0) + a[:, :k].astype(np.float64) @ b[:, :n]
        lib.mm(m, n, k, _p(a), k + 3, _p(b), n + 5, _p(c), n + 2, acc)
        _close(c[:, :n], want, k)


@pytest.mark.parametrize("with_bias", [False, True])
def test_mm_scaled_max(lib, with_bias):
    rng = np.random.default_rng(2)
    for m, n, k in SHAPES:
        for nv in sorted({n, max(n - 7, 1)}):
            a, b = _rand(rng, m, k), _rand(rng, k, n)
            s = rng.uniform(0.1, 2.0, m).astype(np.float32)
            bias = _rand(rng, m, n) if with_bias else None
            c = np.empty((m, n), np.float32)
            mx = np.empty(m, np.float32)
            nanf = np.empty(m, np.int32)
            lib.mm_scaled_max(m, n, k, _p(a), k, _p(b), n, _p(c), n, _p(s), _p(bias), n, nv, _p(mx), _p(nanf))
            want = (a.astype(np.float64) @ b) * s[:, None]
            if bias is not None:
                want[:, :nv] += bias[:, :nv]
            _close(c[:, :nv], want[:, :nv], k)
            if bias is None:
                _close(c, want, k)
            np.testing.assert_array_equal(mx, c[:, :nv].max(axis=1))
            assert not nanf.any()


@pytest.mark.parametrize("col", [3, 12, 29, 37])
def test_mm_scaled_max_flags_nan(lib, col):
    """A nan score is flagged and passed over by the max wherever it falls: inside the
    6-row blocks' columns, in either half of a 16-float vector (3, 12, 29), or past them
    (37); and only in its own row (row 1 inside a block, row 6 past the blocks)."""
    m, n, k = 7, 40, 16
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    b[3, col] = np.nan  # a nan score in column ``col`` of every row
    for nv in (n, col):
        c, mx, nanf = np.empty((m, n), np.float32), np.empty(m, np.float32), np.empty(m, np.int32)
        lib.mm_scaled_max(m, n, k, _p(a), k, _p(b), n, _p(c), n, None, None, n, nv, _p(mx), _p(nanf))
        assert (nanf == int(nv > col)).all(), (nv, nanf)
        np.testing.assert_array_equal(mx, np.full(m, k, np.float32))
    b[3, col] = 1.0
    a[[1, 6], 2] = np.nan  # rows 1 and 6: every score nan
    c, mx, nanf = np.empty((m, n), np.float32), np.empty(m, np.float32), np.empty(m, np.int32)
    lib.mm_scaled_max(m, n, k, _p(a), k, _p(b), n, _p(c), n, None, None, n, n, _p(mx), _p(nanf))
    assert list(nanf) == [0, 1, 0, 0, 0, 0, 1]
    np.testing.assert_array_equal(mx, [k, -np.inf, k, k, k, k, -np.inf])


def test_row_sum(lib):
    rng = np.random.default_rng(4)
    for n in range(0, 70):
        x = np.zeros(n + 16, np.float32)
        x[:n] = _rand(rng, n)
        x[n:] = np.nan  # past the end: never read
        assert abs(lib.row_sum(_p(x), n) - x[:n].astype(np.float64).sum()) <= 1e-5 * max(1, n)


def test_mm_nt(lib):
    rng = np.random.default_rng(3)
    for m, n, k in SHAPES:
        a, bt = _rand(rng, m, k + 8), _rand(rng, n, k + 16)
        c = np.empty((m, n + 1), np.float32)
        lib.mm_nt(m, n, k, _p(a), k + 8, _p(bt), k + 16, _p(c), n + 1)
        _close(c[:, :n], a[:, :k].astype(np.float64) @ bt[:, :k].T, k)
