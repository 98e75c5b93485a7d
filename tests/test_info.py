"""``braze info``: architecture, parameters, tensor-type mix, context, chat template and
whether braze runs the model, on tiny GGUF files of several architectures and on
embedder directories; from headers and metadata only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tiny_bert as tb
from braze.cli import main
from braze.info import describe, summary_lines
from braze.io.gguf import GGUFFile

TEMPLATE = "{% for m in messages %}\n{{ m['content'] }}\n{% endfor %}"


def _llm_gguf(path: Path, arch: str, *, tokenizer: str | None = "gpt2", template: str | None = None) -> Path:
    """Metadata of a small decoder and three tensors: F32, F16 and Q8_0."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_block_count(1)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if tokenizer is not None:
        w.add_tokenizer_model(tokenizer)
        w.add_token_list([f"t{i}" for i in range(48)])
    if template is not None:
        w.add_chat_template(template)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((48, 64)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float16))
    q = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(rng.standard_normal((96, 64)).astype(np.float32), q),
                 raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def no_tensor_reads(monkeypatch: Any) -> None:
    """Any read of tensor data fails the test."""
    def refuse(self: Any, name: str) -> Any:
        raise AssertionError(f"braze info read tensor data ({name})")
    for method in ("raw", "tensor", "dequantize"):
        monkeypatch.setattr(GGUFFile, method, refuse)


def test_llama_gguf_summary(tmp_path: Path, no_tensor_reads: None) -> None:
    info = describe(_llm_gguf(tmp_path / "tiny.gguf", "llama", template=TEMPLATE))
    assert (info.format, info.architecture, info.context_length) == ("GGUF v3", "llama", 128)
    assert info.parameters == 48 * 64 + 64 * 64 + 96 * 64
    # Q8_0: 34 bytes per block of 32
    assert list(info.quant_mix) == ["F32", "F16", "Q8_0"]  # largest first
    assert info.quant_mix == {"Q8_0": (1, 96 * 2 * 34), "F16": (1, 64 * 64 * 2), "F32": (1, 48 * 64 * 4)}
    assert info.runnable and "braze generate" in info.verdict and "1 layers, 4 heads, 2 KV heads" in info.verdict
    lines = "\n".join(summary_lines(info))
    assert "chat template:  present, first line: '{% for m in messages %}'" in lines
    assert "F32: 1 tensor, 12.0 KiB; F16: 1 tensor, 8.0 KiB; Q8_0: 1 tensor, 6.4 KiB" in lines
    assert "parameters:     13.31K (13,312)" in lines


def test_unknown_architecture_says_why(tmp_path: Path, no_tensor_reads: None) -> None:
    info = describe(_llm_gguf(tmp_path / "t5.gguf", "t5"))
    assert info.architecture == "t5" and info.chat_template is None and info.context_length == 128
    assert not info.runnable and "architecture 't5'" in info.verdict and info.verdict.startswith("no: ")
    assert "  chat template:  none" in summary_lines(info)


def test_unsupported_tokenizer_says_why(tmp_path: Path) -> None:
    info = describe(_llm_gguf(tmp_path / "rwkv-tok.gguf", "llama", tokenizer="rwkv"))
    assert not info.runnable and "tokenizer model 'rwkv'" in info.verdict
    info = describe(_llm_gguf(tmp_path / "no-tok.gguf", "llama", tokenizer=None))
    assert not info.runnable and "no tokenizer" in info.verdict


def test_bert_gguf_summary(tmp_path: Path, no_tensor_reads: None) -> None:
    w = tb.weights()
    path = tb.write_gguf(tmp_path / "bert.gguf", w, tb.VOCAB, dims=(tb.DIM, tb.LAYERS, tb.HEADS, tb.HIDDEN),
                         pooling_type=2)
    info = describe(path)
    assert (info.architecture, info.context_length, info.parameters) == ("bert", tb.POSITIONS,
                                                                        sum(v.size for v in w.values()))
    assert info.quant_mix == {"F32": (len(w), 4 * sum(v.size for v in w.values()))}
    assert info.runnable and "braze embed (cls pooling, normalized, 16-d vectors, up to 40 tokens)" in info.verdict


def test_bert_gguf_with_rank_pooling_is_not_runnable(tmp_path: Path) -> None:
    path = tb.write_gguf(tmp_path / "rerank.gguf", tb.weights(), tb.VOCAB, dims=(tb.DIM, tb.LAYERS, tb.HEADS, tb.HIDDEN),
                         pooling_type=4)
    info = describe(path)
    assert not info.runnable and "pooling_type 4 is rank" in info.verdict


def test_embedder_directory_summary(tmp_path: Path) -> None:
    w = tb.weights()
    info = describe(tb.write_dir(tmp_path / "m", w, pooling=("cls", "max"), normalize=False, max_seq_length=24))
    assert (info.format, info.architecture, info.context_length) == ("safetensors directory", "bert", 24)
    assert info.parameters == sum(v.size for v in w.values())
    assert info.runnable and "cls+max pooling, not normalized, 32-d vectors, up to 24 tokens" in info.verdict


def test_directory_braze_cannot_run_says_why(tmp_path: Path) -> None:
    info = describe(tb.write_dir(tmp_path / "m", tb.weights(), act="mish_v9"))
    assert not info.runnable and "hidden_act" in info.verdict and "mish_v9" in info.verdict
    llm = tmp_path / "llm"
    llm.mkdir()
    (llm / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    info = describe(llm)
    assert info.architecture == "llama" and not info.runnable and "not a BERT-family encoder" in info.verdict
    assert "language models from GGUF" in info.verdict


def test_cli_info_prints_the_summary_first(tmp_path: Path, capsys: Any) -> None:
    path = _llm_gguf(tmp_path / "tiny.gguf", "llama", template=TEMPLATE)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.index("architecture:   llama") < out.index("metadata:") < out.index("blk.0.ffn_up.weight")
    assert "runs in braze:  yes" in out


def test_cli_info_missing_file(tmp_path: Path, capsys: Any) -> None:
    assert main(["info", str(tmp_path / "nope.gguf")]) == 1
    assert "no such model file" in capsys.readouterr().err
