"""The op registry: every op defined once.

An ``OpDef`` carries the op's meta function (output shapes from input shapes and
attributes), its dtype rule, its reference implementation in numpy, and a slot for its
lowering to the loop IR (filled by the fusion compiler). ``tensor.py`` checks and
records through the meta and dtype rules; ``runtime/reference.py`` executes through
the reference implementations. Rules raise braze's typed errors naming the op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..dtypes import DType
from ..errors import DtypeMismatch
from ..layout import Shape

ShapeRule = Callable[[str, Sequence[Shape], dict[str, Any]], list[Shape]]
DtypeRule = Callable[[str, Sequence[DType], dict[str, Any]], list[DType]]
Reference = Callable[..., Any]


@dataclass(eq=False)
class OpDef:
    name: str
    shape: ShapeRule
    dtype: DtypeRule
    reference: Reference
    #: "half": float16/bfloat16 inputs are computed in float32 (as PyTorch on the CPU);
    #: "precise": float32 too is computed in float64 and rounded once (composite
    #: functions such as gelu, whose float32 evaluation would round several times).
    compute: str = "half"
    #: Lowering to the loop IR; None until the fusion compiler knows the op.
    lower: Callable[..., Any] | None = None
    #: Writes into its first output's existing storage instead of a fresh one.
    inplace: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    REGISTRY[op.name] = op
    return op


def get(name: str) -> OpDef:
    return REGISTRY[name]


# -- rules shared by many ops ------------------------------------------------------------

def same_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    """Element-wise ops: ``tensor.py`` has already broadcast every operand."""
    return [shapes[0]]


def same_dtypes(op: str, dtypes: Sequence[DType]) -> DType:
    """All operands share one dtype: ``tensor.py`` has already promoted (and cast) the
    operands of the ops that promote; the others take one dtype."""
    first = dtypes[0]
    for d in dtypes[1:]:
        if d is not first:
            raise DtypeMismatch(op, dtypes, f"{op} takes operands of one dtype; cast one with .to(dtype)")
    return first


def require(op: str, dtype: DType, kinds: str, dtypes: Sequence[DType] | None = None) -> None:
    """Raise unless ``dtype.kind`` is one of ``kinds`` ("float", "int uint", ...)."""
    if dtype.kind not in kinds.split():
        what = {"float": "a floating dtype", "int uint": "an integer dtype",
                "float int uint": "a numeric dtype", "bool": "bool"}.get(kinds, kinds)
        raise DtypeMismatch(op, dtypes or [dtype], f"expects {what}, got {dtype.name}; cast with .to(dtype)")


def dtype_keep(kinds: str = "float int uint bool") -> DtypeRule:
    allowed = frozenset(kinds.split())

    def rule(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
        d = same_dtypes(op, dtypes)
        if d.kind not in allowed:
            require(op, d, kinds, dtypes)  # raises, naming what was expected
        return [d]
    return rule


def dtype_fixed(out: DType, kinds: str = "float int uint bool") -> DtypeRule:
    def rule(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
        d = same_dtypes(op, dtypes)
        require(op, d, kinds, dtypes)
        return [out]
    return rule


def errstate() -> Any:
    """Reference implementations follow IEEE semantics quietly (inf, nan, 1/0)."""
    return np.errstate(all="ignore")
