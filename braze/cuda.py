"""``braze.cuda``: whether the cuda device runs here, in PyTorch's spelling.

``is_available()`` is True on a machine where ``device="cuda"`` works: today only under
Triton's interpreter (``BRAZE_CUDA_INTERPRET=1``, or ``TRITON_INTERPRET=1`` without a
GPU), where host memory stands in for device memory; ``unavailable_reason()`` says why
not elsewhere (a GPU alone is not enough yet: braze's device-memory runtime is not built).
"""

from __future__ import annotations

from .runtime.cuda_probe import interpreting as _interpreting
from .runtime.cuda_probe import unavailable
from .stream import stream


def is_available() -> bool:
    return unavailable() is None


def unavailable_reason() -> str | None:
    return unavailable()


def device_count() -> int:
    """Devices braze can run as cuda (one at most, yet)."""
    return 1 if is_available() else 0


def interpreting() -> bool:
    """Does the cuda device run on the CPU under Triton's interpreter?"""
    return is_available() and _interpreting()


def synchronize() -> None:
    """Run everything recorded on the cuda device."""
    stream("cuda:0").flush()


__all__ = ["is_available", "unavailable_reason", "device_count", "interpreting", "synchronize"]
