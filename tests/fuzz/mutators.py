"""Hypothesis strategies that mutate the bases of ``corpus.py`` into hostile inputs:
GGUF files (bytes, and metadata values of valid structure), safetensors headers,
embedder directories, CLI argument lists and chat templates. Each strategy draws a
*case*: plain data that ``targets.py`` turns into files and runs."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from hypothesis import strategies as st

from . import corpus as C

INTS = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 5, 7, 64, 2**16, 2**22, 2**31 - 1, 2**32 - 1, 2**32, 2**63 - 1, -2**63, 10**9]),
    st.integers(-2**64, 2**64), st.integers(-3, 300))
FLOATS = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-45, 1e-30, 0.5, 1.0, 1e30,
                                    1e308, 3.4e38, 10000.0]), st.floats(allow_nan=True, allow_infinity=True))
TEXTS = st.one_of(st.sampled_from(["", "none", "linear", "yarn", "llama", "qwen2", "gpt2", "llama\x00", "bogus",
                                   "gelu", "[UNK]", "\udcff"]), st.text(max_size=12))
VALUES = st.one_of(INTS, FLOATS, TEXTS, st.booleans(), st.none(), st.lists(st.integers(-5, 5), max_size=4),
                   st.lists(st.text(max_size=4), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))

# -- GGUF --------------------------------------------------------------------------------

EXTRA_KEYS = ["llama.rope.scaling.type", "llama.rope.scaling.factor", "general.alignment", "llama.rope.freq_base",
              "llama.attention.layer_norm_rms_epsilon", "llama.attention.head_count_kv", "llama.rope.dimension_count",
              "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.pre",
              "tokenizer.ggml.scores", "tokenizer.chat_template", "tokenizer.ggml.eot_token_id"]


def _typed(value: Any, draw: Any) -> tuple[int, Any] | None:
    """A GGUF (type, value) for a Python value; None for what GGUF cannot hold."""
    if isinstance(value, bool):
        return C.BOOL, value
    if isinstance(value, int):
        return draw(st.sampled_from([C.U8, C.I8, C.U16, C.I16, C.U32, C.I32, C.U64, C.I64])), value
    if isinstance(value, float):
        return draw(st.sampled_from([C.F32, C.F64])), value
    if isinstance(value, str):
        return C.STR, value
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return C.ARR, (C.STR, value)
        return C.ARR, (draw(st.sampled_from([C.I32, C.U64, C.I8])), value)
    return None


@st.composite
def gguf_metadata(draw: Any) -> list[C.Entry]:
    """The base's metadata with 1-3 entries replaced by hostile values, deleted, or added."""
    entries = list(C.llama_entries())
    keys = [k for k, _, _ in entries]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "set", "delete", "add", "tokens"]))
        if op == "delete":
            entries = [e for e in entries if e[0] != draw(st.sampled_from(keys))]
        elif op == "tokens":  # the vocabulary: cut, or its type array changed
            cut = draw(st.integers(0, C.N_TOKENS + 5))
            entries = [(k, t, (v[0], v[1][:cut]) if t == C.ARR and k in ("tokenizer.ggml.tokens",
                        "tokenizer.ggml.token_type") and draw(st.booleans()) else v) for k, t, v in entries]
        else:
            key = draw(st.sampled_from(keys if op == "set" else EXTRA_KEYS))
            typed = _typed(draw(VALUES), draw)
            if typed is not None:
                entries = [e for e in entries if e[0] != key] + [(key, *typed)]
    return entries


@st.composite
def gguf_bytes(draw: Any) -> bytes:
    """The base file's bytes with its structure damaged: flips, huge counts and
    lengths, truncation, insertions (mostly in the header, where structure lives)."""
    data = bytearray(C.llama_bytes())
    header = len(data) - sum(-(-a.nbytes // 32) * 32 for _, a in C.llama_tensors())
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "flip", "u64", "u32", "truncate", "insert"]))
        if not data:
            break
        at = draw(st.integers(0, max(0, min(header, len(data)) - 1)))
        if op == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif op == "u64":
            data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from([0, 2**63, 2**64 - 1, 2**32, 1 << 40,
                                                                      len(data), 7])))
        elif op == "u32":
            data[at:at + 4] = struct.pack("<I", draw(st.sampled_from([0, 2**32 - 1, 9, 12, 13, 31, 4, 2**31])))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))):]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


# -- safetensors -------------------------------------------------------------------------

ST_BASE = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
           "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
           "c": {"dtype": "I64", "shape": [2], "data_offsets": [32, 48]},
           "__metadata__": {"format": "pt"}}


@st.composite
def safetensors_bytes(draw: Any) -> bytes:
    header: dict[str, Any] = json.loads(json.dumps(ST_BASE))
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["a", "b", "c", "__metadata__", "new"]))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
        value = draw(st.one_of(VALUES, st.lists(INTS, max_size=5), st.sampled_from(
            ["F32", "BF16", "F8_E4M3", "U64", "BOOL", "Q4", "f32"])))
        if field is None or not isinstance(header.get(name), dict):
            header[name] = value
        else:
            header[name][field] = value
    try:
        text = json.dumps(header).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        text = b"{}"
    data = bytearray(struct.pack("<Q", len(text)) + text + bytes(range(48)))
    op = draw(st.sampled_from(["none", "none", "length", "flip", "truncate"]))
    if op == "length":
        data[:8] = struct.pack("<Q", draw(st.sampled_from([0, 1, 2**63, 2**64 - 1, len(text) + 1, len(text) - 1])))
    elif op == "flip":
        data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif op == "truncate":
        del data[draw(st.integers(0, len(data))):]
    return bytes(data)


# -- embedder directories ----------------------------------------------------------------

EMBEDDER_KEYS = {
    "config.json": ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "model_type",
                    "architectures"],
    "1_Pooling/config.json": ["pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_tokens",
                              "word_embedding_dimension"],
    "modules.json": [0, 1, 2],
    "sentence_bert_config.json": ["max_seq_length", "do_lower_case"],
    "tokenizer_config.json": ["model_max_length", "unk_token", "pad_token", "cls_token", "chat_template"],
    "tokenizer.json": ["model", "added_tokens", "padding", "truncation", "decoder", "post_processor"],
}


@st.composite
def embedder_edits(draw: Any) -> list[tuple[str, str, Any]]:
    """Edits to the base directory: (file, op, argument), op one of set (a key to a
    hostile value), whole (the file's JSON replaced), bytes, delete, directory, unk
    (tokenizer.json's vocabulary without [UNK]), weights (model.safetensors damaged)."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        file = draw(st.sampled_from(sorted(EMBEDDER_KEYS) + ["model.safetensors"]))
        if file == "model.safetensors":
            edits.append((file, draw(st.sampled_from(["delete", "directory", "bytes"])),
                          draw(st.binary(max_size=64))))
            continue
        op = draw(st.sampled_from(["set", "set", "set", "whole", "bytes", "delete", "directory", "unk"]))
        if op == "set":
            edits.append((file, op, (draw(st.sampled_from(EMBEDDER_KEYS[file])), draw(VALUES))))
        elif op == "whole":
            edits.append((file, op, draw(VALUES)))
        elif op == "bytes":
            edits.append((file, op, draw(st.one_of(st.binary(max_size=32), st.just(b"\xff\xfe{")))))
        else:
            edits.append((file if op != "unk" else "tokenizer.json", op, None))
    return edits


# -- CLI ---------------------------------------------------------------------------------

SURROGATE = "\udcff\udcfe"  # what undecodable argv bytes become in Python
ARG_VALUES = st.one_of(st.sampled_from(["nan", "-nan", "inf", "-1", "0", "-5", "-100", "1e309", "abc", "", "1.5",
                                        "99999999999999999999", SURROGATE, "0x10", " 3"]), st.integers(-3, 4).map(str),
                       st.floats(allow_nan=True).map(repr))
OPTIONS = {"generate": ["--max-tokens", "--temperature", "--top-k", "--top-p", "--repeat-penalty", "--seed", "--stop"],
           "chat": ["--max-tokens", "--temperature", "--top-k", "--top-p", "--repeat-penalty", "--seed", "--system"],
           "embed": [], "perplexity": ["--ctx", "--stride", "--batch-tokens", "--chunks"], "info": []}


@st.composite
def cli_case(draw: Any) -> tuple[list[str], bytes]:
    """(argv, stdin bytes); paths are placeholders ``@gguf``, ``@dir``, ``@missing``,
    ``@text``, ``@badtext``, ``@embedder`` that ``targets.py`` resolves."""
    cmd = draw(st.sampled_from(sorted(OPTIONS)))
    path = st.sampled_from(["@gguf", "@gguf", "@dir", "@missing", "@text", "@embedder", "@badtext"])
    argv = [cmd]
    if cmd == "generate":
        argv.append(draw(st.sampled_from(["Hello", SURROGATE, "", "x" * 50])))
    elif cmd == "embed":
        argv += draw(st.lists(st.sampled_from(["a sentence", SURROGATE, ""]), min_size=1, max_size=2))
    elif cmd in ("perplexity", "info"):
        argv.append(draw(path))
    if cmd != "info" and draw(st.booleans()):
        argv += ["--model", draw(path if cmd != "embed" else st.sampled_from(["@embedder", "@dir", "@missing",
                                                                               "@gguf"]))]
    elif cmd in ("generate", "chat", "perplexity"):
        argv += ["--model", "@gguf"]  # the tiny model: a valid case stays fast
    for _ in range(draw(st.integers(0, 3))):
        if OPTIONS[cmd]:
            argv += [draw(st.sampled_from(OPTIONS[cmd])), draw(ARG_VALUES)]
    if cmd in ("generate", "chat") and "--max-tokens" not in argv:
        argv += ["--max-tokens", "2"]
    if cmd == "perplexity" and "--chunks" not in argv:
        argv += ["--chunks", "1", "--ctx", "16"]
    stdin = draw(st.sampled_from([b"hello\n", b"\xff\xfe\n", b"", b"/exit\n", b"hi\nthere\n"]))
    return argv, stdin


# -- chat templates ----------------------------------------------------------------------

N = st.sampled_from(["10", "100000", "300000000", "10**9", "-1", "2**62", "(10**6)"])
FRAGMENTS = [
    "{{ messages[0]['content'] }}", "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}",
    "{{ 'x' * N }}", "{{ ''|center(N) }}", "{{ 'a'|indent(N) }}", "{{ '%Ns'|format('x') }}", "{{ '%Ns' % 'x' }}",
    "{{ '{:>N}'.format(1) }}", "{% for i in range(N) %}{% for j in range(N) %}{% endfor %}{% endfor %}",
    "{{ x.__class__.__mro__ }}", "{{ ().__class__.__base__.__subclasses__() }}", "{{ messages.append(1) }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "{{ raise_exception('no') }}", "{{ 9 ** N }}",
    "{{ 'a'.ljust(N) }}", "{{ [1] * N }}", "{{ range(N)|list|length }}", "{{ messages|tojson(indent=N) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{{ 'ab'.replace('a', 'a' * 999999) }}", "{{ ['x' * 999999] * 100 | join('y') }}", "{{ lipsum(N) }}",
    "{{ 'x'|wordwrap(N) }}", "{{ [1]|slice(N)|list|length }}", "{{ 'abc'|truncate(N) }}", "{{ bos_token ~ eos_token }}",
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}", "{{ strftime_now('%Y') }}", "{%", "{{ }}",
    "{{ cycler(1,2).next() }}", "{{ dict(a=1)|dictsort }}", "{{ '%.Nf'|format(1.5) }}", "{{ (1,2)|sum(start=N) }}",
    "{{ self.__init__ }}", "{{ joiner(N)() }}", "{{ 'x'|filesizeformat }}", "{{ messages|map(attribute='nope')|list }}",
]


@st.composite
def template_case(draw: Any) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 9)) == 0:
            parts.append(draw(st.text(alphabet="{}%#-+ab()'\"|~*.", max_size=20)))
        else:
            parts.append(draw(st.sampled_from(FRAGMENTS)).replace("N", draw(N)))
    return "".join(parts)
