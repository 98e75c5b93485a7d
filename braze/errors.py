"""Typed errors: one class per kind of mistake, each naming the op and its operands.

Every error is raised at the call that made the mistake (shape, dtype and device
rules run when an op is recorded, not when the stream is flushed), so the traceback
points at the user's line. Where Python users expect a builtin type, the error also
subclasses it (a bad dim is an ``IndexError``, a dtype clash a ``TypeError``), so
``except ValueError`` code written for numpy or PyTorch keeps working.
"""

from __future__ import annotations

from typing import Any, Sequence


def _fmt(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


class BrazeError(Exception):
    """Base of every error braze raises on purpose. ``op`` names the operation."""

    def __init__(self, message: str, *, op: str | None = None) -> None:
        self.op = op
        super().__init__(f"{op}: {message}" if op else message)


class ShapeMismatch(BrazeError, ValueError):
    """Operands' shapes do not fit the op (broadcasting, matmul, cat, reshape...)."""

    def __init__(self, op: str, shapes: Sequence[tuple[int, ...]], detail: str = "") -> None:
        self.shapes = [tuple(s) for s in shapes]
        msg = f"shapes {_fmt(self.shapes)} do not fit"
        super().__init__(f"{msg}: {detail}" if detail else msg, op=op)


class RankMismatch(BrazeError, ValueError):
    """A tensor has the wrong number of dimensions for the op."""

    def __init__(self, op: str, expected: int | str, shape: tuple[int, ...]) -> None:
        self.expected = expected
        self.shape = tuple(shape)
        super().__init__(
            f"expected rank {expected}, got rank {len(self.shape)} (shape {self.shape})", op=op
        )


class DimOutOfRange(BrazeError, IndexError):
    """A dimension (or index along one) is outside the tensor's range."""

    def __init__(self, op: str, dim: int, ndim: int, detail: str = "") -> None:
        self.dim = dim
        self.ndim = ndim
        lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
        msg = f"dimension {dim} out of range [{lo}, {hi}] for a tensor of rank {ndim}"
        super().__init__(f"{msg}: {detail}" if detail else msg, op=op)


class IndexOutOfRange(BrazeError, IndexError):
    """An index value is outside the size of the dimension it indexes."""

    def __init__(self, op: str, index: int, size: int, dim: int) -> None:
        self.index, self.size, self.dim = index, size, dim
        super().__init__(f"index {index} out of range for dimension {dim} of size {size}", op=op)


class DtypeMismatch(BrazeError, TypeError):
    """A dtype is not accepted by the op, operands' dtypes have no common type (a block
    dtype), or an in-place result cannot be cast back (PyTorch's ``can_cast``)."""

    def __init__(self, op: str, dtypes: Sequence[Any], detail: str = "") -> None:
        self.dtypes = list(dtypes)
        msg = f"dtypes {_fmt(self.dtypes)} do not fit"
        super().__init__(f"{msg}: {detail}" if detail else msg, op=op)


class DeviceMismatch(BrazeError, RuntimeError):
    """Operands live on different devices."""

    def __init__(self, op: str, devices: Sequence[Any]) -> None:
        self.devices = list(devices)
        super().__init__(f"operands are on different devices: {_fmt(self.devices)}", op=op)


class DeviceUnavailable(BrazeError, RuntimeError):
    """The requested device does not exist here, or its backend is not built yet."""

    def __init__(self, device: str, reason: str, op: str | None = None) -> None:
        self.device = device
        super().__init__(f"device {device!r} is unavailable: {reason}", op=op)


class OutOfMemory(BrazeError, MemoryError):
    """An allocation did not fit the memory budget or the machine."""

    def __init__(self, requested: int, available: int, device: str = "cpu", op: str | None = None) -> None:
        self.requested, self.available, self.device = requested, available, device
        super().__init__(
            f"out of memory on {device}: requested {requested} bytes, {available} bytes available",
            op=op,
        )


class Unsupported(BrazeError, NotImplementedError):
    """The op exists but not for these arguments (a dtype, a mode, a kind of index)."""

    def __init__(self, op: str, what: str) -> None:
        self.what = what
        super().__init__(what, op=op)


_NO_VALUE: Any = object()


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: a hostile file's value can be megabytes."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class FormatError(BrazeError, ValueError):
    """A model file is malformed: names the file, the field, the byte offset (a
    parser's errors) or the offending ``value`` (a metadata check's), and why."""

    def __init__(self, file: str, field: str, offset: int | None, detail: str, *,
                 value: Any = _NO_VALUE) -> None:
        self.file, self.field, self.offset = str(file), field, offset
        self.value = None if value is _NO_VALUE else value
        where = f" at offset {offset}" if offset is not None else ""
        shown = f" = {short_repr(value)}" if value is not _NO_VALUE else ""
        super().__init__(f"{self.file}: field {field!r}{where}{shown}: {detail}")


class TemplateError(BrazeError, ValueError):
    """A chat template failed to parse or render, called ``raise_exception``, tried
    to escape the sandbox, or went past its time or size budget. The template comes
    from a model file, so this is a data error about that file, never a reason to
    trust it more."""

    def __init__(self, message: str) -> None:
        super().__init__(message, op="render_chat")


class InvalidArgument(BrazeError, ValueError, TypeError):
    """An API argument of the wrong type or out of range (a negative memory limit).
    Both a ``ValueError`` and a ``TypeError``, so either ``except`` catches it."""

    def __init__(self, op: str, what: str) -> None:
        super().__init__(what, op=op)


class CompileError(BrazeError, RuntimeError):
    """The C compiler (or another backend compiler) failed or is missing."""


class StateDictMismatch(BrazeError, KeyError):
    """``load_state_dict`` found missing or unexpected keys, or wrong shapes or dtypes.

    Lists every problem at once, each with its key, so one run shows all that is wrong.
    """

    def __init__(self, missing: Sequence[str], unexpected: Sequence[str], mismatched: Sequence[str]) -> None:
        self.missing, self.unexpected, self.mismatched = list(missing), list(unexpected), list(mismatched)
        parts = []
        if self.missing:
            parts.append(f"missing keys: {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys: {', '.join(self.unexpected)}")
        parts.extend(self.mismatched)
        super().__init__("; ".join(parts), op="load_state_dict")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class MissingWeight(BrazeError, KeyError):
    """A model asked its weight file for a tensor the file does not have."""

    def __init__(self, file: str, name: str, near: Sequence[str] = ()) -> None:
        self.file, self.name = str(file), name
        hint = f" (similar names: {', '.join(near)})" if near else ""
        super().__init__(f"{self.file}: no tensor named {name!r}{hint}")

    def __str__(self) -> str:
        return str(self.args[0])
