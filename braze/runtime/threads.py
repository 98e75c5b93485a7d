"""How many threads braze's CPU kernels use.

Generated kernels take the thread count as an argument (an OpenMP ``num_threads(n)``
clause), so this module is the only state: no ``omp_set_num_threads`` and no global
OpenMP settings beyond the wait policy (see ``cpu.py``).

The default is ``BRAZE_NUM_THREADS`` when set, else the number of *physical* cores
this process may run on. ``os.cpu_count()`` counts hyperthreads, and two threads on
one core's siblings fight over the same vector units, so braze counts distinct
(package, core) pairs in ``/sys/devices/system/cpu/cpu*/topology`` over the CPUs in
the affinity mask, and falls back to the size of the affinity mask.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_num_threads: int | None = None


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def physical_cores() -> int:
    """Distinct physical cores among the CPUs this process may run on (at least 1)."""
    cpus = _allowed_cpus()
    cores: set[tuple[str, str]] = set()
    try:
        for cpu in cpus:
            topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
            with open(f"{topo}/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{topo}/core_id") as f:
                core = f.read().strip()
            cores.add((package, core))
    except OSError:
        return max(1, len(cpus))
    return max(1, len(cores)) if cores else max(1, len(cpus))


def _from_env() -> int | None:
    raw = os.environ.get("BRAZE_NUM_THREADS", "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"BRAZE_NUM_THREADS must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"BRAZE_NUM_THREADS must be a positive integer, got {raw!r}")
    return n


def default_num_threads() -> int:
    """``BRAZE_NUM_THREADS`` if set, else the number of physical cores."""
    n = _from_env()
    return n if n is not None else physical_cores()


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in every CPU kernel launched from now on."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    global _num_threads
    with _lock:
        _num_threads = n


def get_num_threads() -> int:
    """The thread count CPU kernels are launched with."""
    global _num_threads
    n = _num_threads
    if n is None:
        with _lock:
            if _num_threads is None:
                _num_threads = default_num_threads()
            n = _num_threads
    return n
