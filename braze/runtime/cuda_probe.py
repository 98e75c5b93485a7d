"""Whether ``device="cuda"`` can run here, and how: on a GPU, or under Triton's interpreter.

Two modes. With a GPU (``cuda.core`` finds one) braze would keep storage in device
memory; that runtime is not built yet, so such a machine is refused with a reason that
says so. Under the interpreter (``BRAZE_CUDA_INTERPRET=1``, or ``TRITON_INTERPRET=1``
on a machine without a GPU) the cuda device's storage is host memory standing in for
device memory and its kernels, rendered as Triton, run through Triton's interpreter on
the CPU: slow, but the same generated code, which is how ``make test`` covers the
backend without a GPU. Said once on stderr.

Nothing here imports triton or cuda.core at braze's import: only when a cuda device is
first asked for.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_said = False
_reason: str | None = None
_checked = False


def _env(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


#: TRITON_INTERPRET as the user set it (braze sets it itself once it interprets, which must
#: not make a later "is there a cuda device?" answer yes when BRAZE_CUDA_INTERPRET is off)
_USER_TRITON_INTERPRET = _env("TRITON_INTERPRET")


def gpu_count() -> int:
    """GPUs that ``cuda.core`` sees (0 without the package, a driver or a GPU)."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.core") is None:
        return 0
    try:
        from cuda.core import system
        return int(system.get_num_devices())
    except Exception:  # no driver library, no GPU: the package says so with its own errors
        return 0


def have_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Is the cuda device the host under Triton's interpreter?"""
    return _env("BRAZE_CUDA_INTERPRET") or (_USER_TRITON_INTERPRET and gpu_count() == 0)


def unavailable() -> str | None:
    """Why ``device="cuda"`` cannot run here, or None when it can. Checked once per
    process (the answer does not change while it runs) except the environment
    switch, which tests flip."""
    global _checked, _reason, _said
    if not have_triton():
        return "Triton is not installed (pip install 'braze[gpu]')"
    if interpreting():
        # The interpreter is chosen when a kernel is decorated: set before triton is imported.
        os.environ["TRITON_INTERPRET"] = "1"
        if not _said:
            _said = True
            print("braze: device 'cuda' runs under Triton's interpreter on the CPU (host memory stands in "
                  "for device memory; no GPU is used)", file=sys.stderr)
        return None
    if not _checked:
        _checked = True
        if gpu_count() == 0:
            _reason = ("no GPU found (cuda.core sees none); BRAZE_CUDA_INTERPRET=1 runs the cuda device under "
                       "Triton's interpreter on the CPU")
        else:
            _reason = ("braze's device-memory runtime (storage through cuda.core) is not built yet; "
                       "BRAZE_CUDA_INTERPRET=1 runs the cuda device under Triton's interpreter on the CPU")
    return _reason
