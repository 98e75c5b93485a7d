"""Tensor: eager to write, lazy to run.

A Tensor is a dtype and device, a Layout, and a Storage. Calling an op checks the
operands at once (shapes, dtypes, devices: a mistake raises a typed error at the
user's line and records nothing), then records one node on the device's stream and
returns a tensor over a pending storage. Movement ops (view, permute, slicing, expand)
record nothing at all: they return a new Layout over the same Storage.

Follow one tensor: ``a + b`` -> ``_binary`` broadcasts both operands with stride-0
views (``layout.py``) -> ``_record`` runs the op's shape and dtype rules
(``ops/registry.py``) and appends a node to ``stream.py`` -> a sync point such as
``numpy()`` flushes the stream to the executor (``plan.py``, or ``runtime/reference.py``).

This file holds the class and the recording core; the API around it lives beside it:
``views.py`` (the movement methods, a mixin), ``creation.py`` (tensors from data,
filled, ranges), ``functions.py`` (every op as a function, and the methods that are
those functions, declared for type checkers in ``attached.py``) and ``indexing.py``
(``x[...]``).
"""

from __future__ import annotations

import builtins as _b
import functools
import math
from math import prod
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Sequence, TypeAlias

import numpy as np

from . import dtypes as dt
from .attached import Attached
from .device import CPU, Device, as_device
from .dtypes import DType, as_dtype
from .errors import (
    DeviceMismatch,
    DtypeMismatch,
    RankMismatch,
    ShapeMismatch,
    Unsupported,
)
from .layout import Layout, Shape, broadcast_shapes, normalize_dim
from .ops.quant import check_block_rows, weight_type
from .ops.registry import REGISTRY
from .promotion import DIM, SCALAR, ZERO_DIM, check_cast, result_type, scalar_dtype
from .runtime import memory
from .stats import COUNTERS
from .storage import Storage, block_bytes, host_view, placed, strided
from .stream import Node, Operand, stream_of
from .views import Views, infer_shape, shape_arg_infer

Scalar = int | float | bool
# Builtins under other names: Tensor has methods called int, float and bool.
_int: TypeAlias = int
_float: TypeAlias = float
_bool: TypeAlias = bool


class ValuesIndices(NamedTuple):
    """What ``max(dim)``, ``min(dim)``, ``sort`` and ``topk`` return, as in PyTorch."""

    values: "Tensor"
    indices: "Tensor"


def _shape_arg(op: str, shape: tuple[Any, ...]) -> Shape:
    """Accept ``f(2, 3)`` and ``f((2, 3))``; sizes must be non-negative ints."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for n in shape:
        if isinstance(n, Tensor):
            n = n.item()
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise ShapeMismatch(op, [tuple(shape)], f"sizes must be ints, got {n!r}")
        if n < 0:
            raise ShapeMismatch(op, [tuple(shape)], f"negative size {n}")
        out.append(int(n))
    return tuple(out)


class Tensor(Views, Attached):
    __slots__ = ("_storage", "_layout", "__weakref__")
    __array_priority__ = 1000  # numpy defers ``ndarray + Tensor`` to Tensor.__radd__

    def __init__(self, storage: Storage, layout: Layout) -> None:
        self._storage = storage
        self._layout = layout

    if TYPE_CHECKING:  # methods attached from the function forms (their other stubs: attached.py)
        def sort(self, dim: _int = -1, descending: _bool = False, stable: _bool = True) -> ValuesIndices: ...
        def topk(self, k: _int, dim: _int = -1, largest: _bool = True, sorted: _bool = True) -> ValuesIndices: ...

    # -- metadata ------------------------------------------------------------------------
    @property
    def dtype(self) -> DType:
        return self._storage.dtype

    @property
    def device(self) -> Device:
        return self._storage.device

    @property
    def shape(self) -> Shape:
        return self._layout.shape

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def ndim(self) -> _int:
        return len(self._layout.shape)

    def size(self, dim: _int | None = None) -> Any:
        if dim is None:
            return self.shape
        return self.shape[normalize_dim("size", dim, self.ndim)]

    def dim(self) -> _int:
        return self.ndim

    def numel(self) -> _int:
        return self._layout.numel

    def element_size(self) -> _int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> _int:
        return self.numel() * self.dtype.itemsize

    def stride(self, dim: _int | None = None) -> Any:
        if dim is None:
            return self._layout.strides
        return self._layout.strides[normalize_dim("stride", dim, self.ndim)]

    def storage_offset(self) -> _int:
        return self._layout.offset

    def is_contiguous(self) -> _bool:
        return self._layout.is_contiguous()

    def is_floating_point(self) -> _bool:
        return self.dtype.is_floating_point

    def shares_storage(self, other: "Tensor") -> _bool:
        """True when both tensors are views of one storage (a write to one may show in the other)."""
        return self._storage is other._storage

    def _dims(self, n: _int) -> Shape:
        if self.ndim != n:
            raise RankMismatch(f"dims{n}", n, self.shape)
        return self.shape

    def dims0(self) -> Shape:
        return self._dims(0)

    def dims1(self) -> tuple[_int]:
        return self._dims(1)  # type: ignore[return-value]

    def dims2(self) -> tuple[_int, _int]:
        return self._dims(2)  # type: ignore[return-value]

    def dims3(self) -> tuple[_int, _int, _int]:
        return self._dims(3)  # type: ignore[return-value]

    def dims4(self) -> tuple[_int, _int, _int, _int]:
        return self._dims(4)  # type: ignore[return-value]

    def dims5(self) -> tuple[_int, _int, _int, _int, _int]:
        return self._dims(5)  # type: ignore[return-value]

    # -- sync points ---------------------------------------------------------------------
    def realize(self) -> "Tensor":
        """Make this tensor's data exist: flush the stream if the tensor is still being
        computed or written (an already-computed tensor is not a sync point)."""
        st = self._storage
        if st.producer is not None or st.dirty:
            stream_of(self.device).flush()
        st.data()
        COUNTERS["data_reads"] += 1
        return self

    def numpy(self) -> np.ndarray:
        """A zero-copy numpy view of the data (flushes the stream first)."""
        st = self._storage
        if st.dtype.is_block:
            raise DtypeMismatch("numpy", [self.dtype], "a block-quantized tensor has no numpy element type: "
                                                       "take .to(braze.float32) (dequantized) first")
        array = st._array
        if array is None or st.producer is not None or st.dirty:
            array = self.realize()._storage.data()
        else:  # computed already: ``realize`` would only count the read (a jit call's result)
            COUNTERS["data_reads"] += 1
        lay = self._layout
        if st.device.type == "cpu":
            return strided(array, lay.shape, lay.strides, lay.offset, writeable=not st.readonly)
        # A cuda tensor's data is copied back (device memory is no numpy buffer; under
        # the interpreter it is host memory, copied all the same so both modes agree).
        return host_view(array, lay.shape, lay.strides, lay.offset).copy()

    def __array__(self, dtype: Any = None, copy: _bool | None = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.numpy().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[_int, _int]:
        return (1, 0)  # kDLCPU

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ShapeMismatch("item", [self.shape], "only a one-element tensor converts to a Python scalar")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        arr = self.numpy()
        if self.dtype.is_half:
            arr = arr.astype(np.float32)
        return arr.tolist()

    def __bool__(self) -> _bool:
        if self.numel() != 1:
            raise ShapeMismatch("__bool__", [self.shape], "the truth value of a tensor with more than one element is ambiguous")
        return bool(self.item())

    def __float__(self) -> _float:
        return float(self.item())

    def __int__(self) -> _int:
        return int(self.item())

    def __index__(self) -> _int:
        if not self.dtype.is_integer or self.numel() != 1:
            raise DtypeMismatch("__index__", [self.dtype], "only a one-element integer tensor can be used as an index")
        return int(self.item())

    def __repr__(self) -> str:
        if self.dtype.is_block:
            return f"tensor(<{self.dtype.name} blocks, shape={self.shape}>, dtype={self.dtype!r})"
        arr = self.numpy()
        if self.dtype.is_half:
            arr = arr.astype(np.float32)
        body = np.array2string(arr, separator=", ", prefix="tensor(", threshold=1000, edgeitems=3,
                               precision=4, suppress_small=True)
        extra = "" if self.dtype in (dt.float32, dt.int64, dt.bool_) else f", dtype={self.dtype!r}"
        return f"tensor({body}{extra})"

    def __len__(self) -> _int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __hash__(self) -> _int:
        return id(self)

    # -- recording -----------------------------------------------------------------------
    def _view(self, layout: Layout) -> "Tensor":
        return Tensor(self._storage, layout)

    # -- conversion ----------------------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> "Tensor":
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)`` or ``to(other)``; casting
        is always explicit in braze, and this is how it is done."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        if kwargs:
            raise Unsupported("to", f"unknown arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, (DType, np.dtype, type)) or (isinstance(a, str) and a.split(":")[0] not in ("cpu", "cuda")):
                dtype = a
            else:
                device = a
        if device is not None:
            dev = as_device(device, "to")
            if dev != self.device:  # moved, then cast (the cast runs on the new device)
                return _moved(self, dev).to(dtype) if dtype is not None else _moved(self, dev)
        if dtype is None or as_dtype(dtype, "to") is self.dtype:
            return self
        if self.dtype.is_block:  # dequantized, then cast if another float type is asked for
            return dequantize(self).to(dtype)
        return _record("cast", [self], dtype=as_dtype(dtype, "to"))

    def float(self) -> "Tensor":
        return self.to(dt.float32)

    def double(self) -> "Tensor":
        return self.to(dt.float64)

    def half(self) -> "Tensor":
        return self.to(dt.float16)

    def bfloat16(self) -> "Tensor":
        return self.to(dt.bfloat16)

    def int(self) -> "Tensor":
        return self.to(dt.int32)

    def long(self) -> "Tensor":
        return self.to(dt.int64)

    def bool(self) -> "Tensor":
        return self.to(dt.bool_)

    def cpu(self) -> "Tensor":
        return self.to(CPU)

    def cuda(self) -> "Tensor":
        return self.to("cuda")

    def detach(self) -> "Tensor":
        return self

    def clone(self) -> "Tensor":
        return _record("copy", [self])

    def contiguous(self) -> "Tensor":
        return self if self.is_contiguous() else _record("copy", [self])

    # -- movement: views, no node ------------------------------------------------------------
    def reshape(self, *shape: Any) -> "Tensor":
        shape_ = infer_shape("reshape", self, shape_arg_infer("reshape", shape))
        lay = self._layout.view(shape_)
        if lay is not None:
            return self._view(lay)
        return _record("copy", [self])._view(Layout.contiguous(shape_))

    def repeat(self, *sizes: Any) -> "Tensor":
        reps = _shape_arg("repeat", sizes)
        if len(reps) < self.ndim:
            raise ShapeMismatch("repeat", [self.shape, reps], "fewer repeat counts than dims")
        x = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
        inter = []
        for r, n in zip(reps, x.shape):
            inter += [r, n]
        x = x.reshape(tuple(v for n in x.shape for v in (1, n))).expand(tuple(inter))
        return x.reshape(tuple(r * n for r, n in zip(reps, self.reshape((1,) * (len(reps) - self.ndim) + self.shape).shape)))

    # -- indexing ------------------------------------------------------------------------
    # -- in-place writes -------------------------------------------------------------------
    def copy_(self, src: "Tensor | Scalar | np.ndarray") -> "Tensor":
        """Write ``src`` (broadcast, cast to this dtype) into this tensor's memory. The
        write is a node on the stream, so reads recorded before it see the old values
        and reads recorded after it, through any view, see the new ones."""
        _check_writable("copy_", self)
        if not isinstance(src, Tensor):
            src = _as_tensor_like(src, self, "copy_")
        _same_device("copy_", [self, src])
        _broadcast_to("copy_", src, self.shape)  # check before the cast records anything
        if src.dtype is not self.dtype:
            src = src.to(self.dtype)
        src = _broadcast_to("copy_", src, self.shape)
        node = Node(REGISTRY["assign"], (Operand(src._storage, src._layout),),
                    (Operand(self._storage, self._layout),), {})
        stream_of(self.device).record(node)
        return self

    def fill_(self, value: Scalar) -> "Tensor":
        return self.copy_(value)

    def zero_(self) -> "Tensor":
        return self.copy_(0)

    def _inplace(self, op: str, compute: Callable[[], "Tensor"]) -> "Tensor":
        """``x.add_(y)`` is ``x.copy_(x + y)``, checked as one call: a read-only ``x``
        is refused before anything is recorded, and a result that cannot be written
        back (a promoted dtype that does not cast to x's, such as an int ``x`` times
        0.5; ``y`` broadcasting x bigger) takes back the recorded ``x + y``."""
        _check_writable(op, self)
        with stream_of(self.device).atomic():
            result = compute()
            if result.dtype is not self.dtype:  # promoted: written back if torch's can_cast allows
                check_cast(op, result.dtype, self.dtype)
            if result.shape != self.shape:
                raise ShapeMismatch(op, [self.shape, result.shape],
                                    "the in-place result would change the shape; use the out-of-place op")
            return self.copy_(result)

    def add_(self, other: Any) -> "Tensor":
        return self._inplace("add_", lambda: self + other)

    def sub_(self, other: Any) -> "Tensor":
        return self._inplace("sub_", lambda: self - other)

    def mul_(self, other: Any) -> "Tensor":
        return self._inplace("mul_", lambda: self * other)

    def div_(self, other: Any) -> "Tensor":
        return self._inplace("div_", lambda: self / other)

    def clamp_(self, min: Any = None, max: Any = None) -> "Tensor":
        return self._inplace("clamp_", lambda: self.clamp(min, max))

    def masked_fill_(self, mask: "Tensor", value: Any) -> "Tensor":
        return self._inplace("masked_fill_", lambda: self.masked_fill(mask, value))

    def __iadd__(self, other: Any) -> "Tensor":
        return self.add_(other)

    def __isub__(self, other: Any) -> "Tensor":
        return self.sub_(other)

    def __imul__(self, other: Any) -> "Tensor":
        return self.mul_(other)

    def __itruediv__(self, other: Any) -> "Tensor":
        return self.div_(other)

    # -- element-wise ------------------------------------------------------------------------
    def __neg__(self) -> "Tensor":
        return _unary("neg", self)

    def __pos__(self) -> "Tensor":
        return self

    def __abs__(self) -> "Tensor":
        return _unary("abs", self)

    def __invert__(self) -> "Tensor":
        if self.dtype is not dt.bool_:
            raise Unsupported("__invert__", f"~ is logical not on bool tensors; got {self.dtype.name}")
        return _unary("logical_not", self)

    def __add__(self, o: Any) -> "Tensor":
        return _binary("add", self, o)

    def __radd__(self, o: Any) -> "Tensor":
        return _binary("add", o, self)

    def __sub__(self, o: Any) -> "Tensor":
        return _binary("sub", self, o)

    def __rsub__(self, o: Any) -> "Tensor":
        return _binary("sub", o, self)

    def __mul__(self, o: Any) -> "Tensor":
        return _binary("mul", self, o)

    def __rmul__(self, o: Any) -> "Tensor":
        return _binary("mul", o, self)

    def __truediv__(self, o: Any) -> "Tensor":
        return _binary("div", self, o)

    def __rtruediv__(self, o: Any) -> "Tensor":
        return _binary("div", o, self)

    def __floordiv__(self, o: Any) -> "Tensor":
        return _binary("floor_divide", self, o)

    def __rfloordiv__(self, o: Any) -> "Tensor":
        return _binary("floor_divide", o, self)

    def __mod__(self, o: Any) -> "Tensor":
        return _binary("remainder", self, o)

    def __rmod__(self, o: Any) -> "Tensor":
        return _binary("remainder", o, self)

    def __rpow__(self, o: Any) -> "Tensor":
        return _binary("pow", o, self)

    def __eq__(self, o: Any) -> "Tensor":  # type: ignore[override]
        return _binary("eq", self, o)

    def __ne__(self, o: Any) -> "Tensor":  # type: ignore[override]
        return _binary("ne", self, o)

    def __lt__(self, o: Any) -> "Tensor":
        return _binary("lt", self, o)

    def __le__(self, o: Any) -> "Tensor":
        return _binary("le", self, o)

    def __gt__(self, o: Any) -> "Tensor":
        return _binary("gt", self, o)

    def __ge__(self, o: Any) -> "Tensor":
        return _binary("ge", self, o)

    def __and__(self, o: Any) -> "Tensor":
        return _logical("logical_and", self, o)

    def __rand__(self, o: Any) -> "Tensor":
        return _logical("logical_and", o, self)

    def __or__(self, o: Any) -> "Tensor":
        return _logical("logical_or", self, o)

    def __ror__(self, o: Any) -> "Tensor":
        return _logical("logical_or", o, self)

    def __xor__(self, o: Any) -> "Tensor":
        return _logical("logical_xor", self, o)

    def __rxor__(self, o: Any) -> "Tensor":
        return _logical("logical_xor", o, self)


# -- method forms shared with the function forms ---------------------------------------------
# One list of names; each becomes ``Tensor.name`` and ``braze.name`` (see bottom of file).

def _unary(op: str, x: "Tensor") -> Tensor:
    return _record(op, [_check_tensor(op, x)])


def _check_tensor(op: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise Unsupported(op, f"expected a braze Tensor, got {type(x).__name__}")
    return x


def _check_writable(op: str, x: Tensor) -> None:
    if x._storage.readonly:
        raise Unsupported(op, "this tensor is read-only (it views a read-only buffer such as a memory-mapped "
                              "model file); clone() it first")
    # An expanded (stride-0) view aliases one element at many indices: which write
    # wins would be up to the backend's loop order, so refuse it, as PyTorch does.
    if _b.any(s == 0 and n > 1 for n, s in zip(x.shape, x.stride())):
        raise Unsupported(op, f"cannot write to an expanded tensor (shape {x.shape}, strides {x.stride()}): "
                              "several of its elements share one memory location; clone() it first")


def _same_device(op: str, tensors: Sequence[Tensor]) -> Device:
    dev = tensors[0].device if tensors else CPU
    for t in tensors[1:]:
        if t.device != dev:
            return _mixed_devices(op, tensors)
    return dev


def _moved(t: Tensor, dev: Device) -> Tensor:
    """``t`` copied to device ``dev``, contiguous: a sync point for ``t`` (its stream is
    flushed), as PyTorch's ``.to(device)`` is where the user asks for it. Under Triton's
    interpreter both devices' memory is the host's, from one pool. A block-quantized
    tensor moves as its blocks' bytes, as they are (its kernels dequantize them)."""
    if t.dtype.is_block:
        t.realize()
        st, lay = t._storage, t._layout
        flat = host_view(st.data(), (st.numel,), (1,), 0)  # its bytes (from the device: copied back)
        src = block_bytes(flat, t.dtype, lay.shape, lay.strides, lay.offset)
    else:
        src = t.numpy()  # realised (a copy already, when it comes from a device)
    buf = memory.allocate(src.dtype, src.size, "to")
    buf.reshape(src.shape)[...] = src
    return Tensor(Storage(t.dtype, dev, src.size, placed(dev, buf, "to")), _contiguous(t.shape))


def _mixed_devices(op: str, tensors: Sequence[Tensor]) -> Device:
    """The device of operands on several: a scalar braze made into a constant (``x * 2``)
    lives on the CPU and goes with a tensor on any device, as PyTorch's CPU scalars do
    (it is realised and never written, so no stream orders it); anything else mixed is
    a ``DeviceMismatch``."""
    devices = {t.device for t in tensors if not is_constant(t._storage)}
    if len(devices) == 1:
        return devices.pop()
    raise DeviceMismatch(op, [x.device for x in tensors])


def _atomic(fn: Any) -> Any:
    """For composite ops that record several nodes (a cast, then the reduction; a
    maximum, then a minimum): when a later step's check raises, the earlier nodes are
    taken back, so the error leaves nothing half-recorded on the stream."""
    @functools.wraps(fn)
    def wrapper(input: Any, *args: Any, **kwargs: Any) -> Any:
        dev = input.device if isinstance(input, Tensor) else CPU
        with stream_of(dev).atomic():
            return fn(input, *args, **kwargs)
    return wrapper


def _record(op: str, inputs: Sequence[Tensor], **attrs: Any) -> Any:
    """Check ``inputs`` with the op's rules, then append one node; returns the output
    tensor (or a tuple for multi-output ops). Nothing is recorded if a rule raises."""
    return _record_on(_same_device(op, inputs), op, inputs, attrs)


def _record_on(device: Device, op: str, inputs: Sequence[Tensor], attrs: dict[str, Any]) -> Any:
    """``_record`` on ``device`` (a creation op's: it has no input to take it from)."""
    opdef = REGISTRY[op]
    shapes = opdef.shape(op, [t._layout.shape for t in inputs], attrs)
    dtypes = opdef.dtype(op, [t._storage.dtype for t in inputs], attrs)
    memory.check(_b.sum(prod(s) * d.itemsize for s, d in zip(shapes, dtypes)), op)
    outs = [Tensor(Storage(d, device, prod(s)), _contiguous(s)) for s, d in zip(shapes, dtypes)]
    node = Node(opdef, tuple([Operand(t._storage, t._layout) for t in inputs]),
                tuple([Operand(t._storage, t._layout) for t in outs]), attrs)
    stream_of(device).record(node)
    return outs[0] if len(outs) == 1 else tuple(outs)


_CONTIGUOUS: dict[Shape, Layout] = {}


def _memo_layout(table: dict[Shape, Layout], shape: Shape, make: Callable[[Shape], Layout]) -> Layout:
    """``table[shape]``, made once by ``make(shape)``: the same shapes recur on every
    step of a loop, and layouts are immutable values. The table is bounded."""
    lay = table.get(shape)
    if lay is None:
        if len(table) > 4096:
            table.clear()
        lay = table[shape] = make(shape)
    return lay


def _contiguous(shape: Shape) -> Layout:
    """``Layout.contiguous`` for an op's output, memoised."""
    return _memo_layout(_CONTIGUOUS, shape, Layout.contiguous)


_CONSTS: dict[tuple[Any, ...], Storage] = {}


def is_constant(st: Storage) -> bool:
    """Is ``st`` one of braze's scalar constants (``_constant``): realised when made,
    never written, never given another array?"""
    return st.owner is _CONSTS


def _constant(value: Scalar, dtype: DType) -> Tensor:
    """A 0-d realised tensor holding ``value``; shared per (dtype, value) because
    scalars recur in every step of a loop. Internal: never handed to the user to write."""
    # The key keeps what == would merge apart: 0.0 from -0.0 (by sign), True from 1,
    # and every NaN together. Looking it up costs no numpy call on the recording path.
    if isinstance(value, float):
        key: tuple[Any, ...] = (dtype.name, "nan") if value != value else (dtype.name, value, math.copysign(1.0, value))
    else:
        key = (dtype.name, type(value), value)
    st = _CONSTS.get(key)
    if st is None:
        if len(_CONSTS) > 4096:
            _CONSTS.clear()
        arr = np.asarray(value).astype(dtype.np).reshape(1)
        st = _CONSTS[key] = Storage(dtype, CPU, 1, arr, readonly=True, owner=_CONSTS)
    return Tensor(st, _SCALAR_LAYOUT)


_SCALAR_LAYOUT = Layout((), ())
_SCALAR_EXPANDED: dict[Shape, Layout] = {}


def _broadcast_scalar(shape: Shape) -> Layout:
    """A 0-d tensor's layout expanded to ``shape`` (every stride 0), memoised."""
    return _memo_layout(_SCALAR_EXPANDED, shape, _SCALAR_LAYOUT.expand)


def _scalar_value(op: str, value: Any, dtype: DType) -> Scalar:
    """``value`` as a tensor of ``dtype`` holds it (a half value rounded, beyond its range
    inf), as a Python scalar: an attribute, read from a constant, not a data read."""
    with np.errstate(over="ignore"):
        return _scalar_to(op, value, dtype)._storage.data()[0].item()


def _scalar_to(op: str, value: Any, dtype: DType) -> Tensor:
    """A Python scalar as a constant of ``dtype`` (an op's promoted dtype, or the tensor
    an in-place write goes to), if it fits exactly."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, (bool, int, float)):
        raise Unsupported(op, f"cannot combine a tensor with {type(value).__name__}")
    if dtype.is_integer or dtype is dt.bool_:
        if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
            raise DtypeMismatch(op, [dtype, "float scalar"],
                                f"the scalar {value!r} does not fit {dtype.name}; cast the tensor with .to(dtype)")
        ivalue = int(value)
        info = np.iinfo(dtype.np) if dtype.is_integer else None
        if info is not None and not info.min <= ivalue <= info.max:
            raise DtypeMismatch(op, [dtype, "int scalar"], f"the scalar {value!r} is out of range for {dtype.name}")
        if dtype is dt.bool_ and ivalue not in (0, 1):
            raise DtypeMismatch(op, [dtype, "int scalar"], f"the scalar {value!r} is not a bool")
        return _constant(ivalue, dtype)
    return _constant(value, dtype)


def from_numpy(array: np.ndarray) -> Tensor:
    """Wrap a numpy array without copying (non-negative strides); the tensor and the
    array share memory, as in PyTorch. A read-only array gives a read-only tensor."""
    if not isinstance(array, np.ndarray):
        raise Unsupported("from_numpy", f"expected a numpy array, got {type(array).__name__}")
    d = dt.from_numpy_dtype(array.dtype)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    item = array.itemsize
    if array.ndim and (_b.any(s < 0 or s % item for s in array.strides)):
        array = np.ascontiguousarray(array)
    readonly = not array.flags.writeable
    if array.size == 0:
        flat = np.empty(0, dtype=array.dtype)
        return Tensor(Storage(d, CPU, 0, flat, readonly=readonly, owner=array), Layout.contiguous(array.shape))
    strides = tuple(s // item for s in array.strides)
    extent = 1 + _b.sum((n - 1) * s for n, s in zip(array.shape, strides))
    flat = np.lib.stride_tricks.as_strided(array, (extent,), (item,), writeable=not readonly)
    return Tensor(Storage(d, CPU, extent, flat, readonly=readonly, owner=array), Layout(array.shape, strides, 0))


def _as_tensor_like(value: Any, like: Tensor, op: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        return from_numpy(value)
    return _scalar_to(op, value, like.dtype)


def _broadcast_to(op: str, t: Tensor, shape: Shape) -> Tensor:
    if t.shape == shape:
        return t
    broadcast_shapes(op, t.shape, shape)
    if len(t.shape) > len(shape) or broadcast_shapes(op, t.shape, shape) != shape:
        raise ShapeMismatch(op, [t.shape, shape], "cannot broadcast to the target shape")
    return t._view(t._layout.expand(shape))


def _operands(op: str, *xs: Any, keep: _int = 0) -> list[Tensor]:
    """Tensors, arrays and scalars of an element-wise op, promoted to their result type
    (``promotion.py``; the first ``keep`` operands aside, such as ``where``'s condition)
    and broadcast to one shape. Every check runs before a promoting cast is recorded."""
    if not _b.any(isinstance(x, Tensor) for x in xs):
        raise Unsupported(op, "needs at least one tensor operand")
    vals = [from_numpy(x) if isinstance(x, np.ndarray) else x.item() if isinstance(x, np.generic) else x
            for x in xs[keep:]]
    d = result_type(op, [(x._storage.dtype, DIM if x._layout.shape else ZERO_DIM) if isinstance(x, Tensor)
                         else (scalar_dtype(op, x), SCALAR) for x in vals])
    ts = list(xs[:keep]) + [x if isinstance(x, Tensor) else _scalar_to(op, x, d) for x in vals]
    shape = broadcast_shapes(op, *(t.shape for t in ts))  # checks every operand once
    if _b.any(t._storage.dtype is not d for t in ts[keep:]):
        _same_device(op, ts)
        ts[keep:] = [t.to(d) for t in ts[keep:]]  # cast before expanding: fewer elements
    return [t if t.shape == shape else t._view(t._layout.expand(shape)) for t in ts]


#: Kinds of tensor whose dtype a Python int never changes (the scalar is of a category
#: no higher), so ``_binary`` skips promotion for them.
_INT_KEEPS = frozenset(("float", "int", "uint"))


def _binary(op: str, a: Any, b: Any) -> Tensor:
    # ``_operands`` without its lists and promotion for the common cases, on every x * y
    # and x * 2.0: one dtype, or a scalar that keeps the tensor's
    if type(a) is Tensor and type(b) is Tensor and a._storage.dtype is b._storage.dtype:
        sa, sb = a._layout.shape, b._layout.shape
        if sa != sb:
            shape = broadcast_shapes(op, sa, sb)
            if sa != shape:
                a = a._view(a._layout.expand(shape))
            if sb != shape:
                b = b._view(b._layout.expand(shape))
        ts = [a, b]
    elif type(a) is Tensor and type(b) is float and a._storage.dtype.is_floating_point:
        ts = [a, Tensor(_constant(b, a._storage.dtype)._storage, _broadcast_scalar(a._layout.shape))]
    elif type(b) is Tensor and type(a) is float and b._storage.dtype.is_floating_point:
        ts = [Tensor(_constant(a, b._storage.dtype)._storage, _broadcast_scalar(b._layout.shape)), b]
    elif type(a) is Tensor and type(b) is int and a._storage.dtype.kind in _INT_KEEPS:  # x * 2, i + 1
        ts = [a, Tensor(_scalar_to(op, b, a._storage.dtype)._storage, _broadcast_scalar(a._layout.shape))]
    elif type(b) is Tensor and type(a) is int and b._storage.dtype.kind in _INT_KEEPS:
        ts = [Tensor(_scalar_to(op, a, b._storage.dtype)._storage, _broadcast_scalar(b._layout.shape)), b]
    else:
        if op == "sub" and _b.any(isinstance(x, Tensor) and x.dtype is dt.bool_ for x in (a, b)):
            raise DtypeMismatch(op, [x.dtype if isinstance(x, Tensor) else type(x).__name__ for x in (a, b)],
                                "subtraction with a bool tensor (PyTorch refuses it too); invert a mask with ~")
        ts = _operands(op, a, b)
    if ts[0].dtype is dt.bool_ and op in ("add", "sub", "mul", "div", "floor_divide", "remainder", "pow"):
        raise DtypeMismatch(op, [dt.bool_, dt.bool_], "arithmetic on bool tensors: cast to an integer dtype first")
    return _record(op, ts)


def _logical(op: str, a: Any, b: Any) -> Tensor:
    """``&``, ``|``, ``^``: logical on bool tensors. On numbers PyTorch means bitwise,
    which braze does not have, so it refuses instead of silently answering logically."""
    for x in (a, b):
        if isinstance(x, Tensor) and x.dtype is not dt.bool_:
            raise Unsupported(op, f"&, | and ^ are logical ops on bool tensors; got {x.dtype.name} "
                                  f"(use logical_and/or/xor, or compare first)")
    return _binary(op, a, b)


def _block_attrs(op: str, w: Tensor) -> dict[str, Any]:
    """The attributes of an op over a weight kept in its file's type (its GGML type
    and row width), after checking that a block tensor's view keeps whole blocks."""
    check_block_rows(op, w.dtype, w._layout)
    return {"qtype": weight_type(op, w.dtype).name}


def dequantize(input: Tensor) -> Tensor:
    """A block-quantized tensor's values as float32."""
    return _record("dequantize", [input], k=input.shape[-1] if input.ndim else 0,
                   **_block_attrs("dequantize", input))


__all__ = ["Tensor", "ValuesIndices"]
