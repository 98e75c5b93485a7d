"""A quantized model generating on the cuda device (under Triton's interpreter): a tiny
Llama written as a GGUF file with Q4_1 matrices (the default model's type), loaded,
moved with ``.to("cuda")``, generates the greedy tokens of a float64 numpy reference and
of the CPU, through the API and through ``braze generate --device cuda``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import braze
from braze.cli import main
from braze.generate import decode_session, generate_ids
from braze.models import load_llm
from braze.runtime.cpu import compiler_available

pytest.importorskip("gguf", reason="the tiny model is written with the gguf package (a test dependency)")
from zoo_models import Spec, reference_greedy, reference_logits, write

MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd", "output")
SPEC = Spec("tiny_q4_1", "llama", layers=2, interleaved=True, q8=tuple(f"{m}.weight" for m in MATRICES), qtype="Q4_1", atol=1e-5)
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]  # 12 tokens: prefill takes the GEMM
STEPS = 6  # the step is captured after three and replayed (``test_capture_cuda.py``)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("cuda_llm") / "tiny.gguf"
    return path, write(SPEC, path)


def test_greedy_tokens_on_cuda_are_the_references_and_the_cpus(tiny: tuple[Path, dict[str, np.ndarray]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path, w = tiny
    want, margins = reference_greedy(SPEC, w, PROMPT, STEPS)
    assert min(margins) > 1e-2, "a near tie in the reference: pick another seed"
    model = load_llm(path).model
    cpu = list(generate_ids(model, PROMPT, STEPS)) if compiler_available() else want
    model.to("cuda")
    assert model.device.type == "cuda" and model.output.weight.dtype.name == "q4_1"
    assert list(generate_ids(model, PROMPT, STEPS)) == want == cpu
    with decode_session(model, len(PROMPT) + STEPS) as step:  # the generation's session, kept
        assert step.captured, step.capture.reason if step.capture else "no capture"
    # the logits themselves: a 5-token prompt (the matrix-vector kernel over 5 rows),
    # then one decoding step through the KV cache on the device
    caches = model.new_cache(16)
    assert caches[0].k.device.type == "cuda"
    first = model(braze.tensor([PROMPT[:5]], device="cuda"), caches)[0].numpy()
    step = model(braze.tensor([[PROMPT[5]]], device="cuda"), caches)[0, -1].numpy()
    ref = reference_logits(SPEC, w, PROMPT[:6])
    np.testing.assert_allclose(first, ref[:5], atol=SPEC.atol, rtol=0)
    np.testing.assert_allclose(step, ref[5], atol=SPEC.atol, rtol=0)


def test_generate_command_on_cuda(tiny: tuple[Path, dict[str, np.ndarray]], capsys: Any) -> None:
    path, w = tiny
    tok = load_llm(path).tokenizer
    want, _ = reference_greedy(SPEC, w, tok.encode("hi"), 3)
    assert main(["generate", "hi", "--model", str(path), "--max-tokens", "3", "--device", "cuda"]) == 0
    assert capsys.readouterr().out == tok.decode(want) + "\n"


def test_device_option_is_checked_before_loading(capsys: Any) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", "--model", "/no/such/file.gguf", "--device", "tpu"])
    assert e.value.code == 2 and "unknown device 'tpu'" in capsys.readouterr().err
