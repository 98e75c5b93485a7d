"""Element-wise ops: unary maths, binary arithmetic and comparisons, where, cast, copy.

Operands arrive already broadcast to one shape (``tensor.py`` expands them with
stride-0 views), so every rule here is shape-preserving.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from numpy.polynomial import chebyshev as _cheb

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import DtypeMismatch
from .registry import OpDef, dtype_fixed, dtype_keep, register, require, same_dtypes, same_shape

# -- erf: numpy has none, so braze carries one accurate to ~1e-14 in float64 -----------
# |x| <= 1: a Chebyshev interpolant of erf; 1 < |x| < 6: erfc(x) = exp(-x^2) R(x) with R
# smooth, interpolated on [1, 6]; beyond 6, erf is +-1 in float64. The coefficients are
# computed here from math.erf, so there is no table to trust.
# The inner interpolant is of erf(x)/x (even, 2/sqrt(pi) at 0), multiplied back by x, so
# erf stays odd and keeps full relative accuracy near 0 (erf(0) == 0, erf(1e-30) == 1.13e-30).
_ERF_INNER = _cheb.chebinterpolate(  # type: ignore[type-var]
    lambda t: np.array([math.erf(v) / v if v else 2.0 / math.sqrt(math.pi) for v in np.atleast_1d(t)]), 28)
_ERFC_OUTER = _cheb.chebinterpolate(  # type: ignore[type-var]
    lambda t: np.array([math.erfc(v) * math.exp(v * v) for v in 3.5 + 2.5 * np.atleast_1d(t)]), 40)


def erf_f64(x: np.ndarray) -> np.ndarray:
    """erf in float64, within ~1e-14 relative of math.erf (tested)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    inner = np.clip(x, -1.0, 1.0) * _cheb.chebval(np.clip(x, -1.0, 1.0), _ERF_INNER)
    ao = np.clip(a, 1.0, 6.0)
    outer = 1.0 - _cheb.chebval((ao - 3.5) / 2.5, _ERFC_OUTER) * np.exp(-ao * ao)
    outer = np.where(a >= 6.0, 1.0, outer)
    return np.where(a <= 1.0, inner, np.copysign(outer, x)).astype(np.float64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a non-positive argument only: no overflow for large |x|.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf_f64(x / math.sqrt(2.0)).astype(x.dtype))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _int_identity(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """floor/ceil/round of an integer is the integer (PyTorch, array API); numpy would
    go through a float type and lose int64 precision."""
    return lambda x: x.copy() if x.dtype.kind in "iu" else fn(x)


def _sign(x: np.ndarray) -> np.ndarray:
    return np.sign(x)


# name -> (reference, accepted kinds, compute mode, output dtype or None for "same")
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str, str, DType | None]] = {
    "neg": (np.negative, "float int", "half", None),
    "abs": (np.abs, "float int uint", "half", None),
    "exp": (np.exp, "float", "half", None),
    "log": (np.log, "float", "half", None),
    "sqrt": (np.sqrt, "float", "half", None),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), "float", "precise", None),
    "reciprocal": (lambda x: 1.0 / x, "float", "half", None),
    "sin": (np.sin, "float", "half", None),
    "cos": (np.cos, "float", "half", None),
    "tanh": (np.tanh, "float", "half", None),
    "sigmoid": (_sigmoid, "float", "precise", None),
    "erf": (erf_f64, "float", "precise", None),
    "relu": (lambda x: np.maximum(x, x.dtype.type(0)), "float int", "half", None),
    "gelu": (_gelu, "float", "precise", None),
    "gelu_tanh": (_gelu_tanh, "float", "precise", None),
    "silu": (lambda x: x * _sigmoid(x), "float", "precise", None),
    "floor": (_int_identity(np.floor), "float int uint", "half", None),
    "ceil": (_int_identity(np.ceil), "float int uint", "half", None),
    "round": (_int_identity(np.round), "float int uint", "half", None),
    "sign": (_sign, "float int uint", "half", None),
    "logical_not": (np.logical_not, "float int uint bool", "native", dt.bool_),
    # Integers and bools are never nan or inf (PyTorch accepts every dtype here).
    "isnan": (np.isnan, "float int uint bool", "half", dt.bool_),
    "isinf": (np.isinf, "float int uint bool", "half", dt.bool_),
    "isfinite": (np.isfinite, "float int uint bool", "half", dt.bool_),
}


def _unary_op(name: str, fn: Callable[[np.ndarray], np.ndarray], kinds: str, mode: str, out: DType | None) -> OpDef:
    rule = dtype_keep(kinds) if out is None else dtype_fixed(out, kinds)
    return OpDef(name, same_shape, rule, fn, compute=mode)


for _name, (_fn, _kinds, _mode, _out) in UNARY.items():
    register(_unary_op(_name, _fn, _kinds, _mode, _out))


# -- binary ------------------------------------------------------------------------------

def _true_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.true_divide(a.astype(np.float64), b.astype(np.float64))
    return np.true_divide(a, b)


def _int_safe(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Integer // and % by zero give 0 (numpy's choice) instead of a flush-time crash."""
    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.dtype.kind in "iu":
            zero = b == 0
            return np.where(zero, 0, fn(a, np.where(zero, 1, b))).astype(a.dtype)
        return fn(a, b)
    return ref


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        # Integer powers with negative exponents truncate toward zero: only +-1 survive.
        neg = b < 0
        pos = np.power(a, np.where(neg, 0, b))
        odd = (b % 2) != 0
        small = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0))
        return np.where(neg, small, pos).astype(a.dtype)
    return np.power(a, b)


def _float_div_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    d = same_dtypes(op, dtypes)
    require(op, d, "float int uint", dtypes)
    return [d if d.is_floating_point else dt.float32]


# name -> (reference, accepted kinds, output: None same / DType)
BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], str, DType | None]] = {
    "add": (np.add, "float int uint", None),
    "sub": (np.subtract, "float int uint", None),
    "mul": (np.multiply, "float int uint", None),
    "floor_divide": (_int_safe(np.floor_divide), "float int uint", None),
    "remainder": (_int_safe(np.remainder), "float int uint", None),
    "pow": (_pow, "float int uint", None),
    "maximum": (np.maximum, "float int uint bool", None),
    "minimum": (np.minimum, "float int uint bool", None),
    "eq": (np.equal, "float int uint bool", dt.bool_),
    "ne": (np.not_equal, "float int uint bool", dt.bool_),
    "lt": (np.less, "float int uint bool", dt.bool_),
    "le": (np.less_equal, "float int uint bool", dt.bool_),
    "gt": (np.greater, "float int uint bool", dt.bool_),
    "ge": (np.greater_equal, "float int uint bool", dt.bool_),
    "logical_and": (np.logical_and, "float int uint bool", dt.bool_),
    "logical_or": (np.logical_or, "float int uint bool", dt.bool_),
    "logical_xor": (np.logical_xor, "float int uint bool", dt.bool_),
}

for _name, (_bfn, _kinds, _out) in BINARY.items():
    register(OpDef(_name, same_shape, dtype_keep(_kinds) if _out is None else dtype_fixed(_out, _kinds), _bfn))
register(OpDef("div", same_shape, _float_div_dtype, _true_div))


def check_condition(op: str, dtype: DType) -> None:
    """``where``'s condition is a bool tensor."""
    if dtype is not dt.bool_:
        raise DtypeMismatch(op, [dtype], f"condition must be bool, got {dtype.name}")


def _where_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    check_condition(op, dtypes[0])
    return [same_dtypes(op, dtypes[1:])]


register(OpDef("where", same_shape, _where_dtype, lambda c, a, b: np.where(c, a, b), compute="native"))


# -- dtype conversion and copies ------------------------------------------------------------

def _cast_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    return [attrs["dtype"]]


def _cast(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype.kind in "int uint" and (x.dtype.kind == "f" or x.dtype == dt.bfloat16.np):
        return float_to_int(x, dtype)
    if dtype.is_half and x.dtype.kind in "iub":
        x = x.astype(np.float32)
    return x.astype(dtype.np)


def float_to_int(x: np.ndarray, dtype: DType) -> np.ndarray:
    """float -> int as braze defines it (C and numpy leave the edges undefined): truncate
    toward zero, saturate at the type's range (so +-inf give its max and min), nan gives
    0. The compiled cast (``codegen/c.py``) does the same comparisons."""
    info = np.iinfo(dtype.np)
    w = x.astype(np.float64)
    lo, hi = float(info.min), float(info.max)
    inside = (w > lo) & (w < hi)  # nan is neither
    out = np.where(inside, np.trunc(np.where(inside, w, 0)), 0).astype(np.int64)
    out = np.where(w <= lo, info.min, np.where(w >= hi, info.max, out))
    return out.astype(dtype.np)


register(OpDef("cast", same_shape, _cast_dtype, _cast, compute="native"))
register(OpDef("copy", same_shape, dtype_keep(), lambda x: np.array(x, copy=True), compute="native"))
register(OpDef("assign", same_shape, dtype_keep(), lambda x: x, compute="native", inplace=True))
