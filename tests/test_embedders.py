"""BERT-family embedders beyond MiniLM: tiny models with random weights, written as
sentence-transformers directories (one per pooling mode, activation, position scheme)
and as GGUF ``bert`` files, against the float64 numpy BERT of ``tiny_bert``; and the
real all-MiniLM-L6-v2 converted to GGUF as llama.cpp does, against the transformers
reference its safetensors form already matches.

Tolerances: float32 through two layers of width 16 against float64: 2e-5 per component
(measured ~2e-6). Q8_0 matrices: cosine to the float reference > 0.999.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tiny_bert as tb
from braze.cli import main
from braze.errors import FormatError, MissingWeight, Unsupported
from braze.models import load_embedder
from braze.models.bert_config import BertConfig

ATOL = 2e-5


def _embed(loaded: Any, texts: list[str]) -> tuple[np.ndarray, Any]:
    batch = loaded.tokenizer.encode_batch(texts)
    return loaded.model.embed(batch.ids, batch.attention_mask, batch.type_ids), batch


@pytest.mark.parametrize("pooling,normalize,act", [
    (("mean",), True, "gelu"),
    (("cls",), False, "gelu"),
    (("max",), True, "gelu_new"),
    (("mean_sqrt_len",), False, "relu"),
    (("weightedmean",), True, "gelu"),
    (("lasttoken",), True, "gelu"),
    (("cls", "mean"), False, "gelu"),  # several modes on: concatenated, in sentence-transformers' order
])
def test_directory_embedder_matches_numpy(tmp_path: Path, pooling: tuple[str, ...], normalize: bool, act: str) -> None:
    w = tb.weights(seed=1)
    root = tb.write_dir(tmp_path / "m", w, pooling=pooling, normalize=normalize, act=act)
    loaded = load_embedder(root)
    assert loaded.model.config.pooling == pooling and loaded.model.config.normalize is normalize
    got, batch = _embed(loaded, tb.TEXTS)
    assert batch.ids.shape[1] > int(batch.attention_mask.sum(1).min())  # some rows are padded
    want = tb.reference(w, batch.ids, batch.attention_mask, pooling=pooling, normalize=normalize, act=act)
    assert got.shape == (len(tb.TEXTS), tb.DIM * len(pooling))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    else:
        assert np.abs(np.linalg.norm(got, axis=1) - 1).max() > 1e-2


def test_token_type_ids_are_read(tmp_path: Path) -> None:
    w = tb.weights(seed=2)
    loaded = load_embedder(tb.write_dir(tmp_path / "m", w))
    pair = loaded.tokenizer._hf.encode("the cat", "a dog")  # [CLS] A [SEP] B [SEP]: B's tokens have type 1
    ids, types = np.array([pair.ids]), np.array([pair.type_ids])
    assert types.sum() == 3
    mask = np.ones_like(ids)
    got = loaded.model.embed(ids, mask, types)
    np.testing.assert_allclose(got, tb.reference(w, ids, mask, types), atol=ATOL, rtol=0)
    assert np.abs(got - loaded.model.embed(ids, mask, None)).max() > 1e-3


def test_roberta_positions_start_past_the_padding_index(tmp_path: Path) -> None:
    w = tb.weights(seed=3, types=1)
    loaded = load_embedder(tb.write_dir(tmp_path / "m", w, model_type="roberta", prefix="roberta."))
    c = loaded.model.config
    assert (c.position_offset, c.max_length) == (1, tb.POSITIONS - 1)  # pad_token_id 0 in tiny configs
    got, batch = _embed(loaded, tb.TEXTS)
    np.testing.assert_allclose(got, tb.reference(w, batch.ids, batch.attention_mask, offset=1), atol=ATOL, rtol=0)


def test_max_length_from_sentence_bert_config(tmp_path: Path) -> None:
    w = tb.weights(seed=4)
    loaded = load_embedder(tb.write_dir(tmp_path / "m", w, max_seq_length=5))
    assert loaded.model.config.max_length == 5
    got, batch = _embed(loaded, ["the big cat sat on the mat and the dog ran"])
    assert batch.ids.shape == (1, 5) and batch.ids[0, -1] == 3  # truncated, [SEP] kept
    np.testing.assert_allclose(got, tb.reference(w, batch.ids, batch.attention_mask), atol=ATOL, rtol=0)


def test_max_length_defaults_to_the_position_table(tmp_path: Path) -> None:
    loaded = load_embedder(tb.write_dir(tmp_path / "m", tb.weights()))
    assert loaded.model.config.max_length == tb.POSITIONS == loaded.tokenizer.max_length


def test_unknown_activation_is_a_format_error(tmp_path: Path) -> None:
    root = tb.write_dir(tmp_path / "m", tb.weights(), act="mish_v9")
    with pytest.raises(FormatError, match=r"config\.json.*hidden_act.*mish_v9"):
        load_embedder(root)


def test_relative_positions_are_refused(tmp_path: Path) -> None:
    root = tb.write_dir(tmp_path / "m", tb.weights())
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**cfg, "position_embedding_type": "relative_key"}))
    with pytest.raises(Unsupported, match="position_embedding_type 'relative_key'"):
        load_embedder(root)


def test_unknown_module_is_refused_before_loading(tmp_path: Path) -> None:
    st = "sentence_transformers.models."
    modules = [{"path": "", "type": st + "Transformer"}, {"path": "1_Pooling", "type": st + "Pooling"},
               {"path": "2_Dense", "type": st + "Dense"}]
    root = tb.write_dir(tmp_path / "m", tb.weights(), modules=modules)
    with pytest.raises(Unsupported, match=r"modules\.json.*Dense"):
        load_embedder(root)


def test_no_pooling_mode_on_is_a_format_error(tmp_path: Path) -> None:
    root = tb.write_dir(tmp_path / "m", tb.weights(), pooling=())
    with pytest.raises(FormatError, match="pooling_mode"):
        BertConfig.from_dir(root)


# ---------------------------------------------------------------------------- GGUF

def _gguf(tmp_path: Path, w: dict[str, np.ndarray], **kw: Any) -> Path:
    return tb.write_gguf(tmp_path / "tiny-bert.gguf", w, tb.VOCAB, dims=(tb.DIM, tb.LAYERS, tb.HEADS, tb.HIDDEN), **kw)


@pytest.mark.parametrize("pooling_type,mode", [(1, "mean"), (2, "cls"), (3, "lasttoken"), (None, "mean")])
def test_gguf_bert_matches_numpy(tmp_path: Path, pooling_type: int | None, mode: str) -> None:
    w = tb.weights(seed=5)
    loaded = load_embedder(_gguf(tmp_path, w, pooling_type=pooling_type))
    c = loaded.model.config
    assert (c.pooling, c.normalize, c.max_length, c.type_vocab_size) == ((mode,), True, tb.POSITIONS, 2)
    got, batch = _embed(loaded, tb.TEXTS)
    hf = tb.hf_tokenizer()
    for row, mask, text in zip(batch.ids, batch.attention_mask, tb.TEXTS):
        assert row[mask == 1].tolist() == hf.encode(text).ids  # WordPiece rebuilt from the phantom-space vocab
    np.testing.assert_allclose(got, tb.reference(w, batch.ids, batch.attention_mask, pooling=(mode,)), atol=ATOL, rtol=0)


def test_gguf_bert_tokenizer_pairs_and_decode(tmp_path: Path) -> None:
    tok = load_embedder(_gguf(tmp_path, tb.weights())).tokenizer
    hf = tb.hf_tokenizer()
    for text in ["UNHAPPY dogs, the END!", "zebra", "hello world !"]:
        assert tok.encode(text) == hf.encode(text).ids
    pair = tok._hf.encode("the cat", "a dog")
    assert pair.type_ids == hf.encode("the cat", "a dog").type_ids and sum(pair.type_ids) == 3
    assert tok.decode(tok.encode("unhappy cats"), skip_special_tokens=True) == "unhappy cats"


def test_gguf_bert_q8_0_matrices(tmp_path: Path) -> None:
    import gguf
    w = tb.weights(seed=6)
    loaded = load_embedder(_gguf(tmp_path, w, quant=gguf.GGMLQuantizationType.Q8_0))
    assert loaded.model.layers[0].down.weight.dtype.name == "q8_0"  # the only matrix with whole blocks
    got, batch = _embed(loaded, tb.TEXTS)
    want = tb.reference(w, batch.ids, batch.attention_mask)
    assert (got * want).sum(1).min() > 0.999


@pytest.mark.parametrize("pooling_type,what", [(0, "none"), (4, "rank")])
def test_gguf_bert_without_sentence_pooling_is_refused(tmp_path: Path, pooling_type: int, what: str) -> None:
    with pytest.raises(Unsupported, match=f"pooling_type {pooling_type} is {what}"):
        load_embedder(_gguf(tmp_path, tb.weights(), pooling_type=pooling_type))


def test_llama_gguf_is_not_an_embedder() -> None:
    from braze.models import default_llm_path
    with pytest.raises(Unsupported, match="architecture 'llama' is not 'bert'"):
        load_embedder(default_llm_path())


def test_gguf_bert_missing_tensor_names_the_file(tmp_path: Path) -> None:
    w = tb.weights()
    del w["encoder.layer.1.output.dense.bias"]
    with pytest.raises(MissingWeight, match="blk.1.ffn_down.bias"):
        load_embedder(_gguf(tmp_path, w))


# ------------------------------------------------------- the real MiniLM as GGUF

@pytest.fixture(scope="module")
def minilm_gguf(tmp_path_factory: Any) -> Path:
    """all-MiniLM-L6-v2 converted as llama.cpp's convert_hf_to_gguf.py does (float32)."""
    from safetensors.numpy import load_file

    from braze.models import default_embedder_path
    root = default_embedder_path()
    vocab = (root / "vocab.txt").read_text(encoding="utf-8").splitlines()
    w = {k.removeprefix("bert."): v for k, v in load_file(str(root / "model.safetensors")).items()
         if not k.startswith("pooler.") and "position_ids" not in k}
    return tb.write_gguf(tmp_path_factory.mktemp("gguf") / "minilm.gguf", w, vocab, dims=(384, 6, 12, 1536), eps=1e-12)


def test_minilm_gguf_matches_transformers(minilm_gguf: Path, minilm_reference: dict[str, Any]) -> None:
    loaded = load_embedder(minilm_gguf)
    sentences = minilm_reference["sentences"]
    got, batch = _embed(loaded, [s["text"] for s in sentences])
    for row, s in zip(batch.ids, sentences):
        assert row[: len(s["input_ids"])].tolist() == s["input_ids"]
    np.testing.assert_allclose(got, np.asarray([s["embedding"] for s in sentences]), atol=1e-4, rtol=0)


def test_embed_cli_with_a_gguf_bert(minilm_gguf: Path, capsys: Any) -> None:
    assert main(["embed", "--model", str(minilm_gguf), "A man is eating food.", "A man is eating a piece of bread.",
                 "--similarity"]) == 0
    assert "0.755" in capsys.readouterr().out
