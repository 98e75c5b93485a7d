"""The official ``openai`` client against braze serve, unchanged: chat (whole and
streamed), completions, embeddings, models. Greedy answers are compared with
``generate_text`` run on the engine's own thread (a path that shares no HTTP code)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from braze.generate import generate_text

PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"


@lru_cache(maxsize=None)
def reference(engine: Any, prompt: str, max_tokens: int, chat: bool = False, stop: tuple[str, ...] = ()) -> str:
    """Greedy text straight from the model, on the engine's thread (it owns the model)."""
    loaded = engine.loaded
    job = engine.run(lambda: "".join(generate_text(loaded.model, loaded.tokenizer, prompt, max_tokens,
                                                   chat=chat, stop=stop)))
    return str(job.result(timeout=120))


def test_models_lists_the_llm_and_the_embedder(client: Any, engine: Any) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [engine.model_name, engine.embedder_name]
    assert client.models.retrieve(engine.embedder_name).id == engine.embedder_name


def test_chat_is_the_models_greedy_answer(client: Any, engine: Any) -> None:
    r = client.chat.completions.create(model=engine.model_name, messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=4, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == engine.model_name
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == reference(engine, QUESTION, 4, chat=True)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}])
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(prompt, parse_special=True))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert (choice.finish_reason == "length") == (r.usage.completion_tokens == 4)


def test_streamed_chat_matches_the_whole_answer(client: Any, engine: Any) -> None:
    kwargs: dict[str, Any] = dict(model=engine.model_name, messages=[{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": QUESTION}], max_tokens=4, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_logprobs(client: Any, engine: Any) -> None:
    r = client.chat.completions.create(model=engine.model_name, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].logprob == max(a.logprob for a in t.top_logprobs)
        assert t.logprob == t.top_logprobs[0].logprob  # greedy: the chosen token is the likeliest


def test_completion_from_text_and_from_token_ids(client: Any, engine: Any) -> None:
    r = client.completions.create(model=engine.model_name, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    text = r.choices[0].text
    assert text == reference(engine, PROMPT, 5)
    assert "".join(r.choices[0].logprobs.tokens) == text
    assert all(len(top) == 2 for top in r.choices[0].logprobs.top_logprobs)
    ids = engine.tokenizer.encode(PROMPT, parse_special=True)
    by_ids = client.completions.create(model=engine.model_name, prompt=ids, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == text and by_ids.usage.prompt_tokens == len(ids)


def test_streamed_completion_and_stop_strings(client: Any, engine: Any) -> None:
    whole = reference(engine, PROMPT, 5)
    stop = whole.strip().split()[1] if len(whole.split()) > 1 else whole.strip()[-1]
    expected = reference(engine, PROMPT, 5, stop=(stop,))
    chunks = list(client.completions.create(prompt=PROMPT, max_tokens=5, temperature=0, stop=[stop], stream=True,
                                            model=engine.model_name))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert stop not in expected and chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client: Any, engine: Any) -> None:
    def run(seed: int) -> str:
        r = client.completions.create(model=engine.model_name, prompt="Once upon a time", max_tokens=3,
                                      temperature=1.0, top_p=0.95, seed=seed)
        return str(r.choices[0].text)
    first = run(11)
    assert run(11) == first


def test_embeddings_float_and_base64(client: Any, engine: Any) -> None:
    texts = ["A man is eating food.", "A man is riding a horse."]
    direct, n_tokens = engine.embed(texts).result(timeout=60)
    as_floats = client.embeddings.create(model=engine.embedder_name, input=texts, encoding_format="float")
    as_base64 = client.embeddings.create(model=engine.embedder_name, input=texts)  # the client asks for base64
    for r in (as_floats, as_base64):
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-6)
        assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens == n_tokens
    one = client.embeddings.create(model=engine.embedder_name, input=texts[0], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, direct[0], rtol=1e-4, atol=1e-5)


def test_many_texts_are_embedded_in_batches_alike(client: Any, engine: Any) -> None:
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'the sea'}" for i in range(45)]  # past EMBED_BATCH
    direct, n_tokens = engine.embed(texts).result(timeout=60)
    r = client.embeddings.create(model=engine.embedder_name, input=texts, encoding_format="float")
    assert [d.index for d in r.data] == list(range(45)) and r.usage.prompt_tokens == n_tokens
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), direct, rtol=1e-4, atol=1e-5)
