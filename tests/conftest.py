"""Shared fixtures: the real models, loaded once per test process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def smollm() -> Any:
    from braze.models import ModelNotFound, load_llm
    try:
        return load_llm()
    except ModelNotFound as e:
        pytest.fail(f"the default model must be installed for the tests (make install): {e}")


@pytest.fixture(scope="session")
def minilm() -> Any:
    from braze.models import ModelNotFound, load_embedder
    try:
        return load_embedder()
    except ModelNotFound as e:
        pytest.fail(f"the default embedder must be installed for the tests (make install): {e}")


@pytest.fixture(scope="session")
def smollm_reference() -> dict[str, Any]:
    return json.loads((DATA / "smollm2_reference.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def minilm_reference() -> dict[str, Any]:
    return json.loads((DATA / "minilm_reference.json").read_text())  # type: ignore[no-any-return]
