"""BERT's WordPiece tokenizer from a GGUF file's metadata (``tokenizer.ggml.model == "bert"``).

llama.cpp's converter rewrites a WordPiece vocabulary into its "phantom space" spelling:
a word-initial piece gains a leading ``"▁"``, a continuation loses its ``"##"``, and
control tokens (``[CLS]``, ``[SEP]``, ...) stay as they are. This module undoes that
and builds the Hugging Face ``tokenizers`` pipeline of a BERT tokenizer.json: the BERT
normaliser (lower-cased, as llama.cpp's WPM tokenizer always does), the BERT
pre-tokeniser, WordPiece, and ``[CLS] A [SEP]`` (``[CLS] A [SEP] B [SEP]`` with token
types 0 and 1 for pairs). ``[CLS]`` is ``tokenizer.ggml.bos_token_id`` (or
``cls_token_id``), ``[SEP]`` ``tokenizer.ggml.seperator_token_id`` (llama.cpp's
spelling) or ``eos_token_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from .errors import FormatError
from .tokenizer import Tokenizer
from .vocab import Specials, TokenType, meta_bool, meta_get, meta_int, meta_str

PHANTOM_SPACE = "\u2581"


def wordpiece_token(token: str, token_type: int) -> str:
    """A vocabulary entry as WordPiece spells it, from llama.cpp's phantom-space spelling."""
    if token.startswith(PHANTOM_SPACE):
        return token[1:]
    if token_type in (TokenType.CONTROL, TokenType.UNKNOWN) or (token.startswith("[") and token.endswith("]")):
        return token  # older converters kept "[...]" tokens as they were, whatever their type
    return "##" + token


def wordpiece_from_gguf(metadata: Mapping[str, Any], path: str = "<metadata>",
                        max_length: int | None = None) -> Tokenizer:
    """A BERT tokenizer from ``tokenizer.ggml.*`` keys; inputs are truncated to
    ``max_length`` tokens ([CLS] and [SEP] included) when given."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "bert":
        raise FormatError(path, "tokenizer.ggml.model", None, f"expected 'bert' (WordPiece), got {model!r}")
    raw = meta_get(metadata, "tokenizer.ggml.tokens")
    if raw is None:
        raise FormatError(path, "tokenizer.ggml.tokens", None, "missing")
    n = len(raw)
    raw_types = meta_get(metadata, "tokenizer.ggml.token_type")
    types = [int(t) for t in raw_types] if raw_types is not None else [TokenType.NORMAL] * n
    if len(types) != n:
        raise FormatError(path, "tokenizer.ggml.token_type", None, f"{len(types)} entries for {n} tokens")
    tokens = [wordpiece_token(meta_str(t), ty) for t, ty in zip(raw, types)]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)

    def special(keys: tuple[str, ...], fallback: str | None) -> int | None:
        for key in keys:
            value = meta_int(metadata, f"tokenizer.ggml.{key}")
            if value is not None:
                if value >= n:
                    raise FormatError(path, f"tokenizer.ggml.{key}", None, f"id {value} outside vocabulary of {n}")
                return value
        if fallback is not None and fallback in vocab:
            return vocab[fallback]
        return None

    cls_id = special(("cls_token_id", "bos_token_id"), "[CLS]")
    sep_id = special(("seperator_token_id", "eos_token_id"), "[SEP]")
    unk_id = special(("unknown_token_id",), "[UNK]")
    pad_id = special(("padding_token_id",), "[PAD]")
    if unk_id is None:
        raise FormatError(path, "tokenizer.ggml.unknown_token_id", None, "WordPiece needs an unknown token")

    hf = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=tokens[unk_id], max_input_chars_per_word=100))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece()
    special_ids = frozenset(i for i, ty in enumerate(types) if ty in (TokenType.CONTROL, TokenType.UNKNOWN))
    hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special_ids)
                           if vocab[tokens[i]] == i])
    first = [tokens[cls_id]] if cls_id is not None and meta_bool(metadata, "tokenizer.ggml.add_bos_token", True) else []
    add_sep = meta_bool(metadata, "tokenizer.ggml.add_sep_token", meta_bool(metadata, "tokenizer.ggml.add_eos_token", True))
    last = [tokens[sep_id]] if sep_id is not None and add_sep else []
    used = {t: vocab[t] for t in first + last}
    hf.post_processor = processors.TemplateProcessing(
        single=[*first, "$A", *last], pair=[*first, "$A", *last, "$B:1", *(f"{t}:1" for t in last)],
        special_tokens=list(used.items()))
    if max_length is not None:
        hf.enable_truncation(max_length)
    specials = Specials(bos_id=cls_id, eos_id=sep_id, eos_ids=frozenset({sep_id} if sep_id is not None else ()),
                         unk_id=unk_id, pad_id=pad_id, add_bos=False, add_eos=False)
    return Tokenizer(hf, tokens=tokens, byte_pieces=None, special_ids=special_ids, specials=specials,
                     strip_leading_space=False, chat_template=None, uses_post_processor=True, max_length=max_length)
