"""Accuracy and vectorisation tests for braze/codegen/cmath.h.

A small C driver applies each function over an array in a `#pragma omp simd` loop; it is
compiled with the CPU backend's flags (gcc -O3 -march=native -fopenmp, no fast-math) and
loaded with ctypes.  Results are compared with float64 references (numpy / math) in
float32 ulps of the exact result.  Run with `pytest -s tests/test_cmath.py` to see the
measured maximum errors.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

HEADER_DIR = Path(__file__).resolve().parent.parent / "braze" / "codegen"
CC = shutil.which("gcc") or shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (gcc/cc) on PATH")

BASE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=gnu11", "-Wall", "-Werror"]

# Documented maximum errors (ulps), as in the header's table.
BOUNDS = {
    "expf": 1.0,
    "expm1f": 1.5,
    "logf": 1.0,
    "log1pf": 1.5,
    "erff": 1.5,
    "tanhf": 2.5,
    "sigmoidf": 1.5,
    "sinf": 1.5,
    "cosf": 1.5,
}
FUNCS = list(BOUNDS)


def driver_source() -> tuple[str, dict[str, int]]:
    lines = ['#include "cmath.h"', ""]
    loop_line = {}
    for f in FUNCS:
        lines.append(f"void run_{f}(const float *restrict x, float *restrict y, long n) {{")
        lines.append("#pragma omp simd")
        loop_line[f] = len(lines) + 1
        lines.append(f"    for (long i = 0; i < n; i++) y[i] = braze_{f}(x[i]);")
        lines.append("}")
        lines.append("")
    lines.append("void run_exp_normal(const float *restrict x, float *restrict y, int *restrict out, long n) {")
    lines.append("#pragma omp simd")
    loop_line["exp_normal"] = len(lines) + 1
    lines.append("    for (long i = 0; i < n; i++) { y[i] = braze__exp_normal(x[i]); out[i] = braze__exp_k(x[i]); }")
    lines.append("}")
    return "\n".join(lines) + "\n", loop_line


def build(tmp: Path, extra: list[str]) -> tuple[ctypes.CDLL, str]:
    src, _ = driver_source()
    c = tmp / "driver.c"
    c.write_text(src)
    so = tmp / "driver.so"
    cmd = [CC, *BASE_FLAGS, *extra, "-fPIC", "-shared", f"-I{HEADER_DIR}", str(c), "-o", str(so)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(so))
    for f in FUNCS:
        fn = getattr(lib, f"run_{f}")
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return lib, proc.stderr


@pytest.fixture(scope="module", params=["contract", "nocontract"])
def lib(request, tmp_path_factory):
    extra = [] if request.param == "contract" else ["-ffp-contract=off"]
    lib, _ = build(tmp_path_factory.mktemp(request.param), extra)
    lib.variant = request.param
    return lib


def apply(lib, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    getattr(lib, f"run_{name}")(x.ctypes.data, y.ctypes.data, x.size)
    return y


# ---- references (float64) --------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def ref_erf(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    out = np.sign(x) * 1.0
    out[np.isnan(x)] = np.nan
    m = np.abs(x) < 4.5  # beyond, erf(x) = +-1 to far better than float32 precision
    out[m] = _erf(x[m]).astype(np.float64)
    out[x == 0] = x[x == 0]
    return out


def ref_sigmoid(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x < 0, e, 1.0) / (1.0 + e)


REFS = {
    "expf": np.exp,
    "expm1f": np.expm1,
    "logf": np.log,
    "log1pf": np.log1p,
    "erff": ref_erf,
    "tanhf": np.tanh,
    "sigmoidf": ref_sigmoid,
    "sinf": np.sin,
    "cosf": np.cos,
}


def reference(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REFS[name](x.astype(np.float64))


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in float32 ulps at ref (0 where y is the float32 rounding of ref,
    inf where one is nan and the other not, or an infinity is wrong)."""
    with np.errstate(all="ignore"):
        r32 = ref.astype(np.float32)
        yd = y.astype(np.float64)
        a = np.abs(ref)
        _, e = np.frexp(a)
        e = np.maximum(e - 1, -126)
        ulp = np.ldexp(1.0, e - 23)
        err = np.abs(yd - ref) / ulp
        same = (y == r32) | (np.isnan(y) & np.isnan(ref))
        err = np.where(same, 0.0, err)
        err = np.where(~same & (np.isnan(y) | np.isnan(ref) | np.isinf(y)), np.inf, err)
    return err


def check(lib, name: str, x: np.ndarray, bound: float | None = None, what: str = "") -> float:
    x = np.asarray(x, dtype=np.float32)
    y = apply(lib, name, x)
    ref = reference(name, x)
    err = ulp_error(y, ref)
    i = int(np.argmax(err))
    worst = float(err[i])
    bound = BOUNDS[name] if bound is None else bound
    print(f"[{lib.variant}] {name:9s} {what:10s} n={x.size:9d} max {worst:.3f} ulp at x={x[i]!r}")
    assert worst <= bound, (
        f"{name}({x[i]!r} = {x[i].item().hex()}) = {y[i]!r}, reference {ref[i]!r}: "
        f"{worst:.3f} ulp > {bound}"
    )
    return worst


def bits_range(lo: float, hi: float, stride: int) -> np.ndarray:
    """Every stride-th float32 in [lo, hi] (0 <= lo < hi) by bit pattern."""
    a = int(np.float32(lo).view(np.uint32))
    b = int(np.float32(hi).view(np.uint32))
    return np.arange(a, b + 1, stride, dtype=np.uint32).view(np.float32)


def around(x0: float, n: int = 4096) -> np.ndarray:
    """The n float32 values on each side of x0 (x0 > 0), plus their negatives."""
    b = int(np.float32(x0).view(np.uint32))
    v = np.arange(max(b - n, 0), b + n, dtype=np.uint32).view(np.float32)
    return np.concatenate([v, -v])


SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 2.0, 0.5,
     np.finfo(np.float32).max, -np.finfo(np.float32).max,
     np.finfo(np.float32).tiny, -np.finfo(np.float32).tiny,
     np.float32(2.0**-149), -np.float32(2.0**-149), 1e-30, -1e-30,
     88.72283, 88.72284, -87.33655, -103.97208, -103.97209, -104.0, 89.0,
     0.921875, 3.9375, -3.9375, 9.01, 10.0, 3.1415927, 1.5707964, 1e4, -1e4],
    dtype=np.float32,
)

# Main domains: (lo, hi) of |x| (both signs tested, negatives only where meaningful).
DOMAINS = {
    "expf": (0.0, 104.0),
    "expm1f": (0.0, 104.0),
    "logf": (0.0, float(np.finfo(np.float32).max)),
    "log1pf": (0.0, float(np.finfo(np.float32).max)),
    "erff": (0.0, 4.5),
    "tanhf": (0.0, 12.0),
    "sigmoidf": (0.0, 110.0),
    "sinf": (0.0, 2.0**33),
    "cosf": (0.0, 2.0**33),
}

EDGES = {
    "expf": [88.72283, 87.33654, 103.97208, 103.2789, 0.34657359, 1e-7, 2.0**-24],
    "expm1f": [88.72283, 17.32868, 0.34657359, 2.0**-25, 1e-3],
    "logf": [1.0, 2.0**-126, 2.0**-140, 0.70710677, 1.4142135, 3.4e38],
    "log1pf": [1.0, 2.0**-24, 1e-3, 0.29289323, 0.41421357, 0.99999994, 3.4e38],
    "erff": [0.921875, 3.9375, 2.0**-30, 1e-3, 2.0],
    "tanhf": [2.0**-12, 0.5, 9.01, 10.0, 0.34657359, 1e-3],
    "sigmoidf": [87.33654, 103.97208, 16.6355, 1e-7, 0.5],
    "sinf": [3.1415927, 1.5707964, 0.7853982, 2.0**-12, 1e4, 355.0, 2.0**24, 2.0**32],
    "cosf": [3.1415927, 1.5707964, 0.7853982, 2.0**-12, 1e4, 355.0, 2.0**24, 2.0**32],
}


@pytest.mark.parametrize("name", FUNCS)
def test_special_values(lib, name):
    xs = SPECIALS
    if name in ("sinf", "cosf"):  # outside the documented range: only bounded
        big = np.isfinite(xs) & (np.abs(xs) >= 2.0**33)
        assert np.all(np.abs(apply(lib, name, xs[big])) <= 1.0)
        xs = xs[~big]
    check(lib, name, xs, what="specials")
    y = apply(lib, name, xs)
    with np.errstate(all="ignore"):
        ref = reference(name, xs)
    # exact expectations on infinities, zeros (incl. sign) and nan
    for xi, yi, ri in zip(xs, y, ref):
        if np.isnan(ri):
            assert np.isnan(yi), (name, xi, yi)
        elif np.isinf(ri) or ri == 0 or abs(ri) == 1:
            assert yi == ri and np.signbit(yi) == np.signbit(ri), (name, xi, yi, ri)


@pytest.mark.parametrize("name", FUNCS)
def test_dense_sweep(lib, name):
    lo, hi = DOMAINS[name]
    # ~3M points of the main domain (both signs), plus every 4099th bit pattern overall.
    na = int(np.float32(hi).view(np.uint32)) - int(np.float32(lo).view(np.uint32))
    pos = bits_range(lo, hi, max(1, na // 1_500_000) | 1)
    check(lib, name, np.concatenate([pos, -pos]), what="domain")
    allbits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if name in ("sinf", "cosf"):
        allbits = allbits[~(np.abs(allbits) >= 2.0**33)]
    check(lib, name, allbits, what="all-bits")


@pytest.mark.parametrize("name", FUNCS)
def test_edges(lib, name):
    parts = [around(e) for e in EDGES[name]]
    # denormals and tiny normals, both signs
    den = np.arange(0, 2**23 + 2**20, 37, dtype=np.uint32).view(np.float32)
    parts += [den, -den]
    check(lib, name, np.concatenate(parts), what="edges")


@pytest.mark.parametrize("name", ["sinf", "cosf"])
def test_trig_large_arguments(lib, name):
    # Floats closest to multiples of pi/2 are the hard cases of the reduction: sweep
    # 1e4 .. 2^33 densely near such multiples (by construction) and randomly elsewhere.
    rng = np.random.default_rng(1)
    k = rng.integers(1, int(2**33 / (math.pi / 2)), 400_000).astype(np.float64)
    near = (k * (math.pi / 2)).astype(np.float32)
    nb = near.view(np.uint32).astype(np.int64)
    near = np.concatenate([(nb + d).astype(np.uint32).view(np.float32) for d in (-1, 0, 1)])
    check(lib, name, np.concatenate([near, -near]), what="near-k*pi/2")
    # beyond the documented range: results stay within [-1, 1] and finite
    big = rng.uniform(33, 127.9, 100_000)
    xb = np.exp2(big).astype(np.float32)
    y = apply(lib, name, np.concatenate([xb, -xb]))
    assert np.all(np.abs(y) <= 1.0)


def test_erf_odd_and_monotone_sign(lib):
    x = bits_range(0.0, 4.5, 1001)
    yp = apply(lib, "erff", x)
    yn = apply(lib, "erff", -x)
    assert np.array_equal(yp, -yn)
    assert np.all(np.diff(yp.astype(np.float64)) >= 0)


def test_vectorized(tmp_path):
    """gcc must vectorise every function's `#pragma omp simd` loop."""
    _, loop_line = driver_source()
    _, report = build(tmp_path, ["-fopt-info-vec-optimized"])
    vec_lines = {
        int(m.group(1))
        for m in re.finditer(r"driver\.c:(\d+):\d+: optimized: loop vectorized", report)
    }
    missing = [f for f, ln in loop_line.items() if ln not in vec_lines]
    assert not missing, f"not vectorized: {missing}\n{report}"
    widths = re.findall(r"loop vectorized using (\d+) byte vectors", report)
    print("vector widths reported:", sorted(set(widths)))


def test_exp_normal_is_expf_where_its_k_is_in_range(lib):
    """braze__exp_normal, the fast path of loops redone with braze_expf when a k left
    [-126, 127], is braze_expf bit for bit wherever braze__exp_k is in that range,
    which covers all of (-87.6, 88.3) and excludes nan and the infinities."""
    every = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    dense = np.linspace(-90.0, 90.0, 2_000_001, dtype=np.float32)
    x = np.concatenate([every, dense, np.float32([np.nan, -np.nan, np.inf, -np.inf, 3e38, -3e38, -87.6, 88.3,
                                                  -88.0, 89.0, 0.0, -0.0])])
    y = np.empty_like(x)
    k = np.empty(x.size, dtype=np.int32)
    fn = lib.run_exp_normal
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    fn(x.ctypes.data, y.ctypes.data, k.ctypes.data, x.size)
    inside = (k >= -126) & (k <= 127)
    exact = apply(lib, "expf", x)
    assert np.array_equal(y[inside].view(np.uint32), exact[inside].view(np.uint32))
    assert inside[(x > -87.6) & (x < 88.3)].all()
    assert not inside[~np.isfinite(x)].any()
    assert inside.sum() > 2_000_000
