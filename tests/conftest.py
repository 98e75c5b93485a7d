"""Shared fixtures: the real models, loaded once per test process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

DATA = Path(__file__).parent / "data"

# The property tests draw new shapes all the time; a user's program repeats. Let each
# program be compiled for a few shapes (instead of braze's default 2) so that the fused
# run of the suite exercises compiled kernels on many shapes, at a bounded compile cost.
os.environ.setdefault("BRAZE_SHAPE_VARIANTS", "6")
# A test worker lives through ~1,400 tests, each with programs of its own (the idiom
# corpus alone is hundreds): past braze's default cap of 512 programs a process, later
# tests would run on the reference executor and their fused checks would fail.
os.environ.setdefault("BRAZE_PLAN_CAP", "100000")

# In CI, hypothesis draws the same examples every run (a submission's verdict must not
# depend on luck); on developers' machines it explores new ones each run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# Directories whose autouse fixtures set BRAZE_FUSION=1 (tests/serve's `fused`: the HTTP
# layer, the Ray cluster's CLUSTER_ENV; tests/gpu's `interpret`, each test computing its
# reference with BRAZE_FUSION=0 itself): in the suite's reference pass they would repeat
# the fused pass's runs exactly, so that pass skips them.
SAME_IN_BOTH_PASSES = ("serve", "gpu")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    from braze.stream import fusion_enabled
    if fusion_enabled():
        return
    same = pytest.mark.skip(reason="the same run as in the fused pass: this directory's fixtures fuse in both")
    dirs = [Path(__file__).parent / d for d in SAME_IN_BOTH_PASSES]
    for item in items:
        if any(d in Path(str(item.fspath)).parents for d in dirs):
            item.add_marker(same)


def _load(loader: Any, what: str) -> Any:
    from braze.models import ModelNotFound
    try:
        return loader()
    except ModelNotFound as e:
        pytest.fail(f"the default {what} must be installed for the tests (make install): {e}")


@pytest.fixture(scope="session")
def smollm() -> Any:
    from braze.models import load_llm
    return _load(load_llm, "model")


@pytest.fixture(scope="session")
def minilm() -> Any:
    from braze.models import load_embedder
    return _load(load_embedder, "embedder")


@pytest.fixture(scope="session")
def smollm_reference() -> dict[str, Any]:
    return json.loads((DATA / "smollm2_reference.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def minilm_reference() -> dict[str, Any]:
    return json.loads((DATA / "minilm_reference.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def new_processes(tmp_path: Any) -> Any:
    """``run(code)``: ``code`` in two fresh Python processes, one after the other,
    sharing one fresh braze cache directory, fused; their standard outputs."""
    import subprocess
    import sys

    def run(code: str) -> list[str]:
        env = dict(os.environ, BRAZE_CACHE_DIR=str(tmp_path / "cache"), BRAZE_FUSION="1")
        return [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                               check=True).stdout for _ in range(2)]
    return run


@pytest.fixture
def plan_builds(monkeypatch: Any) -> list[bool]:
    """Every plan the fused executor builds from now on (the plans forgotten first):
    for each, whether building it compiled new kernels."""
    import braze.plan as plan

    plan.clear()
    built: list[bool] = []
    orig = plan._build

    def spy(*args: Any, **kw: Any) -> Any:
        p = orig(*args, **kw)
        built.append(p is not None and p.compiled)
        return p

    monkeypatch.setattr(plan, "_build", spy)
    return built
