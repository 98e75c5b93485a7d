"""Executors and memory: the reference executor now, compiled backends later."""
