"""Real models against Hugging Face transformers' outputs (tests/data, made by
scripts/make_reference.py) and against known answers.

Tolerances: greedy token ids exactly equal at every step. Logits (~25 at the top)
within 6e-2 absolute with the quantized kernels: decoding rounds x to 15 bits per
block of 32 (codegen/quant.py's int8x2 dot; measured 1.7e-2 to 3.0e-2 as summation
orders in the kernel changed, int16 2.1e-2; int8 would be 4.6 and change the greedy
ids); within 2e-3 with the weights dequantized to float32 (float32
through 30 layers in different summation orders; measured 1e-4, the reference's own
KV-cache-vs-full-forward difference ~5e-5). MiniLM embeddings within 1e-4 per
component and the known cosines within 1e-3.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import braze
import braze.generate
from braze.stream import fusion_enabled
from braze.models.bert import cosine_matrix

LOGIT_ATOL = 6e-2  # the quantized kernels
FLOAT_LOGIT_ATOL = 2e-3  # the weights dequantized to float32


def _teacher_forced(model: Any, prompt: list[int], cont: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Full prompt logits, then the logits after each reference token, via the KV cache."""
    caches = model.new_cache(len(prompt) + len(cont) + 1)
    prompt_logits = model(braze.tensor([prompt]), caches)[0].numpy().copy()
    steps = [prompt_logits[-1]]
    for t in cont[:-1]:
        steps.append(model(braze.tensor([[t]]), caches)[0, -1].numpy().copy())
    return prompt_logits, steps


def _check_top(logits: np.ndarray, top: dict[str, list[Any]], where: str, atol: float = LOGIT_ATOL) -> None:
    ids, values = np.asarray(top["ids"]), np.asarray(top["values"], dtype=np.float32)
    np.testing.assert_allclose(logits[ids], values, atol=atol, rtol=0, err_msg=where)
    assert int(np.argmax(logits)) == ids[0], where


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_logits_and_greedy_ids_match_transformers(smollm: Any, smollm_reference: dict[str, Any], index: int) -> None:
    if index in (1, 2) and not fusion_enabled():
        # the reference executor runs the same ops for every prompt: the shortest plain
        # prompt and the chat one (the longest, special tokens) check it; the fused run all four
        pytest.skip("BRAZE_FUSION=0: prompts 0 and 3 check the reference executor's model")
    ref = smollm_reference["prompts"][index]
    ids = smollm.tokenizer.encode(ref["text"], add_special_tokens=True, parse_special=True)
    assert ids == ref["input_ids"], "prompt tokenisation differs from the reference"
    prompt_logits, steps = _teacher_forced(smollm.model, ids, ref["greedy_ids"])
    for pos, top in enumerate(ref["prompt_top_logits"]):
        _check_top(prompt_logits[pos], top, f"{ref['name']} prompt position {pos}")
    # Fed the reference's own tokens, braze's argmax at every step is the reference's
    # greedy id, so braze's greedy continuation is the reference's, all 32 tokens.
    for step, top in enumerate(ref["steps"]):
        _check_top(steps[step], top, f"{ref['name']} generated step {step}")
        assert int(np.argmax(steps[step])) == ref["greedy_ids"][step]


@pytest.mark.slow
def test_dequantized_weights_match_transformers_closely(smollm_reference: dict[str, Any]) -> None:
    """Float32 weights (every matmul a float dot): the tighter bound, on the longest prompt."""
    from braze.models import load_llm
    model = load_llm(dequantize=True).model
    ref = smollm_reference["prompts"][3]
    prompt_logits, steps = _teacher_forced(model, ref["input_ids"], ref["greedy_ids"])
    for pos, top in enumerate(ref["prompt_top_logits"]):
        _check_top(prompt_logits[pos], top, f"{ref['name']} prompt position {pos}", FLOAT_LOGIT_ATOL)
    for step, top in enumerate(ref["steps"]):
        _check_top(steps[step], top, f"{ref['name']} generated step {step}", FLOAT_LOGIT_ATOL)


def test_free_running_greedy_generation_equals_reference(smollm: Any, smollm_reference: dict[str, Any]) -> None:
    """The generation loop itself (sampler, cache, no EOS stop) reproduces the 32 ids."""
    ref = smollm_reference["prompts"][0]
    # On the reference executor the first 12 steps: the loop and the cache are the same
    # Python whichever executor runs the model (the fused run takes all 32).
    n = len(ref["greedy_ids"]) if fusion_enabled() else 12
    got = list(braze.generate.generate_ids(smollm.model, ref["input_ids"], n))
    assert got == ref["greedy_ids"][:n]


def test_capital_of_france_continues_with_paris(smollm: Any) -> None:
    text = "".join(braze.generate.generate_text(smollm.model, smollm.tokenizer, "The capital of France is", 8))
    assert text.startswith(" Paris")


def test_chat_answers_paris(smollm: Any) -> None:
    text = "".join(braze.generate.generate_text(smollm.model, smollm.tokenizer, "What is the capital of France?",
                                                32, chat=True))
    assert "Paris" in text
    assert "<|im_end|>" not in text and "<|im_start|>" not in text


def test_minilm_embeddings_match_reference(minilm: Any, minilm_reference: dict[str, Any]) -> None:
    sentences = minilm_reference["sentences"]
    texts = [s["text"] for s in sentences]
    batch = minilm.tokenizer.encode_batch(texts)
    for row, s in zip(batch.ids, sentences):
        assert row[: len(s["input_ids"])].tolist() == s["input_ids"]
    vectors = minilm.model.embed(batch.ids, batch.attention_mask, batch.type_ids)
    want = np.asarray([s["embedding"] for s in sentences], dtype=np.float32)
    np.testing.assert_allclose(vectors, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_minilm_known_cosines(minilm: Any) -> None:
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."]
    batch = minilm.tokenizer.encode_batch(texts)
    sim = cosine_matrix(minilm.model.embed(batch.ids, batch.attention_mask, batch.type_ids))
    assert abs(sim[0, 1] - 0.7553) < 1e-3
    assert abs(sim[0, 2] - 0.2474) < 1e-3


def test_padding_does_not_change_embeddings(minilm: Any) -> None:
    """A sentence alone and padded inside a batch with a longer one embed the same."""
    short, long = "A cat.", "A considerably longer sentence that forces padding of the short one."
    alone = minilm.tokenizer.encode_batch([short])
    both = minilm.tokenizer.encode_batch([short, long])
    a = minilm.model.embed(alone.ids, alone.attention_mask, alone.type_ids)[0]
    b = minilm.model.embed(both.ids, both.attention_mask, both.type_ids)[0]
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_llama_config_comes_from_metadata(smollm: Any) -> None:
    c = smollm.model.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert c.rope_interleaved and c.vocab_size == 49152
    assert smollm.model.output.weight is smollm.model.embed.weight  # tied embeddings


def test_weights_are_not_copied_from_the_file(smollm: Any) -> None:
    """F32 tensors are zero-copy views of the memory-mapped file (read-only)."""
    norm = smollm.model.blocks[0].attn_norm.weight
    raw = smollm.file.tensor("blk.0.attn_norm.weight")
    assert np.shares_memory(norm.numpy(), raw)
    with pytest.raises(braze.Unsupported):
        norm[0] = 1.0
