"""Text <-> token ids for braze models, built on Hugging Face's Rust ``tokenizers``.

Why this module exists: a GGUF file carries its vocabulary as metadata
(``tokenizer.ggml.*``), not as a ``tokenizer.json``. We rebuild an equivalent
``tokenizers.Tokenizer`` from that metadata so that encoding runs in Rust, while the
parts that must be exact and lossless (decoding bytes, streaming text out of a
generator, BOS/EOS policy) are done here, in Python, from per-token byte pieces.

Supported sources:

* GGUF ``tokenizer.ggml.model == "gpt2"``: byte-level BPE. The pre-tokeniser (how text
  is split into words before BPE) is chosen by ``tokenizer.ggml.pre``; see
  :data:`PRE_TOKENIZER_REGEXES`. An unknown name falls back to the GPT-2 split and
  says so once on stderr.
* GGUF ``tokenizer.ggml.model == "llama"``: SentencePiece-style BPE. Merges are derived
  from the token scores (a pair merges with the priority of the piece it makes),
  spaces become ``"▁"``, a space is prefixed to each text run when
  ``tokenizer.ggml.add_space_prefix`` (default true), and characters missing from the
  vocabulary fall back to ``<0xNN>`` byte tokens.
* ``tokenizer.json`` files (:meth:`Tokenizer.from_file`), used for BERT WordPiece
  embedding models. Those inputs are truncated to the model's maximum length (512
  for MiniLM, read from ``tokenizer_config.json`` beside the file when present).

Special-token policy (same as llama.cpp's ``parse_special``): control tokens (GGUF
token type 3) and the unknown token (type 2) are recognised in text only when
``encode(..., parse_special=True)`` (the default, because chat prompts are rendered
as text containing ``<|im_start|>`` and friends). User-defined tokens (type 4) are
always recognised, as in both llama.cpp and HF. Pass ``parse_special=False`` to
encode untrusted user text so that it cannot inject control tokens.

Chat templates come from the model file and are therefore untrusted code: they are
rendered by :func:`render_chat` in Jinja's immutable sandbox, with string/list
repetition and powers capped, and any failure surfaces as :class:`TemplateError`.
"""

from __future__ import annotations

import codecs
import json
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from braze.errors import FormatError, IndexOutOfRange, TemplateError, Unsupported
from braze.template import render_chat
from braze.vocab import (
    Packed, Specials, TokenType, byte_level_pieces, byte_token_value, meta_bool,
    meta_int, meta_list, meta_str, meta_text,
)


__all__ = [
    "CHATML_TEMPLATE",
    "PRE_TOKENIZER_REGEXES",
    "EncodedBatch",
    "StreamDecoder",
    "TemplateError",
    "TokenType",
    "Tokenizer",
    "render_chat",
]


# --------------------------------------------------------------------------- warnings

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    """Say something on stderr once per process: fallbacks are worth one line, not one
    line per prompt."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    print(f"braze.tokenizer: {message}", file=sys.stderr)


# ------------------------------------------------------------------ pre-tokenisers

# The GPT-2 word split: contractions, letter runs, digit runs, other-symbol runs (each
# optionally led by one space), and whitespace runs that leave one space for the next
# word. The trailing ``\s+`` catches whitespace before a non-space; with the
# "isolated" split it changes nothing, but it keeps the regex total.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# Llama-3 / tiktoken cl100k style: case-insensitive contractions, a letter run may be
# led by one non-letter non-digit non-newline char, digits in groups of up to three,
# newlines kept with the preceding symbol run.
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2: as Llama-3, but every digit is its own word.
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ``tokenizer.ggml.pre`` name -> regexes applied in order, each splitting the pieces
#: left by the previous one (matches become their own pieces, as HF's "isolated"
#: Split does). ``"default"`` is llama.cpp's default BPE split: punctuation runs
#: first, then GPT-2, then digit runs and groups of three ASCII digits.
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "gpt2": (_GPT2,),
    "gpt-2": (_GPT2,),
    "phi-2": (_GPT2,),
    "mpt": (_GPT2,),
    "olmo": (_GPT2,),
    "jais": (_GPT2,),
    # GPT-2 with each digit split off first (SmolLM2's HF tokenizer: Digits(individual)).
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2),
    "codeshell": (r"\p{N}", _GPT2),
    "exaone": (r"\p{N}", _GPT2),
    "llama-bpe": (_LLAMA3,),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "falcon3": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "dbrx": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "stablelm2": (_QWEN2,),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
}

# Pre-tokenisers whose BPE takes a whole word as one token when the word is in the
# vocabulary, skipping merges (HF ``ignore_merges``; tiktoken-converted vocabularies
# have words that the merge list alone does not reach).
_IGNORE_MERGES_PRE = frozenset({"llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe", "dbrx"})

# Control tokens that end a turn in common chat formats; generation stops on them
# even when the file names a different EOS.
_END_OF_TURN_NAMES = frozenset(
    {
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<|end|>",
        "<end_of_turn>",
        "<|return|>",
        "<EOT>",
    }
)


class EncodedBatch(NamedTuple):
    """Right-padded batch for embedding models: ``ids`` and ``attention_mask`` (1 for a
    real token, 0 for padding) and ``type_ids`` (segment ids, all 0 for single texts),
    each an int64 array of shape ``[batch, longest]``."""

    ids: np.ndarray
    attention_mask: np.ndarray
    type_ids: np.ndarray


class Tokenizer:
    """Encodes text to ids and decodes ids to text for one model.

    Build it with :meth:`from_gguf_metadata` or :meth:`from_file`; the constructor is
    internal. Encoding is thread-safe. Decoding of GGUF vocabularies works on raw
    bytes per token (:meth:`token_to_piece`), so it is lossless and incremental
    decoding (:class:`StreamDecoder`) gives exactly :meth:`decode`'s text.
    """

    def __init__(
        self,
        hf: tokenizers.Tokenizer,
        *,
        tokens: Sequence[str],
        byte_pieces: Sequence[bytes] | None,
        special_ids: frozenset[int],
        specials: Specials,
        strip_leading_space: bool,
        chat_template: str | None,
        uses_post_processor: bool,
        max_length: int | None = None,
    ) -> None:
        self._hf = hf
        # Packed, not lists: they live as long as the tokenizer (see Packed).
        self._tokens = Packed.of_texts(tokens)
        # Built on the first token_to_id() (a 49k-entry dict nobody needs to generate).
        self._token_to_id: dict[str, int] | None = None
        self._byte_pieces = Packed(byte_pieces) if byte_pieces is not None else None
        self._special_ids = special_ids
        self._specials = specials
        self._strip_leading_space = strip_leading_space
        self._uses_post_processor = uses_post_processor
        self.chat_template: str | None = chat_template
        #: Longest encoded length before truncation (``from_file`` only), else None.
        self.max_length = max_length
        # ``encode_special_tokens`` is state on the Rust object; a lock keeps one
        # caller's parse_special choice from leaking into another thread's encode.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_ids={sorted(self.eos_ids)}, "
            f"add_bos={self.add_bos}, chat_template={'yes' if self.chat_template else 'no'})"
        )

    # ----------------------------------------------------------------- building

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF file's metadata dict (``tokenizer.ggml.*`` keys; strings as
        ``str``, arrays as sequences). Raises :class:`~braze.errors.Unsupported` for a
        tokenizer model other than ``"gpt2"`` or ``"llama"``."""
        op = "Tokenizer.from_gguf_metadata"
        if "tokenizer.ggml.model" not in metadata:
            raise FormatError(
                "<metadata>", "tokenizer.ggml.model", None, "missing: no tokenizer in this file"
            )
        model = meta_text(metadata, "tokenizer.ggml.model", None)
        if model not in ("gpt2", "llama"):
            raise Unsupported(
                op,
                f"tokenizer model {model!r} (braze supports 'gpt2' byte-level BPE and 'llama' SentencePiece BPE)",
            )
        if "tokenizer.ggml.tokens" not in metadata:
            raise FormatError("<metadata>", "tokenizer.ggml.tokens", None, "missing")
        tokens = meta_list(metadata, "tokenizer.ggml.tokens", str) or []
        n = len(tokens)
        raw_types = meta_list(metadata, "tokenizer.ggml.token_type", (int, np.integer))
        types = [int(t) for t in raw_types] if raw_types is not None else [TokenType.NORMAL] * n
        if len(types) != n:
            raise FormatError(
                "<metadata>", "tokenizer.ggml.token_type", None, f"{len(types)} entries for {n} tokens"
            )

        # Vocabulary for the BPE model: the first id wins when a string repeats.
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t:
                vocab.setdefault(t, i)

        if model == "gpt2":
            hf, pieces, strip = cls._build_byte_level(metadata, tokens, types, vocab)
        else:
            hf, pieces, strip = cls._build_sentencepiece(metadata, tokens, types, vocab)

        # Control/unknown tokens: special (parsed only with parse_special, skipped by
        # skip_special_tokens). User-defined: always parsed, never skipped.
        special_ids = frozenset(
            i for i, ty in enumerate(types) if ty in (TokenType.CONTROL, TokenType.UNKNOWN)
        )
        added: list[AddedToken] = []
        for i, ty in enumerate(types):
            # A repeated string keeps its first id (vocab.get(...) == i).
            if (
                ty in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)
                and vocab.get(tokens[i]) == i
            ):
                added.append(AddedToken(tokens[i], special=ty != TokenType.USER_DEFINED, normalized=False))
        hf.add_special_tokens([a for a in added if a.special])
        hf.add_tokens([a for a in added if not a.special])

        bos = meta_int(metadata, "tokenizer.ggml.bos_token_id")
        eos = meta_int(metadata, "tokenizer.ggml.eos_token_id")
        unk = meta_int(metadata, "tokenizer.ggml.unknown_token_id")
        pad = meta_int(metadata, "tokenizer.ggml.padding_token_id")
        for name, value in (("bos", bos), ("eos", eos), ("unknown", unk), ("padding", pad)):
            if value is not None and value >= n:
                raise FormatError(
                    "<metadata>",
                    f"tokenizer.ggml.{name}_token_id",
                    None,
                    f"id {value} outside vocabulary of {n}",
                )
        eos_ids: set[int] = {eos} if eos is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            extra = meta_int(metadata, key)
            if extra is not None and extra < n:
                eos_ids.add(extra)
        for i, ty in enumerate(types):
            if ty in (TokenType.CONTROL, TokenType.USER_DEFINED) and tokens[i] in _END_OF_TURN_NAMES:
                eos_ids.add(i)
        specials = Specials(
            bos_id=bos,
            eos_id=eos,
            eos_ids=frozenset(eos_ids),
            unk_id=unk,
            pad_id=pad,
            # llama.cpp's defaults when the file is silent: SentencePiece adds BOS,
            # byte-level BPE (GPT-2 lineage) does not.
            add_bos=meta_bool(metadata, "tokenizer.ggml.add_bos_token", model == "llama"),
            add_eos=meta_bool(metadata, "tokenizer.ggml.add_eos_token", False),
        )
        template = meta_text(metadata, "tokenizer.chat_template", None)
        return cls(
            hf,
            tokens=tokens,
            byte_pieces=pieces,
            special_ids=special_ids,
            specials=specials,
            strip_leading_space=strip,
            chat_template=template,
            uses_post_processor=False,
        )

    @staticmethod
    def _build_byte_level(
        metadata: Mapping[str, Any], tokens: list[str], types: list[int], vocab: dict[str, int]
    ) -> tuple[tokenizers.Tokenizer, list[bytes], bool]:
        """GPT-2 style: split words with the ``pre`` regexes, map bytes to the printable
        alphabet, then rank-ordered merges."""
        pre_name = meta_text(metadata, "tokenizer.ggml.pre", "default") or "default"
        regexes = PRE_TOKENIZER_REGEXES.get(pre_name)
        if regexes is None:
            _warn_once(
                f"pre:{pre_name}",
                f"unknown pre-tokenizer {pre_name!r} in tokenizer.ggml.pre; using the GPT-2 split, "
                "so ids may differ from the model's own tokenizer",
            )
            regexes = (_GPT2,)
        merges = _parse_merges(meta_list(metadata, "tokenizer.ggml.merges", str) or [], vocab)
        bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre_name in _IGNORE_MERGES_PRE)
        hf = tokenizers.Tokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        hf.decoder = decoders.ByteLevel()
        byte_level = [ty in (TokenType.NORMAL, TokenType.UNUSED, TokenType.BYTE) for ty in types]
        return hf, byte_level_pieces(tokens, byte_level), False

    @staticmethod
    def _build_sentencepiece(
        metadata: Mapping[str, Any], tokens: list[str], types: list[int], vocab: dict[str, int]
    ) -> tuple[tokenizers.Tokenizer, list[bytes], bool]:
        """SentencePiece BPE: spaces are ``"▁"``, no word split, merges ranked by the
        score of the piece they produce, unknown characters spelled as byte tokens."""
        raw_scores = meta_list(metadata, "tokenizer.ggml.scores", (int, float, np.integer, np.floating))
        n = len(tokens)
        scores = [float(s) for s in raw_scores] if raw_scores is not None else [-float(i) for i in range(n)]
        if len(scores) != n:
            raise FormatError(
                "<metadata>", "tokenizer.ggml.scores", None, f"{len(scores)} entries for {n} tokens"
            )
        # SentencePiece merges the adjacent pair whose concatenation is the
        # highest-scoring vocabulary piece. A BPE merge list sorted by that score (ties
        # by id) makes HF's BPE take the same steps.
        ranked: list[tuple[float, int, str, str]] = []
        for i, t in enumerate(tokens):
            if types[i] != TokenType.NORMAL or len(t) < 2 or vocab.get(t) != i:
                continue
            for cut in range(1, len(t)):
                left, right = t[:cut], t[cut:]
                if left in vocab and right in vocab:
                    ranked.append((-scores[i], i, left, right))
        ranked.sort()
        merges = [(left, right) for _, _, left, right in ranked]
        unk = meta_int(metadata, "tokenizer.ggml.unknown_token_id")
        has_bytes = any(t == TokenType.BYTE for t in types)
        bpe = models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk] if unk is not None and unk < n else None,
            fuse_unk=True,
            byte_fallback=has_bytes,
        )
        hf = tokenizers.Tokenizer(bpe)
        add_prefix = meta_bool(metadata, "tokenizer.ggml.add_space_prefix", True)
        steps: list[normalizers.Normalizer] = []
        if add_prefix:
            steps.append(normalizers.Prepend("▁"))
        steps.append(normalizers.Replace(" ", "▁"))
        hf.normalizer = normalizers.Sequence(steps)
        hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        pieces: list[bytes] = []
        for t, ty in zip(tokens, types):
            value = byte_token_value(t) if ty == TokenType.BYTE else None
            if value is not None:
                pieces.append(bytes([value]))
            elif ty in (TokenType.NORMAL, TokenType.UNUSED, TokenType.USER_DEFINED):
                pieces.append(t.replace("▁", " ").encode("utf-8"))
            else:
                pieces.append(t.encode("utf-8"))
        return hf, pieces, add_prefix

    @classmethod
    def from_file(cls, path: str | Path, *, max_length: int | None = None) -> Tokenizer:
        """Load a ``tokenizer.json`` (e.g. MiniLM's BERT WordPiece).

        Encodings are truncated to ``max_length`` tokens including ``[CLS]``/``[SEP]``.
        When not given it is ``model_max_length`` from ``tokenizer_config.json`` beside
        the file (512 for MiniLM), else ``max_position_embeddings`` from
        ``config.json``, else 512: the longest input the model's position table can
        hold. The file's own truncation/padding settings (MiniLM's say fixed 128) are
        replaced: batches pad to their longest member instead.
        """
        path = Path(path)
        try:
            hf = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:
            raise FormatError(str(path), "tokenizer.json", None, str(exc)) from exc
        config = _read_json(path.with_name("tokenizer_config.json"))
        if max_length is None:
            declared = config.get("model_max_length")
            if isinstance(declared, (int, float)) and 0 < declared <= 1_000_000:
                max_length = int(declared)
            else:
                positions = _read_json(path.with_name("config.json")).get("max_position_embeddings")
                max_length = int(positions) if isinstance(positions, int) and positions > 0 else 512
        hf.no_truncation()
        hf.no_padding()
        hf.enable_truncation(max_length)

        raw = json.loads(path.read_text(encoding="utf-8"))
        vocab_size = hf.get_vocab_size(with_added_tokens=True)
        tokens = [hf.id_to_token(i) or "" for i in range(vocab_size)]
        special_ids = frozenset(
            int(a["id"])
            for a in raw.get("added_tokens", [])
            if a.get("special") and int(a["id"]) < vocab_size
        )

        def token_id(key: str) -> int | None:
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            return hf.token_to_id(value) if isinstance(value, str) else None

        pad_cfg = (raw.get("padding") or {}).get("pad_id")
        pad = token_id("pad_token")
        pad = pad if pad is not None else (int(pad_cfg) if isinstance(pad_cfg, int) else None)
        eos = token_id("eos_token")
        eos_ids = {eos} if eos is not None else set()
        eos_ids |= {i for i in special_ids if tokens[i] in _END_OF_TURN_NAMES}
        specials = Specials(
            bos_id=token_id("bos_token"),
            eos_id=eos,
            eos_ids=frozenset(eos_ids),
            unk_id=token_id("unk_token"),
            pad_id=pad,
            add_bos=False,  # the file's post-processor decides (e.g. [CLS] ... [SEP])
            add_eos=False,
        )
        # Byte-level vocabularies (GPT-2 lineage tokenizer.json) get exact byte pieces
        # and so streaming; others (WordPiece) decode through the file's decoder.
        pieces: list[bytes] | None = None
        if (raw.get("decoder") or {}).get("type") == "ByteLevel":
            pieces = byte_level_pieces(tokens, [i not in special_ids for i in range(len(tokens))])
        template = config.get("chat_template")
        return cls(
            hf,
            tokens=tokens,
            byte_pieces=pieces,
            special_ids=special_ids,
            specials=specials,
            strip_leading_space=False,
            chat_template=template if isinstance(template, str) else None,
            uses_post_processor=True,
            max_length=max_length,
        )

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> ids.

        ``add_special_tokens``: add what the model asks for around a sequence (GGUF:
        BOS when ``add_bos_token``, EOS when ``add_eos_token``; tokenizer.json: its
        post-processor, e.g. ``[CLS] ... [SEP]``). A BOS is not added when the text
        already starts with one (a chat template that writes ``{{ bos_token }}``),
        because a doubled BOS silently degrades generation.
        ``parse_special``: recognise control tokens written in the text (``"<|im_start|>"``
        -> one id). Turn it off for untrusted user text.
        """
        with self._lock:
            self._hf.encode_special_tokens = not parse_special
            try:
                enc = self._hf.encode(
                    text, add_special_tokens=add_special_tokens and self._uses_post_processor
                )
            finally:
                self._hf.encode_special_tokens = False
        return self._add_specials(list(enc.ids)) if add_special_tokens else list(enc.ids)

    def _add_specials(self, ids: list[int]) -> list[int]:
        s = self._specials
        if s.add_bos and s.bos_id is not None and not (ids and ids[0] == s.bos_id):
            ids.insert(0, s.bos_id)
        if s.add_eos and s.eos_id is not None and not (ids and ids[-1] == s.eos_id):
            ids.append(s.eos_id)
        return ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, parse_special: bool = True
    ) -> EncodedBatch:
        """Encode several texts and right-pad them to the longest, for one batched
        forward pass (embedding models). Padding uses the pad token (else EOS, else
        0) and is masked out by ``attention_mask``. Each text is truncated to
        :attr:`max_length` when the tokenizer has one (``from_file``)."""
        texts = list(texts)
        if not self._uses_post_processor:
            rows = [self.encode(t, add_special_tokens, parse_special) for t in texts]
            types = [[0] * len(r) for r in rows]
        else:
            with self._lock:
                self._hf.encode_special_tokens = not parse_special
                try:
                    encs = self._hf.encode_batch(texts, add_special_tokens=add_special_tokens)
                finally:
                    self._hf.encode_special_tokens = False
            rows = [list(e.ids) for e in encs]
            types = [list(e.type_ids) for e in encs]
        width = max((len(r) for r in rows), default=0)
        pad = self._specials.pad_id
        pad = pad if pad is not None else (self._specials.eos_id if self._specials.eos_id is not None else 0)
        ids = np.full((len(rows), width), pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        type_ids = np.zeros((len(rows), width), dtype=np.int64)
        for b, (row, ty) in enumerate(zip(rows, types)):
            ids[b, : len(row)] = row
            mask[b, : len(row)] = 1
            type_ids[b, : len(ty)] = ty
        return EncodedBatch(ids, mask, type_ids)

    # ------------------------------------------------------------------ decoding

    def _check_id(self, token_id: int, op: str) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < len(self._tokens):
            raise IndexOutOfRange(op, token_id, len(self._tokens), 0)
        return token_id

    def _piece(self, token_id: int, skip_special_tokens: bool, strip_pending: bool) -> tuple[bytes, bool]:
        """Bytes that ``token_id`` adds to the output, and whether the SentencePiece
        leading-space strip is still pending. That strip removes the space the encoder
        prefixed, from the first non-special token, so decode(encode(s)) == s."""
        assert self._byte_pieces is not None
        if token_id in self._special_ids:
            return (b"" if skip_special_tokens else self._byte_pieces[token_id]), strip_pending
        piece = self._byte_pieces[token_id]
        if strip_pending and piece.startswith(b" "):
            piece = piece[1:]
        return piece, False

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text. Bytes that do not form valid UTF-8 (a cut-off multi-byte
        character) become U+FFFD rather than raising: model output is not guaranteed to
        be well formed."""
        checked = [self._check_id(i, "decode") for i in ids]
        if self._byte_pieces is None:
            return self._hf.decode(checked, skip_special_tokens=skip_special_tokens)
        out = bytearray()
        pending = self._strip_leading_space
        for i in checked:
            piece, pending = self._piece(i, skip_special_tokens, pending)
            out += piece
        return out.decode("utf-8", errors="replace")

    def token_to_piece(self, token_id: int) -> bytes:
        """The raw bytes one token contributes to decoded text (``b" world"`` for
        ``"Ġworld"``). Bytes, not str: a byte-level token may hold part of a UTF-8
        character."""
        token_id = self._check_id(token_id, "token_to_piece")
        if self._byte_pieces is not None:
            return self._byte_pieces[token_id]
        return self._hf.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry as stored (``"Ġworld"``, ``"<0x0A>"``, ``"##ing"``)."""
        return self._tokens.text(self._check_id(token_id, "id_to_token"))

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry written as stored, or None."""
        if self._token_to_id is None:
            table: dict[str, int] = {}
            for i, t in enumerate(self._tokens.texts()):
                table.setdefault(t, i)  # a repeated string keeps its first id
            self._token_to_id = table
        return self._token_to_id.get(token)

    def is_special(self, token_id: int) -> bool:
        """True for control/unknown tokens: the ones ``skip_special_tokens`` drops."""
        return int(token_id) in self._special_ids

    def stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
        """A fresh :class:`StreamDecoder` for one generated sequence."""
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        """Number of ids, including added and special tokens."""
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id, or None. Whether encode adds it is :attr:`add_bos`."""
        return self._specials.bos_id

    @property
    def eos_id(self) -> int | None:
        """The single EOS the file declares; stop generation on :attr:`eos_ids` instead."""
        return self._specials.eos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation: EOS, the file's end-of-turn/message ids, and
        control tokens named like an end of turn (``<|im_end|>``, ``<|eot_id|>``,
        ``<|endoftext|>``...). Chat models often end a reply with one of these and not
        with the EOS the file declares."""
        return self._specials.eos_ids

    @property
    def unk_id(self) -> int | None:
        """Id used for unspellable text (SentencePiece without byte tokens), or None."""
        return self._specials.unk_id

    @property
    def pad_id(self) -> int | None:
        """Padding id for batches (masked out, so its value never reaches the model)."""
        return self._specials.pad_id

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(add_special_tokens=True)`` prepends BOS."""
        return self._specials.add_bos

    @property
    def add_eos(self) -> bool:
        """Whether ``encode(add_special_tokens=True)`` appends EOS (rare: some encoders)."""
        return self._specials.add_eos

    @property
    def special_ids(self) -> frozenset[int]:
        """Control/unknown ids: parsed from text only with ``parse_special``, dropped by
        ``skip_special_tokens``."""
        return self._special_ids

    def token_text(self, token_id: int | None) -> str:
        """The text of a special token for templates (``bos_token``), "" for None."""
        if token_id is None:
            return ""
        if self._byte_pieces is not None:
            return self._byte_pieces[self._check_id(token_id, "token_text")].decode("utf-8", errors="replace")
        return self.id_to_token(token_id)

    # ------------------------------------------------------------------ chat

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render ``messages`` with the model's own template, or ChatML (said once on
        stderr) when the file has none. Encode the result with ``parse_special=True``."""
        template = self.chat_template
        if not template:
            _warn_once("chatml", "model file has no chat template; falling back to ChatML")
            template = CHATML_TEMPLATE
        return render_chat(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token_text(self.bos_id),
            eos_token=self.token_text(self.eos_id),
            **extra,
        )


def _parse_merges(raw: Iterable[Any], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """GGUF merges ``"a b"`` -> pairs, dropping any whose parts or result are not in
    the vocabulary (HF's BPE refuses those, and they could never fire anyway)."""
    out: list[tuple[str, str]] = []
    for m in raw:
        left, sep, right = meta_str(m).partition(" ")
        if sep and left in vocab and right in vocab and left + right in vocab:
            out.append((left, right))
    return out


def _read_json(path: Path) -> dict[str, Any]:
    """A sibling config file, or {} when absent/unreadable: they only refine defaults."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# --------------------------------------------------------------------- streaming


class StreamDecoder:
    """Incremental detokenizer for generated ids.

    Byte-level tokens can end in the middle of a UTF-8 character (an emoji is often
    split over several tokens), so bytes are held back until they complete a
    character. Every piece :meth:`feed` returns is whole characters, and
    ``"".join(pieces) + flush()`` equals ``tokenizer.decode(all_ids)`` exactly (same
    U+FFFD replacements for invalid bytes).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        if tokenizer._byte_pieces is None:
            raise Unsupported(
                "StreamDecoder",
                "streaming needs a byte-level or SentencePiece vocabulary (this one decodes as a whole)",
            )
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.reset()

    def reset(self) -> None:
        """Start a new sequence (drops held-back bytes)."""
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending_strip = self._tok._strip_leading_space

    def feed(self, token_id: int) -> str:
        """Add one id; return the text that is now complete (possibly "")."""
        token_id = self._tok._check_id(token_id, "StreamDecoder.feed")
        piece, self._pending_strip = self._tok._piece(token_id, self._skip, self._pending_strip)
        return self._utf8.decode(piece, final=False)

    def flush(self) -> str:
        """End of sequence: return held-back bytes (as U+FFFD if they never completed a
        character) and reset."""
        tail = self._utf8.decode(b"", final=True)
        self.reset()
        return tail


# --------------------------------------------------------------------- chat templates

#: Fallback template for files without one: ChatML, as SmolLM2/Qwen write it.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

