"""The idiom corpus: everyday inference code as users write it, each snippet checked
against numpy and against the number of kernels it should take (see corpus.py)."""
