"""The captured decoding step on the cuda device (under Triton's interpreter here): the
step's moving offsets and scalars live in one device buffer its kernels read, so every
replayed step launches the same kernels over the same arguments (what one CUDA graph
needs), and it decodes what the float64 reference and the CPU decode."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import braze
from braze.capture import StepCapture
from braze.generate import PREFILL_BUCKETS, DecodeStep, PrefillStep, generate_ids
from braze.models import load_llm
from braze.runtime import cuda, cuda_memory
from braze.runtime.cuda_replay import Replay
from braze.runtime.cpu import compiler_available

from .conftest import ON_GPU
from .test_generate_cuda import SPEC

pytest.importorskip("gguf", reason="the tiny model is written with the gguf package (a test dependency)")
from zoo_models import reference_greedy, reference_logits, write

# 27 prompt tokens, then 10 steps: observed at 27..29, replayed at 30..36, across the
# interpreter's 32-key tiles of the attention chain (and its split of the keys)
PROMPT = [int(x) for x in np.random.default_rng(16).integers(32, 250, 27)]
STEPS = 10
TILE = 32


def _record(calls: list[tuple[Any, ...]]) -> Any:
    """``cuda.launch_one`` that also notes each launch: its kernel, grid, arguments
    (address and type) and constexprs."""
    launch = cuda.launch_one

    def recording(st: cuda.Launch, args: list[Any], gpu: bool) -> None:
        calls.append((id(st.fn), st.grid, tuple((a.data_ptr(), a.dtype) for a in args), tuple(sorted(st.meta.items()))))
        launch(st, args, gpu)
    return recording


@dataclass
class Decoded:
    path: Path
    weights: dict[str, np.ndarray]
    model: Any
    step: DecodeStep
    tokens: list[int] = field(default_factory=list)  # the greedy tokens after the prompt
    logits: list[np.ndarray] = field(default_factory=list)  # of each step
    launches: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)  # position -> its step's launches
    graphs: dict[int, int] = field(default_factory=dict)  # position -> CUDA graphs its step launched (on a GPU)
    replayed: list[int] = field(default_factory=list)  # positions replayed
    slots: dict[int, dict[str, list[int]]] = field(default_factory=dict)  # position -> the moving buffer, by what


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Decoded]:
    """The tiny Q4_1 Llama on cuda decoding greedily through a captured ``DecodeStep``,
    each step's launches noted, and the moving buffer read after each replay."""
    path = tmp_path_factory.mktemp("cuda_capture") / "tiny.gguf"
    w = write(SPEC, path)
    with pytest.MonkeyPatch.context() as env:
        if not ON_GPU:
            env.setenv("BRAZE_CUDA_INTERPRET", "1")
        env.setenv("BRAZE_FUSION", "1")
        model = load_llm(path).model.to("cuda")
        caches = model.new_cache(64)
        first = model(braze.tensor([PROMPT], device="cuda"), caches, last_only=True)[0, -1].numpy()
        d = Decoded(path, w, model, DecodeStep(model, caches))
        tok = int(np.argmax(first))
        for _ in range(STEPS):
            d.tokens.append(tok)
            pos, replay = caches[0].length, d.step.captured
            calls: list[tuple[Any, ...]] = []
            graphs = braze.stats()["graph_launches"]
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(cuda, "launch_one", _record(calls))
                out = d.step(tok).copy()
            d.launches[pos] = calls
            d.graphs[pos] = braze.stats()["graph_launches"] - graphs
            if replay:
                d.replayed.append(pos)
                driver = d.step.capture.driver if d.step.capture else None
                assert driver is not None
                values = cuda_memory.download(driver.slots)
                by: dict[str, list[int]] = {}
                for what, v in zip(driver.what, values):
                    by.setdefault(what, []).append(int(v))
                d.slots[pos] = by
            d.logits.append(out)
            tok = int(np.argmax(out))
        yield d
        braze.synchronize()


def test_the_captured_step_decodes_the_references_and_the_cpus_tokens(decoded: Decoded) -> None:
    d = decoded
    assert d.step.captured, d.step.capture.reason if d.step.capture else "no capture"
    assert d.replayed == list(range(len(PROMPT) + 3, len(PROMPT) + STEPS))
    assert min(d.replayed) < TILE <= max(d.replayed)  # the replays cross a tile of keys
    want, margins = reference_greedy(SPEC, d.weights, PROMPT, STEPS)
    assert min(margins) > 1e-2, "a near tie in the reference: pick another prompt"
    assert d.tokens == want
    ref = reference_logits(SPEC, d.weights, PROMPT + d.tokens)[len(PROMPT):]
    for got, row in zip(d.logits, ref):
        np.testing.assert_allclose(got, row, atol=SPEC.atol, rtol=0)
    if compiler_available():
        cpu = load_llm(d.path).model
        assert list(generate_ids(cpu, PROMPT, STEPS)) == want


def test_every_replayed_step_launches_the_same_kernels_over_the_same_arguments(decoded: Decoded) -> None:
    """The precondition of one CUDA graph for every step: the launch lists of two
    replays are equal argument for argument; two recorded steps' lists are not (the KV
    cache's write and the rotary rows move), which is why no graph could replay them.
    On a GPU the replays after the graph's capture launch it alone (one graph, no kernel
    one by one)."""
    d = decoded
    driver = d.step.capture.driver if d.step.capture else None
    assert driver is not None
    first = d.launches[d.replayed[0]]
    assert len(first) == len(driver.calls) > 10
    by_graph = [p for p in d.replayed if not d.launches[p]]
    assert all(d.launches[p] == first for p in d.replayed if p not in by_graph)
    assert all(d.graphs[p] == 1 for p in by_graph)
    if ON_GPU:  # seen once, captured at the next, then replayed as the graph
        assert by_graph == d.replayed[2:], (d.replayed, by_graph)
    else:
        assert not by_graph and not any(d.graphs.values())
    recorded = [d.launches[p] for p in sorted(d.launches) if p not in d.replayed]
    assert len(recorded[0]) == len(first)
    moved = sum(a != b for a, b in zip(recorded[0], recorded[1]))
    assert moved >= 2 * SPEC.layers  # at least each layer's two KV cache writes


def test_the_moving_buffer_holds_each_steps_offsets_and_length(decoded: Decoded) -> None:
    d = decoded
    head = SPEC.head_dim
    for pos in d.replayed:
        slots = d.slots[pos]
        # per layer: the KV cache's keys and values written at row pos; q and k rotated by
        # the cos and sin tables' row pos (head_dim / 2 wide); the mask's length
        assert slots == {"assign output 0": [pos * head] * 2 * SPEC.layers,
                         "mul input 1": [pos * head // 2] * 4 * SPEC.layers,
                         "scalar int64": [pos + 1]}, (pos, slots)


def test_bad_input_to_a_captured_cuda_step_is_a_typed_error(decoded: Decoded) -> None:
    step, vocab = decoded.step, decoded.model.config.vocab_size
    assert step.captured
    caches = step.caches
    lengths = [c.length for c in caches]
    for bad in (vocab, -1):
        with pytest.raises(braze.IndexOutOfRange):
            step(bad)
    assert [c.length for c in caches] == lengths
    try:
        for c in caches:
            c.length = c.max_len
        with pytest.raises(braze.ShapeMismatch, match="context full"):
            step(3)
    finally:
        for c, n in zip(caches, lengths):
            c.length = n


def test_a_padded_prefill_on_cuda_is_captured_and_gives_the_prompts_logits(decoded: Decoded) -> None:
    """Prompts of 9, 12, 14 and 16 tokens run in the 16-token bucket (the first three
    padded): each one's last logits are the float64 reference's; the first two are
    watched, the others replay the capture: no op recorded, and the two replays launch
    the same kernels over the same arguments (the ids and the row index are written in
    place), what one CUDA graph needs."""
    model = decoded.model
    caches = model.new_cache(64)
    step = PrefillStep(model, caches)
    rng = np.random.default_rng(9)
    prompts = [[int(t) for t in rng.integers(32, 250, n)] for n in (9, 12, 14, 16)]
    launches: list[list[tuple[Any, ...]]] = []
    for i, ids in enumerate(prompts):
        for c in caches:
            c.length = 0
        assert step.bucket(len(ids)) == 16 == next(b for b in PREFILL_BUCKETS if b >= len(ids))
        calls: list[tuple[Any, ...]] = []
        before = braze.stats()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cuda, "launch_one", _record(calls))
            got = step(ids).copy()
        after = braze.stats()
        launches.append(calls)
        np.testing.assert_allclose(got, reference_logits(SPEC, decoded.weights, ids)[-1], atol=SPEC.atol, rtol=0)
        assert caches[0].length == len(ids)
        if i >= 2:
            assert step.captured == [16]
            assert after["nodes_recorded"] == before["nodes_recorded"]
    assert len(launches[2]) > 10
    assert launches[2] == launches[3]
    assert [c[0] for c in launches[1]] == [c[0] for c in launches[2]]  # watched and replayed: the same kernels


def test_an_affine_step_on_cuda_replays_new_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture is one thing on both devices: what moves is found by comparing three
    runs (``step_diff.py``), here a table's row (an offset) and a scalar."""
    table = braze.randn(40, 8).to("cuda")
    host = table.numpy()
    cap = StepCapture()
    for pos in range(3):
        got = cap.observe(pos, lambda: table[pos:pos + 1] * 2.0 + (pos + 100.5))
        np.testing.assert_allclose(got, host[pos:pos + 1] * 2 + pos + 100.5, rtol=1e-6)
    assert cap.ready, cap.reason
    assert isinstance(cap.driver, Replay)
    assert sorted(cap.driver.what) == ["mul input 0", "scalar float32"]
    for pos in (3, 17, 39, 5):
        np.testing.assert_allclose(cap.replay(pos), host[pos:pos + 1] * 2 + pos + 100.5, rtol=1e-6)
    monkeypatch.setenv("BRAZE_FUSION", "0")
    ref = StepCapture()
    for pos in range(9):
        ref.observe(pos, lambda: table[pos:pos + 1] * 2.0 + (pos + 100.5))
    assert not ref.ready and "reference" in ref.reason


@pytest.mark.requires_gpu
def test_on_a_gpu_each_replayed_step_is_one_graph_launch(decoded: Decoded) -> None:
    """On a GPU: the replays after the first are one CUDA graph launch each, no kernel
    launched one by one (the graph was captured once, by the second replay)."""
    if os.environ.get("BRAZE_CUDA_GRAPHS", "1").strip() == "0" or not ON_GPU:
        pytest.skip("CUDA graphs are off (BRAZE_CUDA_GRAPHS=0) or the interpreter was asked for")
    step = decoded.step
    before = braze.stats()
    tok = decoded.tokens[-1]
    for _ in range(3):
        tok = int(np.argmax(step(tok)))
    after = braze.stats()
    assert after["graph_launches"] - before["graph_launches"] == 3
    assert after["kernel_launches"] == before["kernel_launches"]
