"""The captured decoding step: the same tokens as recording every step, with no ops
recorded once it is captured; steps that cannot be captured keep running as recorded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import braze
from braze.capture import StepCapture
from braze.generate import KV_DTYPE, PREFILL_BUCKETS, DecodeStep, PrefillStep, clear_sessions, generate_ids
from braze.stream import fusion_enabled


def test_greedy_tokens_are_identical_with_and_without_capture(smollm: Any) -> None:
    ids = smollm.tokenizer.encode("The capital of France is")
    # BRAZE_FUSION=0 never replays: a few steps cover the observed ones (the first three)
    n = 20 if fusion_enabled() else 6
    captured = list(generate_ids(smollm.model, ids, n, capture=True))
    recorded = list(generate_ids(smollm.model, ids, n, capture=False))
    assert captured == recorded


def test_a_float16_cache_is_read_where_it_lies(smollm: Any) -> None:
    """Generation's float16 KV cache (``generate.KV_DTYPE``): a decoding step runs the
    kernels a float32 cache's does, and allocates no more (the attention kernel reads
    the half cache through its cast to float32: no float32 copy of it per step); its
    logits are the float32 cache's within float16's rounding of keys and values."""
    if not fusion_enabled():
        pytest.skip("the fused executor only")
    model = smollm.model
    prompt = smollm.tokenizer.encode("Once upon a time")
    runs = {}
    for dtype in (braze.float32, braze.float16):
        caches = model.new_cache(64, dtype=dtype)
        model(braze.tensor([prompt]), caches, last_only=True).numpy()
        step = DecodeStep(model, caches, capture=False)
        step(5)
        before = braze.stats()
        logits = step(17).copy()
        after = braze.stats()
        runs[dtype.name] = (logits, {k: after[k] - before[k] for k in ("kernel_launches", "bytes_allocated")})
    (l32, s32), (l16, s16) = runs["float32"], runs["float16"]
    assert s16["kernel_launches"] == s32["kernel_launches"], (s16, s32)
    assert s16["bytes_allocated"] <= s32["bytes_allocated"], (s16, s32)
    np.testing.assert_allclose(l16, l32, atol=5e-2, rtol=0)
    assert int(np.argmax(l16)) == int(np.argmax(l32))


def test_a_captured_step_records_nothing_and_matches_the_recorded_logits(smollm: Any) -> None:
    model = smollm.model
    prompt = smollm.tokenizer.encode("Once upon a time")
    caches = model.new_cache(64)
    model(braze.tensor([prompt]), caches, last_only=True).numpy()
    twin = model.new_cache(64)
    model(braze.tensor([prompt]), twin, last_only=True).numpy()
    step, plain = DecodeStep(model, caches), DecodeStep(model, twin, capture=False)
    tokens = [5, 17, 900, 3, 3, 44, 12, 7, 2000, 31]
    for i, tok in enumerate(tokens):
        before = braze.stats()
        got = step(tok).copy()
        after = braze.stats()
        want = plain(tok)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if step.captured and i >= 4:
            # one call into compiled code, nothing recorded, flushed or allocated
            assert after["nodes_recorded"] == before["nodes_recorded"]
            assert after["flushes"] == before["flushes"]
            assert after["c_calls"] == before["c_calls"] + 1
            assert after["allocations"] == before["allocations"]
            assert after["kernel_launches"] > before["kernel_launches"] + 100
    assert caches[0].length == twin[0].length == len(prompt) + len(tokens)
    if fusion_enabled():
        assert step.captured, step.capture.reason if step.capture else "no capture"
    else:
        assert not step.captured and step.capture is not None and "reference" in step.capture.reason


def test_a_token_outside_the_vocabulary_is_refused_in_a_replay(smollm: Any) -> None:
    if not fusion_enabled():
        pytest.skip("the fused executor only: nothing is captured on the reference executor")
    model = smollm.model
    caches = model.new_cache(16)
    model(braze.tensor([[1, 2]]), caches, last_only=True).numpy()
    step = DecodeStep(model, caches)
    for tok in range(1, 8):
        step(tok)
    assert step.captured
    with pytest.raises(braze.IndexOutOfRange):
        step(model.config.vocab_size)


def test_a_step_that_is_not_affine_in_the_position_is_not_captured() -> None:
    """A scalar that grows as the square of the position cannot be replayed by its
    first two differences: the capture says so and the caller keeps recording."""
    if not fusion_enabled():
        pytest.skip("the fused executor only")
    x = braze.randn(4, 8)
    cap = StepCapture()
    for pos in range(3 * 3):
        out = cap.observe(pos, lambda: x * float(pos * pos) + 1)
        np.testing.assert_allclose(out, x.numpy() * pos * pos + 1, rtol=1e-5, atol=1e-5)
    assert not cap.ready and "affine" in cap.reason


def test_an_affine_step_replays_new_positions() -> None:
    if not fusion_enabled():
        pytest.skip("the fused executor only")
    table = braze.randn(32, 8)
    cap = StepCapture()
    for pos in range(3):  # (+ 100.5: a scalar equal to the 2.0 would be one storage, another program)
        cap.observe(pos, lambda: table[pos:pos + 1] * 2.0 + (pos + 100.5))
    assert cap.ready, cap.reason
    for pos in (3, 10, 31):
        np.testing.assert_allclose(cap.replay(pos), table.numpy()[pos:pos + 1] * 2 + pos + 100.5, rtol=1e-5)


def test_a_second_generation_replays_from_its_first_step(smollm: Any) -> None:
    """A generation's caches and captured steps outlive it (``decode_session``): the
    next generation of the same length records its prompt (the second prompt its
    bucket's prefill capture watches) and no decoding step; the third records nothing."""
    if not fusion_enabled():
        pytest.skip("the fused executor only")
    model = smollm.model
    ids = smollm.tokenizer.encode("Paris is a city")
    clear_sessions(model)  # sessions other tests left on the model have captured already
    first = list(generate_ids(model, ids, 10))
    caches = model.new_cache(64, dtype=KV_DTYPE)  # as generation's
    before = braze.stats()
    PrefillStep(model, caches, capture=False)(ids)
    prompt_nodes = braze.stats()["nodes_recorded"] - before["nodes_recorded"]
    before = braze.stats()
    again = list(generate_ids(model, ids, 10))
    after = braze.stats()
    assert again == first
    assert after["nodes_recorded"] - before["nodes_recorded"] == prompt_nodes
    third = list(generate_ids(model, ids, 10))
    assert third == first
    assert braze.stats()["nodes_recorded"] == after["nodes_recorded"]


def test_a_replay_past_the_cache_is_refused(smollm: Any) -> None:
    if not fusion_enabled():
        pytest.skip("the fused executor only")
    model = smollm.model
    caches = model.new_cache(8)
    model(braze.tensor([[1]]), caches, last_only=True).numpy()
    step = DecodeStep(model, caches)
    for tok in range(2, 9):
        step(tok)
    assert step.captured and caches[0].length == 8
    with pytest.raises(braze.ShapeMismatch, match="context full"):
        step(3)


def test_a_changing_flag_is_a_reason_not_a_crash() -> None:
    if not fusion_enabled():
        pytest.skip("the fused executor only")
    x = braze.randn(4)
    cap = StepCapture()
    for pos in range(9):
        out = cap.observe(pos, lambda: x * 2.0 + braze.tensor(pos % 2 == 0).to("float32"))
        assert out.shape == (4,)
    assert not cap.ready and "not a number" in cap.reason


def test_max_context_bounds_a_generation(smollm: Any) -> None:
    ids = smollm.tokenizer.encode("The capital of France is")
    out = list(generate_ids(smollm.model, ids, 500, max_context=len(ids) + 7))
    assert len(ids) + len(out) <= len(ids) + 7


# -- prefill, padded to a bucket and captured ------------------------------------------------

def _unpadded(model: Any, ids: list[int], n: int) -> tuple[np.ndarray, list[Any]]:
    caches = model.new_cache(n)
    return model(braze.tensor([ids]), caches, last_only=True)[0, -1].numpy(), caches


def padded_tolerance(n: int) -> dict[str, float]:
    """How close an n-token prompt's logits (and keys and values) padded to its bucket
    are to its unpadded ones. Padded, its attention sums the keys in another order (a
    9-token prompt's rows see 9 keys, not a 16-row tile's) and a 1-token prompt's matmuls
    take the batched rows' path, not one row's; the activations are rounded to integers
    before each matmul (codegen/quant.py's int8x2), so a last-bit difference can move a
    rounding and grow through 30 layers, within the quantized path's own error against
    float (2-3e-2 of ~25). A prompt of a bucket's length is not padded: the same."""
    return dict(rtol=1e-4, atol=1e-3) if n in PREFILL_BUCKETS else dict(rtol=0, atol=3e-2)


@pytest.mark.parametrize("n", [1, 7, 9, 16, 20])
def test_a_padded_prefill_gives_the_prompts_logits_and_caches(smollm: Any, n: int) -> None:
    """Padding after the prompt changes nothing the prompt's positions compute: the
    last token's logits, and the keys and values of every prompt position."""
    if not fusion_enabled():
        pytest.skip("the fused executor only: the reference executor runs prompts unpadded")
    model = smollm.model
    ids = [int(t) for t in np.random.default_rng(n).integers(0, model.config.vocab_size, n)]
    want, plain = _unpadded(model, ids, 64)
    caches = model.new_cache(64)
    step = PrefillStep(model, caches)
    assert step.bucket(n) == next(b for b in PREFILL_BUCKETS if b >= n)
    got = step(ids)
    tol = padded_tolerance(n)
    np.testing.assert_allclose(got, want, **tol)
    assert caches[0].length == n
    for c, p in zip(caches, plain):
        np.testing.assert_allclose(c.k.numpy()[:, :, :n], p.k.numpy()[:, :, :n], **tol)
        np.testing.assert_allclose(c.v.numpy()[:, :, :n], p.v.numpy()[:, :, :n], **tol)


def test_a_bucket_is_captured_after_two_prompts_and_then_replayed(smollm: Any) -> None:
    if not fusion_enabled():
        pytest.skip("the fused executor only: nothing is captured on the reference executor")
    model = smollm.model
    caches = model.new_cache(64)
    step = PrefillStep(model, caches)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [700, 3, 12] * 4, [41] * 16, [2, 9, 4000, 17, 5, 5, 6, 7, 8]]
    for i, ids in enumerate(prompts):
        for c in caches:
            c.length = 0
        before = braze.stats()
        got = step(ids).copy()
        after = braze.stats()
        np.testing.assert_allclose(got, _unpadded(model, ids, 64)[0], **padded_tolerance(len(ids)))
        assert caches[0].length == len(ids)
        if i >= 2:  # two prompts watched, then one call into compiled code, nothing allocated
            assert step.captured == [16]
            assert after["nodes_recorded"] == before["nodes_recorded"]
            assert after["c_calls"] == before["c_calls"] + 1
            assert after["allocations"] == before["allocations"]


def test_a_prompt_token_outside_the_vocabulary_is_refused_before_a_replay(smollm: Any) -> None:
    model = smollm.model
    caches = model.new_cache(64)
    step = PrefillStep(model, caches)
    for ids in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        for c in caches:
            c.length = 0
        step(ids)
    for c in caches:
        c.length = 0
    with pytest.raises(braze.IndexOutOfRange, match="embedding"):
        step([1, model.config.vocab_size, 2])


def test_a_prompt_past_the_buckets_or_the_cache_runs_unpadded(smollm: Any) -> None:
    model = smollm.model
    step = PrefillStep(model, model.new_cache(64))
    assert step.bucket(65) is None  # its bucket (96) is longer than the caches
    assert step.bucket(PREFILL_BUCKETS[-1] + 1) is None
    step.caches[0].length = 3
    assert step.bucket(5) is None  # a prompt after others: the captures start at position 0
