"""The fuzz mutators, a few hundred cases in the suite: every case must work or fail
with a typed error; never an untyped exception, a hang or an allocation past the file.
``make fuzz`` runs the same targets for thousands of cases (``campaign.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from . import corpus as C
from . import mutators as M
from . import targets as T

FAST = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


def _check(result: tuple[str, str]) -> None:
    outcome, detail = result
    assert outcome in ("ok", "typed"), f"{outcome}: {detail}"


@FAST
@given(M.gguf_bytes())
def test_gguf_structure(data: bytes) -> None:
    _check(T.run_gguf_bytes(data))


@pytest.fixture(scope="module")
def compiled_once() -> None:
    """The base model run once first, so that the fused executor's first compile (many
    seconds on a busy machine) is not timed as a hang."""
    assert T.run_gguf_metadata(list(C.llama_entries()))[0] in ("ok", "hang")


@settings(FAST, max_examples=40)
@given(M.gguf_metadata())
def test_gguf_metadata_values(compiled_once: None, entries: Any) -> None:
    _check(T.run_gguf_metadata(entries))


@FAST
@given(M.safetensors_bytes())
def test_safetensors_headers(data: bytes) -> None:
    _check(T.run_safetensors(data))


@settings(FAST, max_examples=25)
@given(M.embedder_edits())
def test_embedder_directories(edits: Any) -> None:
    _check(T.run_embedder(edits))


@settings(FAST, max_examples=30)
@given(M.cli_case())
def test_cli_arguments(case: Any) -> None:
    _check(T.run_cli(*case))


@settings(FAST, max_examples=40)
@given(M.template_case())
def test_chat_templates(template: str) -> None:
    _check(T.run_template(template))


@pytest.mark.parametrize("argv", [["generate", "x", "--temperature", "nan"], ["generate", "x", "--repeat-penalty", "0"],
                                  ["generate", "x", "--seed", "-1"], ["generate", "x", "--top-p", "-1"],
                                  ["generate", "x", "--top-k", "-1"], ["generate", "x", "--max-tokens", "-5"],
                                  ["generate", "\udcff"]])
def test_bad_arguments_exit_2_in_one_line(argv: list[str]) -> None:
    outcome, detail = T.run_cli(argv, b"")
    assert outcome == "typed" and "error: argument" in detail
