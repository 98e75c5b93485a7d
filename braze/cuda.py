"""``braze.cuda``: whether the cuda device runs here, in PyTorch's spelling.

``is_available()`` is True on a machine where ``device="cuda"`` works: one with an
NVIDIA GPU (and the ``gpu`` extra: Triton, cuda.core, cuda.bindings), or anywhere under
Triton's interpreter (``BRAZE_CUDA_INTERPRET=1``, or ``TRITON_INTERPRET=1`` without a
GPU), where host memory stands in for device memory; ``unavailable_reason()`` says why
not elsewhere.
"""

from __future__ import annotations

from .runtime.cuda_probe import interpreting as _interpreting
from .runtime import cuda_memory
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
    """Run everything recorded on the cuda device and wait for the GPU to finish it."""
    stream("cuda:0").flush()
    cuda_memory.synchronize()


def empty_cache() -> None:
    """Give the pool's free device memory back to the driver (as ``torch.cuda.empty_cache``)."""
    cuda_memory.pool_clear()


__all__ = ["is_available", "unavailable_reason", "device_count", "interpreting", "synchronize", "empty_cache"]
