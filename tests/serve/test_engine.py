"""The serving engine against single-sequence generation: batched decoding over the
paged KV cache, chunked prefill, prefix caching, preemption, cancellation."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pytest

from braze.errors import InvalidArgument, ShapeMismatch
from braze.generate import generate_ids
from braze.serve.engine import Engine, Event, QueueFull, Request
from braze.serve.runner import FREE_TURNS

PROMPTS = ["The capital of France is", "1, 2, 3,", "Hello, my name is",
           "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest"]
N = 8


class Collector:
    def __init__(self) -> None:
        self.events: dict[int, list[Event]] = {}
        self.done = threading.Condition()

    def __call__(self, ev: Event) -> None:
        with self.done:
            self.events.setdefault(ev.seq_id, []).append(ev)
            self.done.notify_all()

    def finished(self, sid: int) -> bool:
        evs = self.events.get(sid, [])
        return bool(evs) and evs[-1].finish_reason is not None

    def wait(self, ids: list[int], timeout: float = 300) -> None:
        with self.done:
            assert self.done.wait_for(lambda: all(self.finished(i) for i in ids), timeout), "engine timed out"

    def tokens(self, sid: int) -> list[int]:
        return [e.token_id for e in self.events[sid] if e.token_id is not None]


def ids_of(smollm: Any, prompt: str) -> list[int]:
    return list(smollm.tokenizer.encode(prompt, add_special_tokens=True))


@pytest.fixture(scope="module")
def reference(smollm: Any) -> Iterator[dict[str, list[int]]]:
    """Single-sequence greedy tokens, fused as the engine runs here (conftest's ``fused``;
    the paged ops themselves are checked on both executors in tests/test_paged.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BRAZE_FUSION", "1")
        yield {p: list(generate_ids(smollm.model, ids_of(smollm, p), N, eos_ids=smollm.tokenizer.eos_ids))
               for p in PROMPTS}


def run_all(engine: Engine, smollm: Any, prompts: list[str], n: int = N) -> tuple[Collector, list[int]]:
    col = Collector()
    ids = [engine.submit(Request(ids_of(smollm, p), n), col) for p in prompts]
    col.wait(ids)
    return col, ids


def test_batched_steps_match_single_sequence_generation(smollm: Any, reference: dict[str, list[int]]) -> None:
    # chunk=16: the long prompt is fed in two chunks while the others decode
    with Engine(smollm, max_batch=4, ctx=512, chunk=16) as engine:
        for _ in range(2):  # the second round replays captured steps
            col, ids = run_all(engine, smollm, PROMPTS)
            for p, sid in zip(PROMPTS, ids):
                assert col.tokens(sid) == reference[p], p
        m = engine.metrics()
        assert m.batch_size >= 1 and m.generated_tokens == 2 * N * len(PROMPTS)
        assert m.kv_blocks_used == 0 and m.running == 0


def test_a_prompt_that_arrives_while_others_decode_rides_in_their_steps(smollm: Any,
                                                                        reference: dict[str, list[int]]) -> None:
    long = ids_of(smollm, PROMPTS[3])
    assert len(long) > 16
    col = Collector()
    first = threading.Event()

    def cb(ev: Event) -> None:
        col(ev)
        first.set()
    with Engine(smollm, max_batch=2, ctx=512) as engine:
        runner = engine._runner
        turns = spy_turns(runner)
        short = engine.submit(Request(ids_of(smollm, PROMPTS[0]), 40, ignore_eos=True), cb)  # decodes throughout
        assert first.wait(300)
        sid = engine.submit(Request(long, N), col)
        col.wait([short, sid])
        prefills = [key for key in runner.buckets if key[1] > 1]
    # the short prompt alone was fed as rows of decoding steps (no prefill program); the
    # long one, more than the padding row feeds in FREE_TURNS turns, fed 2 rows a turn
    # beside the decoding row (3 rows a turn at a batch of 2: a step of 2 and one of 1)
    # while that was so
    assert len(long) - 1 > FREE_TURNS
    assert prefills == []
    n0 = len(ids_of(smollm, PROMPTS[0]))
    assert turns[0] == [2] * (n0 // 2) + [1] * (n0 % 2)  # all of it in one turn
    assert col.tokens(sid) == reference[PROMPTS[3]]
    assert max(sum(t) for t in turns[1:]) == 3 == runner.turn_rows
    # two rows a turn until the rest fits the padding row's FREE_TURNS turns
    assert sum(1 for t in turns if t == [2, 1]) >= (len(long) - 1 - FREE_TURNS) // 2 > 0


def spy_turns(runner: Any) -> list[list[int]]:
    """Per turn of ``runner``, the rows of each decoding step it runs."""
    turns: list[list[int]] = []
    step, decode = runner.step, runner._decode

    def spy_step(running: Any) -> Any:
        turns.append([])
        return step(running)

    def spy_decode(rows: Any) -> None:
        turns[-1].append(len(rows))
        decode(rows)
    runner.step, runner._decode = spy_step, spy_decode
    return turns


def test_a_short_prompt_beside_decoders_takes_only_the_padding_rows(smollm: Any) -> None:
    # max_batch 3: steps of up to 3 rows. Beside two decoders a third sequence's prompt
    # that the padding row feeds within FREE_TURNS turns rides one token a turn in it
    # instead of a second step beside it
    col = Collector()
    short = ids_of(smollm, PROMPTS[2])[:FREE_TURNS]
    with pytest.MonkeyPatch.context() as mp:  # as the reference fixture computes its tokens
        mp.setenv("BRAZE_FUSION", "1")
        want = list(generate_ids(smollm.model, short, N, eos_ids=smollm.tokenizer.eos_ids))

    def decoding(sid: int) -> None:
        with col.done:
            assert col.done.wait_for(lambda: bool(col.tokens(sid)) if sid in col.events else False, 300)
    with Engine(smollm, max_batch=3, ctx=512) as engine:
        turns = spy_turns(engine._runner)
        a = engine.submit(Request(ids_of(smollm, PROMPTS[0]), 40, ignore_eos=True), col)
        decoding(a)
        b = engine.submit(Request(ids_of(smollm, PROMPTS[1]), 40, ignore_eos=True), col)
        decoding(b)
        at = len(turns)
        sid = engine.submit(Request(short, N), col)
        col.wait([a, b, sid])
    assert col.tokens(sid) == want
    # one step every turn after the third request came (before: a step of 3 and one of 1)
    assert all(len(t) <= 1 for t in turns[at:])
    assert len(turns) - at >= len(short) + N - 1


def test_text_and_finish_reason(smollm: Any) -> None:
    with Engine(smollm, max_batch=2, ctx=512) as engine:
        col, (sid,) = run_all(engine, smollm, [PROMPTS[0]], n=3)
    evs = col.events[sid]
    assert evs[-1].finish_reason == "length" and evs[-1].completion_tokens == 3
    text = "".join(e.text for e in evs)
    assert text == smollm.tokenizer.decode(col.tokens(sid), skip_special_tokens=True)


def test_prefix_cache_reuses_blocks_and_gives_the_same_tokens(smollm: Any, reference: dict[str, list[int]]) -> None:
    long = PROMPTS[3]
    with Engine(smollm, max_batch=2, ctx=512) as engine:
        run_all(engine, smollm, [long])
        before = engine.metrics().prefix_hit_tokens
        col, (sid,) = run_all(engine, smollm, [long])
        hit = engine.metrics().prefix_hit_tokens - before
    n = len(ids_of(smollm, long))
    assert hit == (n - 1) // 16 * 16 > 0
    assert col.tokens(sid) == reference[long]


def test_preemption_when_the_pool_runs_out_gives_the_same_tokens(smollm: Any,
                                                                 reference: dict[str, list[int]]) -> None:
    # 3 usable blocks of 16: the long prompt alone needs 2, so the others wait or are preempted
    with Engine(smollm, max_batch=4, kv_tokens=48) as engine:
        col, ids = run_all(engine, smollm, PROMPTS)
        m = engine.metrics()
    for p, sid in zip(PROMPTS, ids):
        assert col.tokens(sid) == reference[p], p
    assert m.kv_blocks_used == 0 and m.kv_blocks_total == 3


def test_cancel_frees_the_sequence(smollm: Any) -> None:
    col = Collector()
    with Engine(smollm, max_batch=2, ctx=512) as engine:
        first = threading.Event()

        def cb(ev: Event) -> None:
            col(ev)
            first.set()
        sid = engine.submit(Request(ids_of(smollm, PROMPTS[0]), 500), cb)
        assert first.wait(300)
        engine.cancel(sid)
        col.wait([sid])
        m = engine.metrics()
    assert col.events[sid][-1].finish_reason == "abort"
    assert len(col.tokens(sid)) < 500
    assert m.kv_blocks_used == 0 and m.running == 0 and m.aborted == 1


def test_queue_limit_and_bad_requests(smollm: Any) -> None:
    engine = Engine(smollm, max_batch=1, queue_limit=1, ctx=64)  # not started: requests wait
    engine.submit(Request([1, 2], 4), lambda ev: None)
    with pytest.raises(QueueFull):
        engine.submit(Request([1, 2], 4), lambda ev: None)
    with pytest.raises(ShapeMismatch):
        engine.check(Request([], 4))
    with pytest.raises(ShapeMismatch):
        engine.check(Request([1] * 64, 4))
    with pytest.raises(InvalidArgument):
        engine.check(Request([1], 0))
    with pytest.raises(InvalidArgument):
        engine.check(Request([10 ** 9], 4))
    engine.close()


def test_embed_runs_on_the_engine_thread(smollm: Any, minilm: Any) -> None:
    texts = ["a cat sat", "on the mat"]
    with Engine(smollm, embedder=minilm, ctx=512) as engine:
        vectors, n = engine.embed(texts).result(timeout=300)
    batch = minilm.tokenizer.encode_batch(texts)
    want = minilm.model.embed(batch.ids, batch.attention_mask, batch.type_ids)
    np.testing.assert_allclose(vectors, want, rtol=1e-5, atol=1e-6)
    assert n == int(np.asarray(batch.attention_mask).sum())


def test_ignore_eos_generates_past_the_end_of_sequence(smollm: Any) -> None:
    tok = smollm.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True)
    ids = list(tok.encode(prompt, add_special_tokens=True, parse_special=True))
    col = Collector()
    with Engine(smollm, max_batch=2, ctx=512) as engine:
        stops = engine.submit(Request(ids, 48), col)
        goes_on = engine.submit(Request(ids, 48, ignore_eos=True), col)
        col.wait([stops, goes_on])
    assert col.events[stops][-1].finish_reason == "stop"
    n = len(col.tokens(stops))
    assert n < 48
    assert col.events[goes_on][-1].finish_reason == "length"
    assert col.tokens(goes_on)[:n] == col.tokens(stops)  # the same text, then EOS and more
    assert col.tokens(goes_on)[n] in tok.eos_ids and len(col.tokens(goes_on)) == 48


def test_warmup_captures_every_step_before_serving(smollm: Any, reference: dict[str, list[int]]) -> None:
    """Every decoding bucket and a prompt's first chunk in every prefill bucket are
    captured before the first request, so serving fresh prompts records no step."""
    with Engine(smollm, max_batch=2, ctx=64, warmup=True) as engine:
        engine.run(lambda: None).result(timeout=300)  # the warm-up ran first on the engine's thread
        assert not engine.warming
        warmed = {key: b.capture for key, b in engine._runner.buckets.items()}
        col, ids = run_all(engine, smollm, PROMPTS[:2])
        long = PROMPTS[3]  # alone: its first chunk through the prefill program
        col2, ids2 = run_all(engine, smollm, [long])
        after = set(engine._runner.buckets)
    # decoding: batch 1 and 2, table widths 1, 2, 4 (64 positions of 16); prefill: each
    # bucket of at most 64 tokens at the width its first chunk's blocks take
    assert sorted(k for k in warmed if k[1] == 1) == [(b, 1, w) for b in (1, 2) for w in (1, 2, 4)]
    assert sorted(k for k in warmed if k[1] > 1) == [(1, 8, 1), (1, 16, 1), (1, 32, 2), (1, 48, 4), (1, 64, 4)]
    assert all(c is not None and c.ready for c in warmed.values())
    assert after == set(warmed)
    for p, sid in zip(PROMPTS[:2], ids):
        assert col.tokens(sid) == reference[p], p
    assert col2.tokens(ids2[0]) == reference[long]
