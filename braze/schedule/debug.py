"""Why a fusion did not happen, said on stderr under ``BRAZE_DEBUG=1``: shared by the
scheduler's modules (``fuse.py``, ``own_steps.py``) and the cuda executor."""

from __future__ import annotations

import os
import sys
from typing import Any


def _debug() -> int:
    try:
        return int(os.environ.get("BRAZE_DEBUG", "0"))
    except ValueError:
        return 0


def refuse(node: Any, reason: str) -> None:
    """Say why a fusion did not happen (``BRAZE_DEBUG=1``)."""
    if _debug() >= 1:
        print(f"braze: not fused: {node.op.name}: {reason}", file=sys.stderr)
