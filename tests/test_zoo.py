"""Every decoder architecture braze runs, on a tiny model built here, against numpy.

Per architecture (tests/zoo_models.py: Llama 3 rope scaling, Mistral's sliding window,
Qwen3, Phi-3, Gemma 3): a GGUF file with random weights is loaded through
``load_llm`` as a downloaded file would be, and

* its logits over a prompt (one forward) and at every decoding step (the KV cache)
  match a float64 numpy implementation of the architecture written independently,
  fused and with ``BRAZE_FUSION=0``;
* greedy generation (prefill padded to its bucket, captured decoding) gives the
  reference's ids, identical in both modes;
* ``braze generate --chat`` runs it, with the chat template from the file.

Tolerances: float32 weights through a few layers, 1e-4 absolute on logits of size ~1-3
(measured ~1e-5); where some weights are Q8_0 the quantized kernels round x to 15 bits
per block when decoding: 2e-3.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import braze
from braze import plan
from braze.cli import main
from braze.errors import Unsupported
from braze.generate import generate_ids, generate_text
from braze.models import load_llm
from braze.runtime.cpu import compiler_available
from braze.schedule import ExternStep

from zoo_models import SPECS, Spec, reference_greedy, reference_logits, write

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114]  # "Hello, wor": 10 tokens, a window of 5 is crossed
STEPS = 14  # past Phi-3's original context of 16 (its long rope factors) and the windows


@pytest.fixture(scope="module", params=SPECS, ids=[s.name for s in SPECS])
def tiny(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Spec, Path, dict[str, np.ndarray]]:
    spec = request.param
    path = tmp_path_factory.mktemp("zoo") / f"{spec.name}.gguf"
    return spec, path, write(spec, path)


def _teacher_forced(model: Any, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(logits of one forward over all ids, logits of the prompt's last position and of
    each later id fed one at a time through the KV cache)."""
    full = model(braze.tensor([ids]))[0].numpy().copy()
    caches = model.new_cache(len(ids) + 1)
    steps = [model(braze.tensor([ids[:len(PROMPT)]]), caches)[0, -1].numpy().copy()]
    steps += [model(braze.tensor([[t]]), caches)[0, -1].numpy().copy() for t in ids[len(PROMPT):]]
    return full, np.array(steps)


@pytest.mark.parametrize("fusion", ["1", "0"])
def test_logits_match_numpy_float64(tiny: tuple[Spec, Path, dict[str, np.ndarray]], fusion: str,
                                    monkeypatch: Any) -> None:
    spec, path, w = tiny
    if fusion == "1" and not compiler_available():
        pytest.skip("no C compiler")
    monkeypatch.setenv("BRAZE_FUSION", fusion)
    model = load_llm(path).model
    assert type(model).__name__ == {"llama": "Llama", "qwen3": "Qwen3", "phi3": "Phi3", "gemma3": "Gemma3"}[spec.arch]
    greedy, _ = reference_greedy(spec, w, PROMPT, STEPS)
    ids = PROMPT + greedy
    want = reference_logits(spec, w, ids)
    full, steps = _teacher_forced(model, ids)
    np.testing.assert_allclose(full, want, atol=spec.atol, rtol=0)
    np.testing.assert_allclose(steps, want[len(PROMPT) - 1:], atol=spec.atol, rtol=0)


def test_greedy_generation_is_the_reference_fused_and_unfused(tiny: tuple[Spec, Path, dict[str, np.ndarray]],
                                                             monkeypatch: Any) -> None:
    spec, path, w = tiny
    want, margins = reference_greedy(spec, w, PROMPT, STEPS)
    assert min(margins) > 10 * spec.atol, "a near tie in the reference: pick another seed"
    got = {}
    for fusion in ("1", "0") if compiler_available() else ("0",):
        monkeypatch.setenv("BRAZE_FUSION", fusion)
        model = load_llm(path).model
        got[fusion] = [list(generate_ids(model, PROMPT, STEPS)) for _ in range(3)]  # the third replays captures
    for runs in got.values():
        assert runs == [want] * 3


def test_generate_command_with_the_files_chat_template(tiny: tuple[Spec, Path, dict[str, np.ndarray]],
                                                      capsys: Any) -> None:
    spec, path, _ = tiny
    loaded = load_llm(path)
    assert "<|im_start|>assistant" in loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                                            add_generation_prompt=True)
    want = "".join(generate_text(loaded.model, loaded.tokenizer, "hi", 8, chat=True))
    assert main(["generate", "hi", "--model", str(path), "--max-tokens", "8", "--chat"]) == 0
    assert capsys.readouterr().out == want + "\n"


def _chain_kernels() -> list[Any]:
    """The attention chain kernels (a second matmul over the row) of every stored plan."""
    from braze import ir
    from braze.schedule import KernelStep
    return [s.step.kernel for p in plan.stored_plans() for s in p.steps
            if isinstance(getattr(s, "step", None), KernelStep) and isinstance(s.step.kernel, ir.Kernel)
            and any(isinstance(st, ir.Contract) for st in s.step.kernel.stages)]


@pytest.mark.skipif(not compiler_available(), reason="no C compiler")
@pytest.mark.parametrize("steps", [0, 1], ids=["prompt", "decoding"])
def test_gemma3_sliding_window_layers_are_one_attention_kernel_each_with_no_mask_in_memory(
        tmp_path: Path, monkeypatch: Any, steps: int) -> None:
    """Gemma 3's 7 layers (6 local with a window, 1 global): 7 chain kernels in the plan,
    none reading or writing a bool tensor (the window mask is recomputed from indices in
    the kernel) and no extern step (every matrix Q8_0, so every matmul is a kernel too);
    the same for a decoding step over the KV cache."""
    matrices = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd")
    spec = replace(next(s for s in SPECS if s.name == "gemma3"), q8=tuple(f"{m}.weight" for m in matrices))
    path = tmp_path / "g.gguf"
    write(spec, path)
    monkeypatch.setenv("BRAZE_FUSION", "1")
    model = load_llm(path).model
    caches = model.new_cache(64)
    model(braze.tensor([PROMPT]), caches).numpy()
    if steps:
        model(braze.tensor([[5]]), caches).numpy()  # prime: the cache's zeros and this step's own writes
    plan.clear()
    braze.reset_stats()
    ids = [[7]] if steps else [PROMPT]
    (model(braze.tensor(ids), caches) if steps else model(braze.tensor(ids))).numpy()
    chains = _chain_kernels()
    assert len(chains) == spec.layers, len(chains)
    assert not any(dt.name == "bool" for k in chains for dt, _ in k.args)
    assert not [s for p in plan.stored_plans() for s in p.steps if isinstance(s, ExternStep)]
    assert braze.stats()["unfused_flushes"] == 0


def test_unknown_architecture_is_refused_before_any_tensor_is_read(tmp_path: Path, monkeypatch: Any) -> None:
    from braze.io.gguf import GGUFFile
    path = tmp_path / "x.gguf"
    write(Spec("other", "llama"), path)
    data = bytearray(path.read_bytes())
    at = data.index(b"llama")  # general.architecture's value: the first key written
    data[at:at + 5] = b"gptj2"
    path.write_bytes(bytes(data))

    def no_reads(self: Any, name: str) -> Any:
        raise AssertionError(f"tensor {name} read")
    monkeypatch.setattr(GGUFFile, "tensor", no_reads)
    monkeypatch.setattr(GGUFFile, "raw", no_reads)
    with pytest.raises(Unsupported, match=r"x.gguf: braze cannot run architecture 'gptj2'.*gemma3.*phi3.*qwen3"):
        load_llm(path)


def test_bad_metadata_is_a_format_error_naming_the_file_and_key(tmp_path: Path) -> None:
    from braze.errors import FormatError
    spec = replace(next(s for s in SPECS if s.name == "gemma3"), meta={"attention.sliding_window_pattern": "six"})
    path = tmp_path / "bad.gguf"
    write(spec, path)
    with pytest.raises(FormatError, match=r"bad.gguf.*gemma3.attention.sliding_window_pattern.*expected int"):
        load_llm(path)


def test_a_zero_sliding_window_means_none(tmp_path: Path) -> None:
    path = tmp_path / "w0.gguf"
    write(Spec("w0", "llama", interleaved=True, meta={"attention.sliding_window": 0}), path)
    model = load_llm(path).model
    assert model.config.sliding_window is None and model.blocks[0].attn.window is None
