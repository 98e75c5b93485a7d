"""``braze serve``'s arguments: refused in one line before any model loads (exit 2),
and a missing model file is one line too (exit 1)."""

from __future__ import annotations

from typing import Any

import pytest

from braze.cli import build_parser, main
from braze.models import default_embedder_path, default_llm_path
from braze.serve.engine import served_name


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--port", "http"], ["--max-batch", "0"], ["--ctx", "-1"],
                                  ["--queue-limit", "0"], ["--api-key", ""], ["--api-key", "two words"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", *argv])
    assert info.value.code == 2 and argv[0] in capsys.readouterr().err


def test_defaults_are_loopback_and_no_key() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.api_key, args.ctx) == ("127.0.0.1", 8000, None, None)


def test_a_missing_model_is_one_line(capsys: Any, tmp_path: Any) -> None:
    assert main(["serve", "--model", str(tmp_path / "none.gguf"), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("braze: ") and "none.gguf" in err and err.count("\n") == 1


def test_served_names() -> None:
    assert served_name(default_llm_path()) == default_llm_path().stem
    assert served_name(default_embedder_path()) == default_embedder_path().parent.name
