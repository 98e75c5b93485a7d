"""Grouping recorded nodes into kernels: see ``fuse.py``."""

from .fuse import ExternStep, KernelStep, Schedule, schedule

__all__ = ["ExternStep", "KernelStep", "Schedule", "schedule"]
