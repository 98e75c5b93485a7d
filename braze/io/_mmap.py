"""Read-only file mapping shared by the model-file readers.

Tensors are handed out as numpy views of one ``uint8`` array over the mapping, so
they cost no copy and no read until touched.  ``close()`` releases the mapping only
when no view is alive; otherwise the views keep it alive (no dangling pointers).
"""

from __future__ import annotations

import mmap
import os
from types import TracebackType
from typing import TypeVar

import numpy as np

R = TypeVar("R", bound="MappedReader")


class MappedFile:
    """A read-only mmap of a whole file, with a uint8 numpy view over it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            # mmap refuses empty files; an empty buffer reads the same (and fails as truncated).
            self._mm: mmap.mmap | None = (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 0 else None
            )
        self.size = size
        self.buf: mmap.mmap | bytes = self._mm if self._mm is not None else b""
        self.data: np.ndarray | None = np.frombuffer(self.buf, dtype=np.uint8)

    def close(self) -> None:
        """Drop our references; unmap now unless a handed-out view still uses the memory."""
        self.data = None
        self.buf = b""
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # live tensor views: the mapping goes away with the last of them
            self._mm = None


class MappedReader:
    """What the GGUF and safetensors readers share: an open ``MappedFile`` in
    ``self._file``, closed by ``close()`` or by leaving a ``with`` block."""

    _file: MappedFile | None

    def close(self) -> None:
        """Release the mapping (deferred while returned tensor views are still alive)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
