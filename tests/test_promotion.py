"""Type promotion, as PyTorch's ``torch.result_type``: result dtypes of mixed operands
(dimensioned tensors, zero-dim tensors, Python scalars) and their values against numpy
computed in the promoted dtype; in-place writes that ``torch.can_cast`` refuses; the
promoting cast fused for free. The expected dtypes are PyTorch's table, written out;
with torch importable they are also checked against ``torch.result_type``.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np
import pytest

import braze
from braze import DtypeMismatch, promotion
from braze import dtypes as bdt

from braze.runtime.cpu import compiler_available
from braze.stream import fusion_enabled
from strategies import assert_close, compute_dtype

f16, bf16, f32, f64 = braze.float16, braze.bfloat16, braze.float32, braze.float64
i8, u8, i16, i32, i64, b = braze.int8, braze.uint8, braze.int16, braze.int32, braze.int64, braze.bool_

A = [1, 2, 3, 4, 5, 6]
B = [1, 2, 1, 2, 1, 2]  # non-zero (a divisor), small (an exponent)


class Zero:
    """A zero-dim tensor operand of ``dtype`` (a bare DType is a dimensioned one)."""

    def __init__(self, dtype: bdt.DType) -> None:
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"0d-{self.dtype.name}"


# (lhs, rhs, result dtype): PyTorch's promotion table and its priority rules.
TABLE: list[tuple[Any, Any, bdt.DType]] = [
    # tensor, tensor: the promote_types table
    (f32, f64, f64), (f16, f32, f32), (bf16, f16, f32), (bf16, f32, f32), (f16, f64, f64),
    (i32, i64, i64), (i8, i16, i16), (u8, i8, i16), (u8, i16, i16), (u8, i64, i64),
    (i64, f16, f16), (i32, f32, f32), (u8, bf16, bf16), (i64, f64, f64),
    (b, i8, i8), (b, u8, u8), (b, f16, f16), (b, i64, i64),
    # tensor, Python scalar: a scalar lifts the category only
    (f16, 2.0, f16), (bf16, 2, bf16), (f64, 2.0, f64), (i32, 5, i32), (i8, 2, i8), (u8, 2, u8),
    (i8, 2.5, f32), (u8, 1.5, f32), (i64, 2.5, f32), (i32, 2.0, f32),
    (b, 2, i64), (b, 1.5, f32), (b, True, b), (i64, True, i64), (f32, True, f32),
    # tensor, zero-dim tensor: the same, between tensors of the two priorities
    (f16, Zero(f32), f16), (i32, Zero(i64), i32), (i32, Zero(f64), f64), (i8, Zero(f16), f16),
    (b, Zero(i32), i32), (u8, Zero(i8), u8), (bf16, Zero(f64), bf16),
    # zero-dim tensors among themselves, and with scalars
    (Zero(f32), Zero(f64), f64), (Zero(u8), Zero(i8), i16), (Zero(i64), 2.5, f32), (Zero(f16), 2.0, f16),
    (Zero(b), 3, i64),
]

ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floor_divide": operator.floordiv,
    "remainder": operator.mod, "pow": operator.pow, "maximum": braze.maximum, "minimum": braze.minimum,
}
CMP: dict[str, Callable[[Any, Any], Any]] = {"eq": operator.eq, "lt": operator.lt, "ge": operator.ge}
NP = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floor_divide": np.floor_divide,
      "remainder": np.remainder, "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
      "eq": np.equal, "lt": np.less, "ge": np.greater_equal, "div": np.true_divide}


def _operand(spec: Any, values: list[int]) -> tuple[Any, Any]:
    """(braze operand, numpy value) for a table entry: a (2, 3) tensor, a zero-dim one or a scalar."""
    if isinstance(spec, bdt.DType):
        a = np.array(values).reshape(2, 3).astype(spec.np)
        return braze.tensor(a), a
    if isinstance(spec, Zero):
        a = np.array(values[1]).astype(spec.dtype.np)
        return braze.tensor(a), a
    return spec, np.array(spec)


def _dtype_of(spec: Any) -> bdt.DType:
    if isinstance(spec, bdt.DType):
        return spec
    return spec.dtype if isinstance(spec, Zero) else promotion.scalar_dtype("test", spec)


def _expect(name: str, x: np.ndarray, y: np.ndarray, d: bdt.DType, out: bdt.DType) -> np.ndarray:
    """numpy's ``name`` computed in ``d`` (half types in float32, rounded once), as ``out``."""
    with np.errstate(all="ignore"):
        return np.asarray(NP[name](x.astype(d.np).astype(compute_dtype(d)),
                                   y.astype(d.np).astype(compute_dtype(d)))).astype(out.np)


def _refused(name: str, lhs: Any, rhs: Any, d: bdt.DType) -> bool:
    """Subtraction with a bool tensor (PyTorch refuses it too), and arithmetic that stays
    bool (braze refuses it all: PyTorch would answer logically, not as integers)."""
    bools = [s for s in (lhs, rhs) if not isinstance(s, (int, float)) and _dtype_of(s) is b]
    return (name == "sub" and bool(bools)) or (d is b and name not in ("maximum", "minimum"))


@pytest.mark.parametrize("lhs,rhs,want", TABLE, ids=str)
def test_promote_table(lhs: Any, rhs: Any, want: bdt.DType) -> None:
    x, xa = _operand(lhs, A)
    y, ya = _operand(rhs, B)
    shape = np.broadcast(xa, ya).shape
    for swap in (False, True):  # promotion is symmetric: either side gives the same type
        (p, pa), (q, qa) = ((y, ya), (x, xa)) if swap else ((x, xa), (y, ya))
        for name, fn in ARITH.items():
            if _refused(name, lhs, rhs, want):
                with pytest.raises(DtypeMismatch, match=name):
                    fn(p, q)
                continue
            assert_close(fn(p, q), _expect(name, pa, qa, want, want), want, "transc" if name == "pow" else "simple",
                         shape=shape)
        for name, fn in CMP.items():  # computed in the promoted type, bool out
            assert_close(fn(p, q), _expect(name, pa, qa, want, b), b, shape=shape)
        div = want if want.is_floating_point else f32  # true division of integers is float32
        if want is not b:
            assert_close(p / q, _expect("div", pa, qa, div, div), div, shape=shape)


@pytest.mark.parametrize("lhs,rhs,want", [t for t in TABLE if not isinstance(t[0], (int, float))], ids=str)
def test_where_promotes_its_branches(lhs: Any, rhs: Any, want: bdt.DType) -> None:
    x, xa = _operand(lhs, A)
    y, ya = _operand(rhs, B)
    cond = np.array([True, False, True, False, False, True]).reshape(2, 3)
    c = braze.tensor(cond)
    assert_close(braze.where(c, x, y), np.where(cond, xa.astype(want.np), ya.astype(want.np)), want)
    assert_close(braze.where(c, y, x), np.where(cond, ya.astype(want.np), xa.astype(want.np)), want)


@pytest.mark.parametrize("a,b_,want", [(1.0, 0, f32), (1, 0, i64), (True, False, b), (2, 0.5, f32)], ids=str)
def test_where_of_two_scalars_takes_the_default_dtypes(a: Any, b_: Any, want: bdt.DType) -> None:
    cond = np.array([True, False, True])
    assert_close(braze.where(braze.tensor(cond), a, b_), np.where(cond, a, b_).astype(want.np), want)


def test_integer_true_division_is_float32_and_floor_division_stays_integer() -> None:
    a = np.array([7, -7, 5, 9], np.int32)
    q = np.array([2, 2, 3, 4], np.int64)
    x, y = braze.tensor(a), braze.tensor(q)
    assert_close(x / y, (a.astype(np.float64) / q).astype(np.float32), f32)
    assert_close(x // y, np.floor_divide(a.astype(np.int64), q), i64)
    assert_close(x / 2, (a / 2).astype(np.float32), f32)
    assert_close(x // 2, a // 2, i32)
    assert_close(x // 2.0, np.floor_divide(a.astype(np.float32), np.float32(2)), f32)


def test_pow_promotes() -> None:
    a = np.array([1, 2, 3, 4], np.int32)
    x = braze.tensor(a)
    assert_close(x ** 0.5, np.sqrt(a.astype(np.float32)), f32, "transc")
    assert_close(x ** -1.0, 1 / a.astype(np.float32), f32, "transc")  # a float exponent: float32, allowed
    assert_close(x ** 2, a ** 2, i32)
    assert_close(2.0 ** x, np.float32(2.0) ** a.astype(np.float32), f32, "transc")
    h = braze.tensor(np.array([1.5, 2.0], np.float16))
    assert_close(h ** braze.tensor(np.array([2.0, 3.0], np.float32)), np.array([2.25, 8.0], np.float32), f32)
    with pytest.raises(braze.Unsupported):  # as in PyTorch
        x ** -1


def test_clamp_promotes_to_its_bounds() -> None:
    a = np.array([-3, 0, 2, 7], np.int64)
    assert_close(braze.tensor(a).clamp(0, 1.5), np.clip(a.astype(np.float32), 0, 1.5), f32)
    assert_close(braze.tensor(a).clamp(0, 5), np.clip(a, 0, 5), i64)


def test_cat_promotes() -> None:
    x = np.array([[1.5, 2.5]], np.float16)
    y = np.array([[3, 4]], np.int64)
    assert_close(braze.cat([braze.tensor(x), braze.tensor(y)]), np.concatenate([x, y.astype(np.float16)]), f16)
    z = np.array([[5.0, 6.0]], np.float32)
    got = braze.cat([braze.tensor(x), braze.tensor(y), braze.tensor(z)], dim=1)
    assert_close(got, np.concatenate([x.astype(np.float32), y.astype(np.float32), z], axis=1), f32)


def test_masked_fill_keeps_the_input_dtype() -> None:
    x = np.array([1.0, 2.0, 3.0], np.float16)
    m = np.array([True, False, True])
    xt, mt = braze.tensor(x), braze.tensor(m)
    assert_close(xt.masked_fill(mt, braze.tensor(-2.5)), np.where(m, np.float16(-2.5), x), f16)
    assert_close(xt.masked_fill(mt, braze.tensor(7)), np.where(m, np.float16(7), x), f16)
    ints = braze.tensor(np.array([1, 2, 3], np.int32))
    assert_close(ints.masked_fill(mt, 9), np.where(m, 9, [1, 2, 3]), i32)
    with pytest.raises(DtypeMismatch, match="masked_fill"):
        ints.masked_fill(mt, braze.tensor(0.5))
    with pytest.raises(DtypeMismatch, match="masked_fill"):
        ints.masked_fill(mt, 0.5)


@pytest.mark.skipif(not (fusion_enabled() and compiler_available()), reason="counts the fused executor's kernels")
def test_mask_multiply_is_one_fused_kernel() -> None:
    """The promoting cast is a node the fusion compiler folds into its consumer: ``x * mask``
    takes the steps of ``x * mask.to(x.dtype)`` (one kernel)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = x % 3 == 0
    for make in (lambda t, k: t * k + 1, lambda t, k: t * k.to(braze.float32) + 1):
        xt, mt = braze.tensor(x), braze.tensor(m)
        braze.synchronize()
        braze.reset_stats()
        assert_close(make(xt, mt), x * m + 1, f32)
        assert braze.stats()["kernel_launches"] == 1


# -- in place: promoted, then cast back where torch.can_cast allows -------------------------------

def test_inplace_casts_the_promoted_result_back() -> None:
    x = np.array([1.5, -2.0, 3.25], np.float32)
    m = np.array([True, False, True])
    t = braze.tensor(x)
    t *= braze.tensor(m)
    assert_close(t, x * m, f32)
    h = braze.tensor(x.astype(np.float16))
    h += braze.tensor(np.array([0.1, 0.2, 0.3], np.float32))
    assert_close(h, (x.astype(np.float16).astype(np.float32) + np.float32([0.1, 0.2, 0.3])).astype(np.float16), f16)
    i = braze.tensor(np.array([1, 2, 3], np.int32))
    i.add_(braze.tensor(np.array([10, 20, 30], np.int64)))
    assert_close(i, np.array([11, 22, 33]), i32)
    i.mul_(braze.tensor(np.array([True, False, True])))
    assert_close(i, np.array([11, 0, 33]), i32)


@pytest.mark.parametrize("dst,src,other,op", [
    (i32, "float32", 0.5, lambda t, o: t.__imul__(o)),
    (i64, "float32", braze.ones(3), lambda t, o: t.add_(o)),
    (i64, "float32", 2, lambda t, o: t.div_(o)),
    (b, "int64", 1, lambda t, o: t.add_(o)),
    (u8, "float32", braze.ones(3), lambda t, o: t.__setitem__(slice(None), o)),
], ids=["imul-float-scalar", "add_-float-tensor", "div_-int", "bool-add_-int", "setitem-float-into-uint8"])
def test_inplace_refuses_what_can_cast_refuses(dst: bdt.DType, src: str, other: Any, op: Any) -> None:
    t = braze.tensor(np.array([1, 0, 3]).astype(dst.np)).realize()
    if isinstance(other, braze.Tensor):
        other.realize()
    braze.synchronize()
    recorded = braze.stats()["nodes_recorded"]
    with pytest.raises(DtypeMismatch) as e:
        op(t, other)
    assert dst.name in str(e.value) and src in str(e.value)
    assert braze.stats()["nodes_recorded"] == recorded  # the promoted op was taken back
    np.testing.assert_array_equal(t.numpy(), np.array([1, 0, 3]).astype(dst.np))


def test_setitem_casts_what_can_cast_allows() -> None:
    x = braze.zeros(2, 3)
    x[0] = braze.tensor([1, 2, 3])
    x[braze.tensor([False, True])] = braze.tensor(np.array(4, np.int8))
    assert_close(x, np.array([[1, 2, 3], [4, 4, 4]], np.float32), f32)


# -- the table itself --------------------------------------------------------------------------------

def test_promote_types_is_a_join() -> None:
    """Symmetric, idempotent, bool the bottom; the result holds both operands (can_cast)."""
    for x in bdt.ALL:
        assert promotion.promote_types("t", x, x) is x
        assert promotion.promote_types("t", b, x) is x
        for y in bdt.ALL:
            r = promotion.promote_types("t", x, y)
            assert r is promotion.promote_types("t", y, x)
            assert promotion.can_cast(x, r) and promotion.can_cast(y, r)
            for z in bdt.ALL:
                assert promotion.promote_types("t", r, z) is promotion.promote_types("t", x,
                                                                                 promotion.promote_types("t", y, z))


def test_block_dtypes_do_not_promote() -> None:
    from braze.quant.formats import DTYPES
    q = next(iter(DTYPES.values()))
    with pytest.raises(DtypeMismatch, match="block"):
        promotion.promote_types("add", q, f32)


def test_can_cast_is_torchs() -> None:
    for x in bdt.ALL:
        for y in bdt.ALL:
            lower = (x.is_floating_point and not y.is_floating_point) or (y is b and x is not b)
            assert promotion.can_cast(x, y) is (not lower), (x, y)


@pytest.mark.parametrize("lhs,rhs,want", TABLE, ids=str)
def test_table_matches_torch_result_type(lhs: Any, rhs: Any, want: bdt.DType) -> None:
    torch = pytest.importorskip("torch")

    def operand(spec: Any) -> Any:
        if isinstance(spec, (bool, int, float)):
            return spec
        d = getattr(torch, _dtype_of(spec).name)
        return torch.ones((2, 3) if isinstance(spec, bdt.DType) else (), dtype=d)

    assert torch.result_type(operand(lhs), operand(rhs)) == getattr(torch, want.name)
