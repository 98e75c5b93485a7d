"""``braze.perplexity`` and ``braze perplexity``: which tokens are scored (as llama.cpp's
llama-perplexity), the NLL against an independent float64 computation from the same
logits, and typed errors for inputs that cannot be scored."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import braze
from braze.errors import BrazeError, ShapeMismatch
from braze.perplexity import Window, perplexity, token_nll, windows
from braze.stream import fusion_enabled

HELDOUT = Path(__file__).resolve().parent.parent / "bench" / "data" / "heldout.txt"
CTX = 64


@pytest.fixture(scope="module")
def short_text() -> str:
    # The held-out essay's first paragraphs: about 130 tokens, two windows of 64.
    return HELDOUT.read_text(encoding="utf-8")[:620]


def test_windows_score_the_second_half_like_llama_cpp() -> None:
    ws = windows(4147, 256)
    assert len(ws) == 16  # the 51-token tail is dropped, as llama.cpp drops it
    assert [w.start for w in ws[:3]] == [0, 256, 512]
    assert all(w.length == 256 and w.first == 128 and w.scored == 127 for w in ws)
    # a text shorter than one window: one window of all its tokens
    assert windows(10, 64) == [Window(0, 10, 5)]
    # the smallest window still scores a token
    assert windows(2, 2)[0].scored == 1 and windows(7, 2)[0].scored == 1 and len(windows(7, 2)) == 3
    # overlapping windows (llama.cpp's --ppl-stride): each scores its last `stride` tokens
    ws = windows(100, 32, stride=8)
    assert [w.start for w in ws] == list(range(0, 69, 8)) and all(w.scored == 8 for w in ws)


def test_token_nll_matches_log_softmax_on_extreme_logits() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(5, 1000)) * np.array([[1], [10], [100], [1e4], [0]])).astype(np.float32)
    targets = rng.integers(0, 1000, size=5)
    got = token_nll(logits, targets)
    x = logits.astype(np.float64)
    want = np.array([np.logaddexp.reduce(x[i]) - x[i, t] for i, t in enumerate(targets)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got[4] == pytest.approx(math.log(1000))  # uniform logits


def _independent_ppl(model: Any, ids: list[int], ctx: int) -> tuple[float, int]:
    """llama.cpp's rule written out by hand: windows of ctx, tokens ctx/2+1 .. ctx-1
    scored, log-softmax by logaddexp in float64."""
    total, count = 0.0, 0
    for start in range(0, len(ids) - ctx + 1, ctx):
        chunk = ids[start:start + ctx]
        logits = model(braze.tensor([chunk])).numpy()[0].astype(np.float64)
        for j in range(ctx // 2, ctx - 1):
            total += np.logaddexp.reduce(logits[j]) - logits[j, chunk[j + 1]]
            count += 1
    return math.exp(total / count), count


def test_perplexity_matches_an_independent_computation(smollm: Any, short_text: str) -> None:
    model, tok = smollm.model, smollm.tokenizer
    ids = tok.encode(short_text, add_special_tokens=True, parse_special=False)
    assert len(ids) >= 2 * CTX
    assert not tok.add_bos  # SmolLM2: no BOS substitution, so the hand computation above applies
    r = perplexity(model, tok, short_text, ctx=CTX)
    want, count = _independent_ppl(model, ids, CTX)
    assert r.chunks == len(ids) // CTX and r.tokens == count == r.chunks * (CTX - 1 - CTX // 2)
    assert r.ppl == pytest.approx(want, rel=1e-6)
    assert r.nll == pytest.approx(math.log(want), rel=1e-6)
    assert math.isfinite(r.ppl) and 1.0 < r.ppl < tok.vocab_size
    assert math.isfinite(r.ppl_stderr) and 0 < r.ppl_stderr < r.ppl
    assert len(r.chunk_ppl) == r.chunks and r.chunk_ppl[-1] == pytest.approx(r.ppl)
    assert r.seconds > 0 and r.text_tokens == len(ids)
    # the same windows run in pieces through a KV cache give the same logits, up to rounding
    pieces = perplexity(model, tok, short_text, ctx=CTX, batch_tokens=CTX // 2)
    assert pieces.ppl == pytest.approx(r.ppl, rel=1e-3)


@pytest.mark.parametrize("text, ctx", [("", CTX), ("Hello", CTX), ("Hello world, again and again.", 1),
                                       ("Hello world, again and again.", 0)])
def test_inputs_that_cannot_be_scored_raise_typed_errors(smollm: Any, text: str, ctx: int) -> None:
    with pytest.raises(ShapeMismatch) as e:
        perplexity(smollm.model, smollm.tokenizer, text, ctx=ctx)
    assert isinstance(e.value, BrazeError) and isinstance(e.value, ValueError)
    assert "perplexity" in str(e.value)


def test_bad_stride_and_batch_raise_typed_errors(smollm: Any) -> None:
    text = "Hello world, again and again."
    bad: list[dict[str, Any]] = [{"stride": 0}, {"stride": CTX}, {"batch_tokens": 0}]
    for kwargs in bad:
        with pytest.raises(ShapeMismatch):
            perplexity(smollm.model, smollm.tokenizer, text, ctx=CTX, **kwargs)
    with pytest.raises(ShapeMismatch, match="context"):
        perplexity(smollm.model, smollm.tokenizer, text, ctx=smollm.model.config.context_length + 1)


def test_cli_prints_running_and_final_perplexity(smollm: Any, short_text: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import braze.models
    from braze.cli import main
    monkeypatch.setattr(braze.models, "load_llm", lambda path=None, dequantize=False: smollm)  # no second load
    f = tmp_path / "text.txt"
    f.write_text(short_text, encoding="utf-8")
    assert main(["perplexity", str(f), "--ctx", str(CTX)]) == 0
    out = capsys.readouterr().out
    want = perplexity(smollm.model, smollm.tokenizer, short_text, ctx=CTX)
    assert out.startswith("[1]") and "[2]" in out
    assert f"Final estimate: PPL = {want.ppl:.4f} +/- {want.ppl_stderr:.5f}" in out
    assert main(["perplexity", str(tmp_path / "missing.txt")]) == 1


def test_quantized_kernels_keep_perplexity_within_one_percent_of_float32(smollm: Any) -> None:
    """Fidelity of the quantized path: the model with its weights in their blocks (the
    quantized matmul kernels) against the same file dequantized to float32 at load,
    on held-out text: perplexities within 1%, and the same greedy continuation."""
    if not fusion_enabled():
        pytest.skip("BRAZE_FUSION=0 has no quantized kernels: its qlinear dequantizes to float32 as the other model does")
    from braze.generate import generate_ids
    from braze.models import load_llm
    f32 = load_llm(smollm.path, dequantize=True)
    assert f32.model.blocks[0].mlp.up.weight.dtype is braze.float32
    text = HELDOUT.read_text(encoding="utf-8")[:900]
    q = perplexity(smollm.model, smollm.tokenizer, text, 96)
    r = perplexity(f32.model, f32.tokenizer, text, 96)
    assert q.tokens == r.tokens > 60
    assert abs(q.ppl / r.ppl - 1) < 0.01, (q.ppl, r.ppl)
    ids = smollm.tokenizer.encode("The capital of France is")
    assert list(generate_ids(smollm.model, ids, 16)) == list(generate_ids(f32.model, ids, 16))
