"""The cases issue 19 names, one by one: each must be a typed error naming the file,
the field and the value (or, where the value is merely large, load without cost)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

import braze
from braze.errors import FormatError, InvalidArgument, MissingWeight, OutOfMemory, TemplateError, Unsupported
from braze.io import GGUFFile
from braze.models import ModelNotFound, load_embedder, load_llm
from braze.template import render_chat

from fuzz import corpus as C
from fuzz import targets as T


def _gguf(tmp_path: Path, **changes: Any) -> Path:
    """The tiny model with ``llama.<key>`` values replaced (key dots as ``__``)."""
    entries = list(C.llama_entries())
    for key, value in changes.items():
        full = "llama." + key.replace("__", ".")
        vtype = C.STR if isinstance(value, str) else C.F32 if isinstance(value, float) else \
            (C.ARR if isinstance(value, tuple) else C.U32)
        entries = [e for e in entries if e[0] != full] + [(full, vtype, value)]
    path = tmp_path / "m.gguf"
    path.write_bytes(C.write_gguf(entries, list(C.llama_tensors())))
    return path


@pytest.mark.parametrize("field, value", [
    ("attention__head_count", 0), ("block_count", 0), ("block_count", 3), ("context_length", 2**32 - 1),
    ("attention__layer_norm_rms_epsilon", math.nan), ("rope__freq_base", math.nan), ("rope__freq_base", -1.0),
    ("embedding_length", "576"), ("feed_forward_length", (C.I32, [1, 2])), ("attention__head_count_kv", 3),
    ("embedding_length", 64),
])
def test_hostile_llama_metadata_is_a_format_error(tmp_path: Path, field: str, value: Any) -> None:
    path = _gguf(tmp_path, **{field: value})
    with pytest.raises(FormatError) as info:
        load_llm(path)
    e = info.value
    assert e.file == str(path) and e.field == "llama." + field.replace("__", ".")
    shown = value[1] if isinstance(value, tuple) else value
    assert repr(shown)[:10] in str(e) or (isinstance(shown, float) and math.isnan(shown) and "nan" in str(e))


def test_a_large_context_costs_nothing_until_used(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    loaded = load_llm(_gguf(tmp_path, context_length=2**22))
    assert time.perf_counter() - t0 < 5
    rotary = loaded.model.blocks[0].attn.rotary
    assert rotary.cos.shape[0] <= 256  # grows with the KV caches asked for


def test_an_unknown_architecture_is_refused_before_any_tensor(tmp_path: Path) -> None:
    entries = [e if e[0] != "general.architecture" else (e[0], C.STR, "gpt-j") for e in C.llama_entries()]
    path = tmp_path / "m.gguf"
    path.write_bytes(C.write_gguf(entries, []))  # no tensors at all: never reached
    with pytest.raises(Unsupported, match="gpt-j"):
        load_llm(path)


def test_a_missing_tensor_is_typed(tmp_path: Path) -> None:
    with GGUFFile(_gguf(tmp_path)) as f, pytest.raises(MissingWeight, match="token_embd.weight"):
        f.tensor("token_embd.weigth")


@pytest.mark.parametrize("edits, field", [
    ([("config.json", "whole", [])], "config.json"), ([("config.json", "whole", None)], "config.json"),
    ([("config.json", "set", ("hidden_size", "abc"))], "hidden_size"),
    ([("config.json", "set", ("num_attention_heads", 0))], "num_attention_heads"),
    ([("config.json", "set", ("hidden_act", "bogus"))], "hidden_act"),
    ([("config.json", "set", ("num_hidden_layers", -1))], "num_hidden_layers"),
    ([("config.json", "set", ("layer_norm_eps", float("nan")))], "layer_norm_eps"),
    ([("config.json", "set", ("layer_norm_eps", -1))], "layer_norm_eps"),
    ([("1_Pooling/config.json", "bytes", b"{not json")], "config.json"),
    ([("modules.json", "whole", {"a": 1})], "modules.json"),
    ([("sentence_bert_config.json", "set", ("max_seq_length", -1))], "max_seq_length"),
])
def test_hostile_embedder_configs_are_format_errors(edits: Any, field: str) -> None:
    root = T.embedder_dir(edits)
    with pytest.raises(FormatError) as info:
        load_embedder(root)
    assert info.value.field == field


def test_weights_that_are_a_directory_are_not_a_traceback() -> None:
    with pytest.raises(ModelNotFound):
        load_embedder(T.embedder_dir([("model.safetensors", "directory", None)]))


def test_a_vocabulary_without_unk_still_embeds() -> None:
    assert T.run_embedder([("tokenizer.json", "unk", None)])[0] in ("ok", "typed")


@pytest.mark.parametrize("call", [
    lambda: braze.randn(10**6, 10**6), lambda: braze.zeros(2**62, 2**62), lambda: braze.arange(0, 1e30),
    lambda: braze.randint(0, 5, (2**40,)), lambda: braze.randn(2**20, 1) @ braze.randn(1, 2**20),
])
def test_impossible_sizes_are_out_of_memory(call: Any) -> None:
    with pytest.raises(OutOfMemory):
        call()


def test_randint_is_budgeted() -> None:
    braze.set_memory_limit(1 << 20)
    try:
        with pytest.raises(OutOfMemory):
            braze.randint(0, 5, (1 << 20,))  # 8 MiB
    finally:
        braze.set_memory_limit(None)


@pytest.mark.parametrize("limit", [-1, math.nan, 1.5, "3", True])
def test_nonsense_memory_limits_are_refused(limit: Any) -> None:
    with pytest.raises(InvalidArgument):
        braze.set_memory_limit(limit)
    assert braze.memory_limit() is None


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ ''|center(300000000) }}", "{{ '{:>300000000}'.format('x') }}", "{{ 'x'|indent(300000000) }}",
    "{{ 'x' * 10**9 }}", "{{ 'a'.ljust(10**9) }}", "{{ [1]|slice(10**9)|list|length }}", "{{ lipsum(10**9) }}",
    "{% set ns = namespace(s='x' * 999999) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
])
def test_templates_cannot_spend_unbounded_time_or_memory(template: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(TemplateError):
        render_chat(template, [{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("argv", [["generate", "x", "--model", "@dir"], ["generate", "x", "--model", "@missing"],
                                  ["info", "@dir"], ["info", "@missing"], ["embed", "x", "--model", "@missing"],
                                  ["generate", "x", "--model", "@gguf", "--max-tokens", "9000"],
                                  ["chat", "--model", "@gguf"]])
def test_cli_failures_are_one_line_exit_1(argv: list[str]) -> None:
    outcome, detail = T.run_cli(argv, b"\xff\xfe\n")
    assert outcome == "typed" and "\n" not in detail.strip(), detail


def test_sampling_refuses_nonsense() -> None:
    from braze.generate import Sampling
    for bad in ({"temperature": math.nan}, {"temperature": -1.0}, {"repetition_penalty": 0.0}, {"top_p": 0.0},
                {"top_k": -1}, {"seed": -1}):
        with pytest.raises(InvalidArgument):
            Sampling(**bad)
    json.dumps(Sampling().__dict__)  # the defaults are fine
