"""PyTorch's type promotion: which dtype an op over mixed operands computes in.

``promote_types`` is ``torch.promote_types`` over braze's dtypes; ``result_type`` is
``torch.result_type``: categories bool < integer < floating, and operands by priority,
dimensioned tensors over zero-dim tensors over Python scalars. A lower-priority operand
lifts the result only into a higher category (``int32_tensor * 0.5`` is float32,
``float16_tensor * 2.0`` stays float16, ``int32_tensor + 5`` stays int32). A Python
float scalar counts as the default float dtype (float32), an int as int64. ``can_cast``
is ``torch.can_cast``, the rule an in-place op's result must pass to be written back.

``tensor.py`` applies it at record time by casting operands (a ``cast`` node, which the
fusion compiler folds into the consuming kernel), so ops' dtype rules still see one dtype.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import dtypes as dt
from .dtypes import DType
from .errors import DtypeMismatch, Unsupported

#: Priorities of an operand (``torch.result_type``'s three states).
SCALAR, ZERO_DIM, DIM = 0, 1, 2

_SIGNED_BY_SIZE = {d.itemsize: d for d in (dt.int8, dt.int16, dt.int32, dt.int64)}


def _promote(a: DType, b: DType) -> DType:
    """``torch.promote_types`` for two element dtypes."""
    if a is b or b is dt.bool_:
        return a
    if a is dt.bool_:
        return b
    if a.is_floating_point != b.is_floating_point:
        return a if a.is_floating_point else b
    if a.is_floating_point:
        if {a, b} == {dt.float16, dt.bfloat16}:  # neither holds the other
            return dt.float32
        return a if a.itemsize > b.itemsize else b
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    u, s = (a, b) if a.kind == "uint" else (b, a)
    # A signed type holds an unsigned one only when wider (uint8 + int8 -> int16).
    return s if s.itemsize > u.itemsize else _SIGNED_BY_SIZE[2 * u.itemsize]


_TABLE: dict[tuple[DType, DType], DType] = {(a, b): _promote(a, b) for a in dt.ALL for b in dt.ALL}


def promote_types(op: str, a: DType, b: DType) -> DType:
    """The smallest dtype both ``a`` and ``b`` convert to in PyTorch's table; a
    block-quantized dtype takes part in no arithmetic (a ``DtypeMismatch``)."""
    d = a if a is b else _TABLE.get((a, b))  # one dtype, a block one too, is left to the op's rule
    if d is None:
        raise DtypeMismatch(op, [a, b], "a block-quantized tensor takes part in no element-wise op; "
                                        "dequantize it with .to(braze.float32) first")
    return d


def scalar_dtype(op: str, value: Any) -> DType:
    """The dtype a Python scalar counts as: bool, int64, or the default float32."""
    if isinstance(value, bool):
        return dt.bool_
    if isinstance(value, int):
        return dt.int64
    if isinstance(value, float):
        return dt.float32
    raise Unsupported(op, f"cannot combine a tensor with {type(value).__name__}")


def _combine(op: str, higher: DType | None, lower: DType | None) -> DType | None:
    """torch's ``combine_categories``: a lower-priority result counts only where it is
    of a higher category (bool < integer < floating)."""
    if higher is None:
        return lower
    if lower is None or higher.is_floating_point:
        return higher
    if higher is dt.bool_ or lower.is_floating_point:
        return promote_types(op, higher, lower)
    return higher


def result_type(op: str, operands: Sequence[tuple[DType, int]]) -> DType:
    """The dtype an op over ``operands`` ((dtype, priority) pairs, priority ``DIM``,
    ``ZERO_DIM`` or ``SCALAR``) computes in, as ``torch.result_type``."""
    by: list[DType | None] = [None, None, None]
    for d, priority in operands:
        cur = by[priority]
        by[priority] = d if cur is None else promote_types(op, cur, d)
    out = _combine(op, by[DIM], _combine(op, by[ZERO_DIM], by[SCALAR]))
    if out is None:
        raise Unsupported(op, "needs at least one operand")
    return out


def can_cast(src: DType, dst: DType) -> bool:
    """``torch.can_cast``: whether an in-place op may write a ``src`` result into a
    ``dst`` tensor; a cast to a lower category (float -> int, int -> bool) may not."""
    if src.is_floating_point and not dst.is_floating_point:
        return False
    return not (dst is dt.bool_ and src is not dt.bool_)


def check_cast(op: str, src: DType, dst: DType) -> None:
    """Raise unless ``can_cast(src, dst)``, naming the op and both dtypes."""
    if not can_cast(src, dst):
        raise DtypeMismatch(op, [dst, src], f"the result type {src.name} cannot be cast in place to "
                                            f"{dst.name} (PyTorch's can_cast); use the out-of-place op")
