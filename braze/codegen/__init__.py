"""Renderers from the loop IR to source code: ``c.py`` (C + OpenMP) and ``cmath.h``."""
