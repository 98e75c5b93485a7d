"""Whether ``device="cuda"`` can run here, and how: on a GPU, or under Triton's interpreter.

Two modes. With a GPU (``cuda.core`` finds one) the cuda device's storage is device
memory (``cuda_memory.py``) and its kernels are compiled by Triton for the GPU. Under
the interpreter (``BRAZE_CUDA_INTERPRET=1``, or ``TRITON_INTERPRET=1``
on a machine without a GPU) the cuda device's storage is host memory standing in for
device memory and its kernels, rendered as Triton, run through Triton's interpreter on
the CPU: slow, but the same generated code, which is how ``make test`` covers the
backend without a GPU. Said once on stderr.

Nothing here imports triton or cuda.core at braze's import: only when a cuda device is
first asked for.
"""

from __future__ import annotations

import importlib
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


_count: int | None = None


def gpu_count() -> int:
    """GPUs that ``cuda.core`` sees (0 without the package, a driver or a GPU); asked
    once per process. cuda.core moved its API out of ``experimental`` in 0.4: both
    spellings are tried."""
    global _count
    if _count is None:
        _count = 0
        if importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.core") is not None:
            for name in ("cuda.core", "cuda.core.experimental"):
                try:
                    module = importlib.import_module(name)
                    system = module.system
                    n = system.get_num_devices() if hasattr(system, "get_num_devices") else system.num_devices
                    _count = int(n)
                    break
                except Exception:  # no driver library, no GPU, an older spelling: the next one, else 0
                    continue
    return _count


_triton: bool | None = None


def have_triton() -> bool:
    """Is Triton installed? (Looked up once: a flush asks, and a lookup costs ~1 ms.)"""
    global _triton
    if _triton is None:
        _triton = importlib.util.find_spec("triton") is not None
    return _triton


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
        elif importlib.util.find_spec("cuda.bindings") is None:
            _reason = "cuda.bindings is not installed (pip install 'braze[gpu]')"
    return _reason
