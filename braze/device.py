"""Device names: "cpu", and "cuda[:N]" where ``runtime/cuda_probe.py`` says it can run
(under Triton's interpreter without a GPU); elsewhere "cuda" is refused with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import DeviceUnavailable, Unsupported
from .runtime.cuda_probe import unavailable


@dataclass(frozen=True)
class Device:
    type: str
    index: int = 0

    def __hash__(self) -> int:
        # hashed on every jit call (its key) and stream lookup: a str keeps its hash,
        # a tuple of the fields (the dataclass's own) is built and hashed anew each time
        return hash(self.type) + self.index

    def __str__(self) -> str:
        return self.type if self.type == "cpu" else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device('{self}')"


CPU = Device("cpu")


def as_device(x: Any, op: str = "device") -> Device:
    """Parse "cpu", "cuda", "cuda:1" or a Device; raise for devices that cannot run."""
    if x is None:
        return CPU
    if isinstance(x, Device):
        dev = x
    elif isinstance(x, str):
        kind, _, idx = x.partition(":")
        if kind not in ("cpu", "cuda") or (idx and not idx.isdigit()):
            raise Unsupported(op, f"unknown device {x!r} (known: 'cpu', 'cuda[:N]')")
        dev = Device(kind, int(idx) if idx else 0)
    else:
        raise Unsupported(op, f"unknown device {x!r}")
    if dev.type == "cuda":
        why = unavailable()
        if why is not None:
            raise DeviceUnavailable(str(dev), why, op=op)
        if dev.index != 0:
            raise DeviceUnavailable(str(dev), "one cuda device (cuda:0) is all braze runs yet", op=op)
    return dev
