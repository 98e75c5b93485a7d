"""The braze command, run in-process (and once in a fresh process, for what it imports)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from braze.cli import main
from braze.models import default_llm_path


@pytest.mark.slow
def test_generate_prints_paris(capsys: Any) -> None:
    import gc
    try:
        assert main(["generate", "The capital of France is", "--max-tokens", "4", "--stats"]) == 0
        assert gc.get_freeze_count() > 0  # the loaded model, out of the collector's full passes
    finally:
        gc.unfreeze()
    out, err = capsys.readouterr()
    assert out.startswith(" Paris")
    assert "tok/s" in err and "load" in err and "peak" in err


def test_embed_similarity(capsys: Any) -> None:
    assert main(["embed", "A man is eating food.", "A man is eating a piece of bread.", "--similarity"]) == 0
    out = capsys.readouterr().out
    assert "0.755" in out


def test_info_lists_metadata_tensors_and_quant_types(capsys: Any) -> None:
    assert main(["info", str(default_llm_path())]) == 0
    out = capsys.readouterr().out
    assert "llama.block_count = 30" in out
    assert "blk.0.attn_q.weight" in out and "Q4_1" in out and "Q8_0" in out
    assert "braze.q4_1" in out and "nothing is dequantized at load" in out


def test_missing_model_is_a_clear_error(capsys: Any, tmp_path: Any) -> None:
    assert main(["generate", "hi", "--model", str(tmp_path / "nope.gguf")]) == 1
    assert "no such model file" in capsys.readouterr().err


def test_corrupt_model_is_a_format_error(capsys: Any, tmp_path: Any) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    assert main(["generate", "hi", "--model", str(bad)]) == 1
    assert "bad.gguf" in capsys.readouterr().err


def test_chat_reads_stdin(monkeypatch: Any, capsys: Any) -> None:
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n"))
    assert main(["chat", "--max-tokens", "12"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_generate_on_a_quantized_file_leaves_ml_dtypes_unimported() -> None:
    """bfloat16's numpy type (ml_dtypes: ~8 MiB of a process, a twelfth of what braze
    generate holds besides its file) loads only when bfloat16 is used; the default Q4_1
    file has none. A fresh process, as ``braze generate`` is one."""
    code = ("import sys\nfrom braze.cli import main\n"
            "try:\n    main(['generate', 'The capital of France is', '--max-tokens', '2'])\n"
            "except SystemExit:\n    pass\n"
            "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes was imported'\n"
            "import braze\nassert braze.bfloat16.itemsize == 2 and 'ml_dtypes' not in sys.modules\n"
            "assert braze.bfloat16.np.name == 'bfloat16' and 'ml_dtypes' in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
