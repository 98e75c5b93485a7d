"""braze's benchmarks: ``python -m bench.fusion`` (see bench/RESULTS.md)."""
