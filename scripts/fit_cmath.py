"""Fit the polynomial coefficients used by braze/codegen/cmath.h.

Method: weighted minimax fit by Lawson's algorithm (iteratively reweighted least
squares on a dense grid), which converges to the best uniform approximation of a
linear basis.  Every fit is of the form

    g(x) ~= f0(x) + sum_k c_k * b_k(x)      minimising  max |w(x) * (approx - g(x))|

where f0 is a fixed exact part (e.g. 1 + r for exp), b_k are monomials and w is the
error weight (1/|g| for relative error, or whatever makes the weighted error
proportional to the final float32 ulp error).  Coefficients are then rounded to
float32 and printed as C hex-float literals, together with the float64 error of the
rounded polynomial (a float32 evaluation adds rounding on top; the C tests measure
the real thing).

Run:  .venv/bin/python scripts/fit_cmath.py
Only numpy and the standard library are used; the references are numpy/math float64.
"""

from __future__ import annotations

import math

import numpy as np


def lawson(x, g, f0, basis, w, iters=300):
    """Minimax-ish fit: returns coefficients c (float64)."""
    A = np.stack([b(x) for b in basis], axis=1)
    rhs = g - f0
    lw = np.full(x.shape, 1.0 / x.size)
    c = None
    for _ in range(iters):
        sw = np.sqrt(lw) * w
        c, *_ = np.linalg.lstsq(A * sw[:, None], rhs * sw, rcond=None)
        err = np.abs(w * (A @ c - rhs))
        lw = lw * err
        s = lw.sum()
        if s == 0:
            break
        lw /= s
    return c


def lawson_f32(x, g, f0, basis, w, iters=300):
    """Lawson fit, then round to float32 one coefficient at a time (lowest order
    first), re-fitting the remaining ones around each rounded value so that they
    absorb its rounding error."""
    fixed = []
    f0 = np.array(f0, dtype=np.float64)
    for i in range(len(basis)):
        c = lawson(x, g, f0, basis[i:], w, iters)
        ci = float(np.float32(c[0]))
        fixed.append(ci)
        f0 = f0 + ci * basis[i](x)
    return np.array(fixed)


def f32(c):
    return np.asarray(c, dtype=np.float32).astype(np.float64)


def hexf(v: float) -> str:
    v = float(np.float32(v))
    h = v.hex()
    m, e = h.split("p")
    return m.rstrip("0").rstrip(".") + "p" + e + "f"


def report(name, x, g, f0, basis, w, c):
    A = np.stack([b(x) for b in basis], axis=1)
    e64 = np.max(np.abs(w * (A @ c + f0 - g)))
    e32 = np.max(np.abs(w * (A @ f32(c) + f0 - g)))
    print(f"/* {name}: weighted max err {e64:.3e} (float32 coeffs {e32:.3e}) */")
    for i, v in enumerate(c):
        print(f"#define BRAZE_{name.upper()}_C{i} {hexf(v)}")
    print()


def cheb_grid(a, b, n=20001):
    k = np.arange(n)
    return 0.5 * (a + b) + 0.5 * (b - a) * np.cos(np.pi * (k + 0.5) / n)[::-1]


def mono(k):
    return lambda x, k=k: x**k


def fit_exp():
    # e^r = 1 + r + r^2 * (c0 + c1 r + ... ), |r| <= ln2/2, relative error.
    x = cheb_grid(-math.log(2) / 2 - 1e-4, math.log(2) / 2 + 1e-4)
    g = np.exp(x)
    basis = [mono(2 + k) for k in range(5)]
    c = lawson_f32(x, g, 1 + x, basis, 1 / g)
    report("exp", x, g, 1 + x, basis, 1 / g, c)


def fit_expm1():
    # expm1(r) = r + r^2/2 + r^3 * (c0 + c1 r + ...), |r| <= ln2/2, relative error.
    x = cheb_grid(-math.log(2) / 2 - 1e-4, math.log(2) / 2 + 1e-4)
    x = x[np.abs(x) > 1e-6]
    g = np.expm1(x)
    f0 = x + x * x / 2
    basis = [mono(3 + k) for k in range(5)]
    c = lawson_f32(x, g, f0, basis, 1 / np.abs(g))
    report("expm1", x, g, f0, basis, 1 / np.abs(g), c)


def fit_log():
    # log1p(f) = f - f^2/2 + f^3 * (c0 + c1 f + ...), f in [sqrt(1/2)-1, sqrt(2)-1].
    x = cheb_grid(math.sqrt(0.5) - 1 - 1e-4, math.sqrt(2) - 1 + 1e-4)
    x = x[np.abs(x) > 1e-6]
    g = np.log1p(x)
    f0 = x - x * x / 2
    basis = [mono(3 + k) for k in range(9)]
    c = lawson_f32(x, g, f0, basis, 1 / np.abs(g))
    report("log", x, g, f0, basis, 1 / np.abs(g), c)


ERF_SPLIT = 0.921875
ERF_ONE = 3.9375
ERFC_CENTER = ERF_SPLIT


def fit_erf():
    # Small: erf(x) = x * (c0 + c1 x^2 + ...), 0 < x <= ERF_SPLIT, relative error.
    x = cheb_grid(1e-6, ERF_SPLIT + 1e-3)
    g = np.array([math.erf(v) for v in x])
    basis = [lambda t, k=k: t ** (2 * k + 1) for k in range(6)]
    c = lawson_f32(x, g, x, basis, 1 / g)
    report("erf_small", x, g, x, basis, 1 / g, c)
    # Large: erfc(t) = exp(P(t - ERFC_CENTER)), ERF_SPLIT <= t <= ERF_ONE.  An
    # absolute error d in P gives an erf error of erfc(t)*d, and erf's ulp is 2^-24
    # over the whole interval (erf in [0.8, 1)), so the weight is erfc(t).
    t = cheb_grid(ERF_SPLIT - 1e-3, ERF_ONE + 1e-3)
    ec = np.array([math.erfc(v) for v in t])
    g = np.log(ec)
    u = t - ERFC_CENTER
    basis = [mono(k) for k in range(11)]
    c = lawson_f32(u, g, 0 * u, basis, ec)
    report("erfc_log", u, g, 0 * u, basis, ec, c)


def fit_sincos():
    x = cheb_grid(1e-6, math.pi / 4 + 1e-3)
    g = np.sin(x)
    f0 = x
    basis = [lambda t, k=k: t ** (2 * k + 3) for k in range(4)]
    c = lawson_f32(x, g, f0, basis, 1 / g)
    report("sin", x, g, f0, basis, 1 / g, c)
    g = np.cos(x)
    f0 = 1 - x * x / 2
    basis = [lambda t, k=k: t ** (2 * k + 4) for k in range(4)]
    c = lawson_f32(x, g, f0, basis, 1 / g)
    report("cos", x, g, f0, basis, 1 / g, c)


if __name__ == "__main__":
    fit_exp()
    fit_expm1()
    fit_log()
    fit_erf()
    fit_sincos()


def machin_pi(bits: int) -> int:
    """floor(pi * 2^bits) via Machin's formula in exact integer arithmetic."""
    guard = 32
    one = 1 << (bits + guard)

    def arctan_inv(m: int) -> int:
        total, term, k, sign = 0, one // m, 1, 1
        while term:
            total += sign * (term // k)
            term //= m * m
            k += 2
            sign = -sign
        return total

    return (16 * arctan_inv(5) - 4 * arctan_inv(239)) >> guard


def split_const(value_num: int, value_bits: int, parts: list[int]) -> list[float]:
    """Split value_num / 2^value_bits into doubles with the given significant bit counts
    (each truncated, so every part but the last has trailing zero bits)."""
    from fractions import Fraction

    rem = Fraction(value_num, 1 << value_bits)
    out = []
    for nb in parts:
        e = math.floor(math.log2(abs(rem)))

        scale = Fraction(2) ** (nb - 1 - e)
        part = Fraction(math.floor(rem * scale)) / scale if rem > 0 else Fraction(math.ceil(rem * scale)) / scale
        out.append(float(part))
        assert Fraction(out[-1]) == part
        rem -= part
    return out


def print_trig_constants():
    P = 400
    pi = machin_pi(P)
    # 2/pi rounded to double, and pi/2 split for Cody-Waite in double precision:
    # three 20-bit parts (k * part exact for |k| < 2^33) and a 53-bit tail.
    print("/* 2/pi */ #define BRAZE_TWO_OVER_PI", (float((1 << (P + 1)) / pi)).hex())
    parts = split_const(pi, P + 1, [20, 20, 20, 53])
    for i, v in enumerate(parts):
        print(f"#define BRAZE_PIO2_{i + 1} {v.hex()}")


if __name__ == "__main__":
    print_trig_constants()
