"""Sampling, stopping and streaming, with a scripted stand-in model (fast and exact)
and the real SmolLM2 tokenizer for the text side."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import braze
from braze.generate import GenerationStats, Sampling, generate_ids, generate_text, sample


class Scripted:
    """Emits a fixed token sequence: its logits put the next scripted id on top."""

    def __init__(self, script: list[int], vocab: int, context: int = 64) -> None:
        self.script, self.vocab = script, vocab
        self.config = SimpleNamespace(context_length=context)
        self.calls: list[list[int]] = []

    def new_cache(self, n: int, dtype: Any = None) -> list[Any]:
        self.max_len = n
        return [SimpleNamespace(max_len=n)]

    def __call__(self, ids: braze.Tensor, caches: Any, last_only: bool = False) -> braze.Tensor:
        self.calls.append(ids.numpy().reshape(-1).tolist())
        step = len(self.calls) - 1
        logits = np.zeros((1, 1, self.vocab), np.float32)
        logits[0, 0, self.script[min(step, len(self.script) - 1)]] = 10.0
        return braze.from_numpy(logits)


def test_greedy_is_argmax() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert sample(logits, Sampling(), [], np.random.default_rng(0)) == 1


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    rng = np.random.default_rng(0)
    logits = np.random.default_rng(1).normal(size=100).astype(np.float32)
    for _ in range(20):
        assert sample(logits, Sampling(temperature=5.0, top_k=1), [], rng) == int(np.argmax(logits))


def test_top_p_keeps_the_smallest_set_with_enough_mass() -> None:
    # probabilities ~ [0.5, 0.3, 0.15, 0.05]: top_p=0.7 keeps exactly the first two.
    p = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(p).astype(np.float32)
    rng = np.random.default_rng(0)
    draws = {sample(logits, Sampling(temperature=1.0, top_p=0.7), [], rng) for _ in range(300)}
    assert draws == {0, 1}


def test_temperature_sampling_follows_the_distribution() -> None:
    p = np.array([0.6, 0.3, 0.1])
    rng = np.random.default_rng(0)
    draws = np.array([sample(np.log(p).astype(np.float32), Sampling(temperature=1.0), [], rng) for _ in range(4000)])
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, p, atol=0.03)


def test_repetition_penalty_demotes_seen_tokens() -> None:
    logits = np.array([2.0, 1.9, -1.0], np.float32)
    assert sample(logits, Sampling(repetition_penalty=1.5), [0], np.random.default_rng(0)) == 1
    # Negative logits of seen tokens are pushed further down, not up.
    logits = np.array([-1.0, -1.2], np.float32)
    assert sample(logits, Sampling(repetition_penalty=2.0), [0], np.random.default_rng(0)) == 1


def test_seeded_sampling_is_reproducible() -> None:
    logits = np.random.default_rng(3).normal(size=50).astype(np.float32)
    s = Sampling(temperature=1.0, top_k=20, seed=7)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    a = [sample(logits, s, [], rng_a) for _ in range(10)]
    b = [sample(logits, s, [], rng_b) for _ in range(10)]
    assert a == b and len(set(a)) > 1


def test_generation_stops_at_eos_and_counts() -> None:
    model = Scripted([5, 6, 7, 2, 8], vocab=10)
    stats = GenerationStats()
    out = list(generate_ids(model, [1, 2, 3], 10, eos_ids=frozenset({2}), stats=stats))
    assert out == [5, 6, 7]
    assert stats.stop_reason == "eos" and stats.generated_tokens == 3 and stats.prompt_tokens == 3
    assert model.calls[0] == [1, 2, 3] and model.calls[1:] == [[5], [6], [7]]  # prefill, then one token a step


def test_generation_stops_at_max_tokens() -> None:
    model = Scripted([4] * 20, vocab=10)
    stats = GenerationStats()
    assert list(generate_ids(model, [1], 5, stats=stats)) == [4] * 5
    assert stats.stop_reason == "length"


def test_prompt_longer_than_context_is_refused() -> None:
    model = Scripted([4], vocab=10, context=4)
    with pytest.raises(braze.ShapeMismatch, match="context"):
        list(generate_ids(model, [1, 2, 3, 4, 5], 3))


def _script_for(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False, parse_special=False)


def test_stop_string_ends_generation_and_is_not_emitted(smollm: Any) -> None:
    tok = smollm.tokenizer
    script = _script_for(tok, " one two STOP three four")
    model = Scripted(script, vocab=tok.vocab_size)
    stats = GenerationStats()
    pieces = list(generate_text(model, tok, "x", 40, stop=["STOP"], stats=stats))
    assert "".join(pieces) == " one two "
    assert stats.stop_reason == "stop"


def test_streaming_never_splits_a_character(smollm: Any) -> None:
    tok = smollm.tokenizer
    text = " héllo 👍🏽 日本語 👨‍👩‍👧"
    script = _script_for(tok, text)
    model = Scripted(script, vocab=tok.vocab_size)
    pieces = list(generate_text(model, tok, "x", len(script)))
    assert "".join(pieces) == text
    for p in pieces:
        p.encode("utf-8")  # a split surrogate or partial byte would fail or show U+FFFD
        assert "\ufffd" not in p


def test_held_back_text_is_released_when_it_is_not_a_stop(smollm: Any) -> None:
    tok = smollm.tokenizer
    script = _script_for(tok, " ST then more")
    model = Scripted(script, vocab=tok.vocab_size)
    assert "".join(generate_text(model, tok, "x", len(script), stop=["STOP"])) == " ST then more"


def test_decoding_replays_one_fused_plan(smollm: Any, monkeypatch: Any, capfd: Any) -> None:
    """Every decode step has the same shapes (attention over the whole preallocated
    cache, positions not written yet masked off; the position is a scalar, the cache
    write a placeholder offset), so after the first step each one is a plan hit, and
    nothing falls back to the reference executor. Greedy ids equal the unfused run's."""
    monkeypatch.setenv("BRAZE_FUSION", "1")
    ids = smollm.tokenizer.encode("The capital of France is")
    braze.reset_stats()
    fused = list(generate_ids(smollm.model, ids, 12))
    st = braze.stats()
    # the caches' zeros, the prefill and the first decode step build plans (two each
    # when a forward pass is longer than the stream's flush limit); every later flush
    # replays one
    assert st["plan_misses"] <= 5 and st["plan_hits"] >= st["flushes"] - 5, st
    assert "running it on the reference executor" not in capfd.readouterr().err
    monkeypatch.setenv("BRAZE_FUSION", "0")
    assert list(generate_ids(smollm.model, ids, 12)) == fused


def test_a_cold_generate_plans_each_program_once_and_compiles_both_ahead(smollm: Any, monkeypatch: Any,
                                                                       tmp_path: Any) -> None:
    """A first generate in a process with an empty cache: the prompt's kernels and then
    the decoding step's start compiling ahead (the prompt first, so they compile while
    the step is recorded and planned), and neither program is scheduled twice (the step
    is recorded ahead at the position its first real flush has); nothing else is
    planned (the caches are zero-filled without a kernel). Greedy ids equal the
    unfused run's."""
    from braze import plan
    from braze.generate import clear_sessions
    from braze.runtime import units
    monkeypatch.setenv("BRAZE_FUSION", "1")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(units, "later", lambda modules, targets: None)  # the units stay
    clear_sessions(smollm.model)
    plan.clear()
    scheduled: list[int] = []
    real_schedule = plan.schedule

    def spy(nodes: Any, *a: Any, **k: Any) -> Any:
        scheduled.append(len(nodes))
        return real_schedule(nodes, *a, **k)

    monkeypatch.setattr(plan, "schedule", spy)
    started: list[int] = []
    real_ahead = units.ahead
    monkeypatch.setattr(units, "ahead", lambda modules: started.append(len(modules)) or real_ahead(modules))
    ids = smollm.tokenizer.encode("The capital of France is")
    try:
        fused = list(generate_ids(smollm.model, ids, 4))
    finally:
        clear_sessions(smollm.model)  # its plans' kernels came from this test's cache
    assert len(scheduled) == 2, scheduled
    assert len(started) == 2 and all(started), started
    monkeypatch.setenv("BRAZE_FUSION", "0")
    assert list(generate_ids(smollm.model, ids, 4)) == fused
