"""Run one fuzz case and say what became of it: ``ok`` (it worked), ``typed`` (a
braze error naming what was wrong; for the CLI, exit 2 from argparse or exit 1 with
one line), ``untyped`` (any other exception, or a CLI traceback), ``hang`` (past
``HANG_SECONDS``) or ``overalloc`` (braze's peak tensor memory past twice the file's
size plus the KV cache). ``crash`` is the campaign's: the process died."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from braze.errors import BrazeError
from braze.stats import COUNTERS

from . import corpus as C

HANG_SECONDS = 10


def hang_seconds() -> int:
    """10 s on the reference executor (the campaign's); with fusion a new shape of the
    model compiles kernels first, which a busy 2-core machine can take longer for."""
    from braze.stream import fusion_enabled
    return HANG_SECONDS if not fusion_enabled() else 6 * HANG_SECONDS
OUTCOMES = ("ok", "typed", "untyped", "hang", "crash", "overalloc")


class Hang(BaseException):
    """Not an Exception: code under test that catches Exception (the CLI's last
    word) must not turn a hang into a one-line error."""


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        signal.alarm(1)  # again in a second, in case this one lands in a gc callback and is swallowed
        raise Hang(f"over {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def classify(run: Callable[[], Any], budget_bytes: int | None = None) -> tuple[str, str]:
    """(outcome, detail) of ``run()``."""
    COUNTERS["peak_bytes"] = COUNTERS["live_bytes"]
    start = COUNTERS["live_bytes"]
    try:
        with _deadline(hang_seconds()):
            run()
    except Hang as e:
        return "hang", str(e)
    except BrazeError as e:
        return "typed", f"{type(e).__name__}: {e}"[:300]
    except Exception as e:  # noqa: BLE001 - what the fuzzer is looking for
        return "untyped", "".join(traceback.format_exception(e))[-1500:]
    if budget_bytes is not None and COUNTERS["peak_bytes"] - start > budget_bytes:
        return "overalloc", f"peak {COUNTERS['peak_bytes'] - start} bytes > {budget_bytes}"
    return "ok", ""


def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="braze-fuzz-"))


def _kv_bytes(model: Any, positions: int) -> int:
    c = model.config
    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * positions * 4


def _open_and_touch(data: bytes, suffix: str, opener: Callable[[Path], Any]) -> tuple[str, str]:
    """Write a damaged file, open it and touch every tensor it hands out."""
    from braze.quant import BlockTensor
    d = _scratch()
    path = d / f"m{suffix}"
    path.write_bytes(data)

    def run() -> None:
        with opener(path) as f:
            for name in f.tensors:
                t = f.tensor(name)
                if not isinstance(t, BlockTensor):
                    t.sum()
    try:
        return classify(run, 2 * len(data))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_gguf_bytes(data: bytes) -> tuple[str, str]:
    from braze.io import GGUFFile
    return _open_and_touch(data, ".gguf", GGUFFile)


def run_gguf_metadata(entries: list[C.Entry]) -> tuple[str, str]:
    """Load the model a metadata variant describes and generate two tokens from a chat prompt."""
    from braze.generate import Sampling, generate_text
    from braze.models import load_llm
    d = _scratch()
    path = d / "m.gguf"
    try:
        data = C.write_gguf(entries, list(C.llama_tensors()))
    except (struct.error, OverflowError, UnicodeEncodeError, ValueError):
        shutil.rmtree(d, ignore_errors=True)
        return "ok", "not writable as GGUF"
    path.write_bytes(data)
    budget = [2 * len(data)]

    def run() -> None:
        loaded = load_llm(path)
        budget[0] += _kv_bytes(loaded.model, 64)
        "".join(generate_text(loaded.model, loaded.tokenizer, "Hi", 2, Sampling(), chat=True))
        loaded.file.close()
    try:
        outcome = classify(run)
        if outcome[0] == "ok" and COUNTERS["peak_bytes"] > budget[0] + COUNTERS["live_bytes"]:
            base = {k: repr((t, v)) for k, t, v in C.llama_entries()}
            changed = sorted({k for k, t, v in entries if base.get(k) != repr((t, v))} | (base.keys() - {
                k for k, _, _ in entries}))
            return "overalloc", f"peak {COUNTERS['peak_bytes']} > {budget[0]}; changed: {changed}"
        return outcome
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_safetensors(data: bytes) -> tuple[str, str]:
    from braze.io import SafetensorsFile
    return _open_and_touch(data, ".safetensors", SafetensorsFile)


def _edit(root: Path, file: str, op: str, arg: Any) -> None:
    path = root / file
    if op in ("delete", "directory"):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if op == "directory":
            path.mkdir(parents=True, exist_ok=True)
        return
    if path.is_symlink() or not path.is_file():
        target = (C.embedder_base() / file)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(target, path)
    if op == "bytes":
        path.write_bytes(arg)
        return
    try:
        doc = json.loads(path.read_bytes())
    except ValueError:  # an earlier edit left no JSON: edit the base's instead
        doc = json.loads((C.embedder_base() / file).read_bytes())
    if op == "whole":
        doc = arg
    elif op == "unk":
        model = doc.get("model") if isinstance(doc, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, dict):
            vocab.pop("[UNK]", None)
    elif op == "set":
        key, value = arg
        if isinstance(doc, list) and isinstance(key, int):
            if key < len(doc):
                doc[key] = value
        elif isinstance(doc, dict):
            doc[key] = value
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8", errors="surrogatepass")


def embedder_dir(edits: list[tuple[str, str, Any]]) -> Path:
    """A copy of the base directory (its two large files as links) with ``edits`` made."""
    base = C.embedder_base()
    root = _scratch()
    for name in (*C.EMBEDDER_JSON, "model.safetensors"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if name in ("tokenizer.json", "model.safetensors"):
            (root / name).symlink_to(base / name)
        else:
            shutil.copy(base / name, root / name)
    for file, op, arg in edits:
        _edit(root, file, op, arg)
    return root


def run_embedder(edits: list[tuple[str, str, Any]]) -> tuple[str, str]:
    from braze.models import load_embedder
    root = embedder_dir(edits)

    def run() -> None:
        loaded = load_embedder(root)
        batch = loaded.tokenizer.encode_batch(["a first sentence", "another one, longer than the first"])
        loaded.model.embed(batch.ids, batch.attention_mask, batch.type_ids)
    try:
        return classify(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)


_paths: dict[str, str] = {}


def _cli_paths() -> dict[str, str]:
    if not _paths:
        d = Path(tempfile.mkdtemp(prefix="braze-fuzz-cli-"))
        (d / "tiny.gguf").write_bytes(C.llama_bytes())
        (d / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 8)
        (d / "bad.txt").write_bytes(b"\xff\xfe bad \xc3")
        _paths.update({"@gguf": str(d / "tiny.gguf"), "@dir": str(d), "@missing": str(d / "missing.gguf"),
                       "@text": str(d / "text.txt"), "@badtext": str(d / "bad.txt"),
                       "@embedder": str(C.embedder_base())})
    return _paths


def run_cli(argv: list[str], stdin: bytes) -> tuple[str, str]:
    """``braze.cli.main(argv)`` in this process: exit 2 (argparse) or 1 with one line
    and no traceback is typed, 0 is ok; an escaping exception or a traceback is untyped."""
    from braze import cli
    paths = _cli_paths()
    argv = [paths.get(a, a) for a in argv]
    err, out = io.StringIO(), io.StringIO()
    code: Any = None

    def run() -> None:
        nonlocal code
        old_in = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = cli.main(argv)
        except SystemExit as e:
            code = e.code
        finally:
            sys.stdin = old_in
    outcome, detail = classify(run)
    if outcome != "ok":
        return outcome, detail
    text = err.getvalue()
    if "Traceback" in text or (code == 1 and len([ln for ln in text.splitlines() if ln.startswith("braze:")]) != 1):
        return "untyped", f"exit {code}: {text[-800:]}"
    if code == 2:
        return "typed", text.strip().splitlines()[-1][:200]
    if code == 1:
        return "typed", text.strip()[:200]
    return ("ok", "") if code in (0, 130) else ("untyped", f"exit {code}: {text[-300:]}")


def run_template(template: str) -> tuple[str, str]:
    from braze.template import render_chat
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    return classify(lambda: render_chat(template, msgs, bos_token="<s>", eos_token="</s>"))
