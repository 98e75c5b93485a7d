"""Text generation: prefill, then one token at a time into a preallocated KV cache.

The cache is allocated once per generation for every position it can reach (the prompt
plus ``max_tokens``, at most the model's context length) and written in place; a
generation never reallocates it. Allocating the full context up front, as llama.cpp
does, would cost SmolLM2 377 MB of float32 for an 8k context it rarely fills.

Sampling runs on the host over the last position's logits (one vocabulary-sized
vector per step, as llama.cpp does): repetition penalty, temperature, top-k, top-p,
then a draw from a seeded generator; temperature 0 is greedy. Text is streamed through
the tokenizer's incremental decoder, so no piece ever splits a UTF-8 character, and
text that might be the start of a stop string is held back until it is known not to be.
"""

from __future__ import annotations

import gc
import math

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .ahead import compile_ahead
from .capture import StepCapture
from .device import CPU
from .dtypes import DType, as_dtype, float16
from .errors import IndexOutOfRange, InvalidArgument, ShapeMismatch
from .runtime import cuda_memory
from .stream import fusion_enabled, stream_of
from .creation import from_numpy, tensor
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # refused here, not as "Probabilities contain NaN" from numpy mid-generation
        def bad(name: str, value: Any, why: str) -> InvalidArgument:
            return InvalidArgument("Sampling", f"{name}={value!r}: {why}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(name, value, "must be a finite number")
        if self.temperature < 0:
            raise bad("temperature", self.temperature, "must be >= 0")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", self.top_p, "must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", self.repetition_penalty, "must be > 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", self.top_k, "must be an integer >= 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", self.seed, "must be None or an integer >= 0")


def sample(logits: np.ndarray, s: Sampling, history: Sequence[int], rng: np.random.Generator | None) -> int:
    """One token id from a logits vector (``rng``: needed when the temperature is above 0)."""
    x = logits.astype(np.float64)
    if s.repetition_penalty != 1.0 and len(history):
        seen = np.unique(np.asarray(history, dtype=np.int64))
        vals = x[seen]
        x[seen] = np.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
    if s.temperature <= 0:
        return int(np.argmax(x))
    x = x / s.temperature
    if 0 < s.top_k < x.size:
        kth = np.partition(x, -s.top_k)[-s.top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if s.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, s.top_p)) + 1  # smallest prefix with mass >= top_p
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if rng is None:
        raise ValueError("sample: a temperature above 0 draws from rng, which is None")
    return int(rng.choice(p.size, p=p))


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    generate_seconds: float = 0.0
    stop_reason: str = ""
    token_ids: list[int] = field(default_factory=list)

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generate_tps(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0


class DecodeStep:
    """One decoding step: the token's logits, the KV caches one position longer.

    The step is the model's own code over a (1, 1) token tensor that stays the same
    object (the token is written into it), so its recording is the same at every
    position but for the position itself. With ``capture`` the first steps run as
    recorded and are watched (``capture.StepCapture``); from then on a step replays
    their fused plans with the position as a value: no ops are recorded, no Python of
    the model runs. If the step cannot be captured it keeps running as recorded (and
    ``reason`` says why).

    A model on the cuda device (``model.to("cuda")``) keeps its token tensor there,
    the token copied into it per step; its capture replays the step's launches with
    the position in a device buffer (``runtime/cuda_replay.py``), on a GPU as one CUDA
    graph."""

    def __init__(self, model: Any, caches: list[Any], capture: bool = True) -> None:
        self.model, self.caches = model, caches
        self.device = model_device(model)
        self.ids = np.zeros((1, 1), np.int64)
        self.ids_t = from_numpy(self.ids) if self.device == CPU else tensor(self.ids, device=self.device)
        # a model whose caches do not say their length has no position to capture by
        self.capture = StepCapture() if capture and caches and hasattr(caches[0], "length") else None
        self.prefill = PrefillStep(model, caches, capture)
        self.ahead_tried = False

    @property
    def captured(self) -> bool:
        return self.capture is not None and self.capture.ready

    def compile_ahead(self, position: int) -> None:
        """Before this session's first step, at ``position`` (the prompt's length): start
        compiling the step's kernels in the background (``ahead.py``), so that a cold
        process compiles them while its prompt's kernels compile and run, instead of
        after. Recorded at that position (not run): at position 0 the cache's written
        slot and its read prefix start at one offset, which makes another program."""
        if self.ahead_tried or self.captured or not self.caches or not hasattr(self.caches[0], "length") \
                or self.device != CPU:  # (it compiles C kernels: a cuda recording would stay queued)
            return
        self.ahead_tried = True
        _ahead_at(self.caches, position, lambda: self.model(self.ids_t, self.caches)[0, -1])

    def __call__(self, token: int) -> np.ndarray:
        """The logits after ``token``. Once the step is captured the array is a view of
        one buffer that the next step overwrites (as llama.cpp's ``llama_get_logits``):
        copy it to keep it."""
        self.ids[0, 0] = token
        if self.device != CPU:  # the same tensor every step, written outside the stream
            cuda_memory.fill(self.ids_t._storage.data(), self.ids)
        cap = self.capture
        if cap is not None and cap.ready and fusion_enabled():  # BRAZE_FUSION=0 means no compiled code
            before_replay(self.model, [token])
            pos = self.caches[0].length
            if pos >= self.caches[0].max_len:  # the replay writes the cache unchecked
                raise ShapeMismatch("KVCache.append", [(1,)], f"context full: {pos} + 1 > {self.caches[0].max_len} positions")
            logits = cap.replay(pos)
            for c in self.caches:
                c.length += 1
            return logits
        if cap is not None and not cap.reason:
            return cap.observe(self.caches[0].length, lambda: self.model(self.ids_t, self.caches)[0, -1])
        return self.model(self.ids_t, self.caches)[0, -1].numpy()


def _ahead_at(caches: list[Any], position: int, record: Callable[[], Any]) -> None:
    """``compile_ahead(record)`` with the caches at ``position``, their lengths restored after."""
    lengths = [c.length for c in caches]
    for c in caches:
        c.length = position
    try:
        compile_ahead(record)
    finally:
        for c, n in zip(caches, lengths):
            c.length = n


def model_device(model: Any) -> Any:
    """Where a model's weights are (a model without a ``device``: the CPU)."""
    return getattr(model, "device", CPU)


def before_replay(model: Any, tokens: Sequence[int]) -> None:
    """What a captured step needs before it runs (or is watched): its token ids in the
    vocabulary (a replay reads embedding rows unchecked), and the recorded work not run
    yet (the caches' zeros, a prefill nobody read) run first, outside the step."""
    vocab = model.config.vocab_size
    bad = next((t for t in tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise IndexOutOfRange("embedding", bad, vocab, 0)
    for device in dict.fromkeys((CPU, model_device(model))):
        if stream_of(device).nodes:
            stream_of(device).flush()


PREFILL_BUCKETS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # prompt lengths a prefill is padded to


@dataclass
class _Bucket:
    """A bucket's padded token ids and logits row, tensors written in place, and its capture."""

    ids: np.ndarray
    ids_t: Any
    at: np.ndarray
    at_t: Any
    capture: StepCapture | None


class PrefillStep:
    """A prompt into empty KV caches: its last token's logits.

    A prompt of n tokens runs padded to the next of ``PREFILL_BUCKETS`` (B tokens). The
    padding comes after the prompt, so causal attention keeps it out of every real
    position; its keys and values land past the caches' length, where decoding
    overwrites them; the logits are taken at row n - 1 through a row gather whose index,
    like the ids, is a tensor written in place. So every prompt of a bucket records the
    same program: one fused plan per bucket (compiled once, then loaded from the plan
    cache: a new prompt length compiles nothing), and, with ``capture``, after two
    prompts a capture of it (``StepCapture(static=True)``) that the next ones replay
    with one call, no ops recorded, as a decoding step does. Prompts longer than the
    last bucket, or that do not fit the caches padded, run as they are, recorded; so does
    everything on the reference executor (``BRAZE_FUSION=0``), where padding would only
    cost time. On the cuda device the ids and the row index are device tensors written
    per prompt, and the capture replays the bucket's launches (on a GPU one CUDA graph),
    as ``DecodeStep``'s does. A quantized matmul's rows cost about the same each from 16
    on (the strips take x rows 16 to a register; a prompt of 16 costs ~1.7x one of 8):
    hence buckets of 8 and 16, wider past them."""

    def __init__(self, model: Any, caches: list[Any], capture: bool = True) -> None:
        self.model, self.caches, self.capture = model, caches, capture
        self.device = model_device(model)
        self.buckets: dict[int, _Bucket] = {}

    def bucket(self, n: int) -> int | None:
        """The padded length of an n-token prompt, or None where it runs unpadded."""
        c = self.caches[0] if self.caches else None
        if c is None or not hasattr(c, "length") or c.length != 0 or not fusion_enabled():
            return None
        return next((b for b in PREFILL_BUCKETS if n <= b <= c.max_len), None)

    @property
    def captured(self) -> list[int]:
        """The buckets whose prefill replays a capture."""
        return sorted(b for b, k in self.buckets.items() if k.capture is not None and k.capture.ready)

    def _bucket(self, b: int) -> _Bucket:
        k = self.buckets.get(b)
        if k is None:
            ids, at = np.zeros((1, b), np.int64), np.zeros(1, np.int64)
            ids_t, at_t = ((from_numpy(ids), from_numpy(at)) if self.device == CPU
                           else (tensor(ids, device=self.device), tensor(at, device=self.device)))
            k = self.buckets[b] = _Bucket(ids, ids_t, at, at_t, StepCapture(static=True) if self.capture else None)
        return k

    def _fill(self, k: _Bucket, prompt_ids: Sequence[int]) -> None:
        before_replay(self.model, prompt_ids)
        n = len(prompt_ids)
        k.ids[0, :n] = prompt_ids
        k.ids[0, n:] = 0
        k.at[0] = n - 1
        if self.device != CPU:  # the same tensors every prompt, written outside the stream
            cuda_memory.fill(k.ids_t._storage.data(), k.ids)
            cuda_memory.fill(k.at_t._storage.data(), k.at)

    def compile_ahead(self, prompt_ids: Sequence[int]) -> None:
        """Before a bucket's first prompt: start compiling its kernels in the background
        (``ahead.py``), so that they compile while other work runs (recording and
        scheduling the decoding step to compile it ahead too) instead of after it."""
        b = self.bucket(len(prompt_ids))
        if b is None or b in self.buckets or self.device != CPU:  # (C kernels, as DecodeStep's)
            return
        k = self._bucket(b)
        self._fill(k, prompt_ids)
        _ahead_at(self.caches, 0, lambda: self.model(k.ids_t, self.caches, at=k.at_t)[0, -1])

    def __call__(self, prompt_ids: Sequence[int]) -> np.ndarray:
        n = len(prompt_ids)
        b = self.bucket(n)
        if b is None:
            prompt = tensor([list(prompt_ids)], device=model_device(self.model))
            return self.model(prompt, self.caches, last_only=True)[0, -1].numpy()
        k = self._bucket(b)
        self._fill(k, prompt_ids)
        cap = k.capture
        if cap is not None and cap.ready:
            logits = cap.replay(0)
        elif cap is not None and not cap.reason:
            logits = cap.observe(0, lambda: self.model(k.ids_t, self.caches, at=k.at_t)[0, -1])
        else:
            logits = self.model(k.ids_t, self.caches, at=k.at_t)[0, -1].numpy()
        for c in self.caches:
            c.length = n
        return logits


IDLE_SESSIONS = 2  # idle sessions kept per model (each holds KV caches), the most recent first
CACHE_BUCKET = 64  # KV caches are made in multiples of this many positions, so sessions are reused
# KV caches (generation's and the server's paged pool) store float16 by default, as
# llama.cpp's do; attention converts each key and value as it loads it and computes in
# float32. Half the memory (SmolLM2 at 2048 positions: 47 MB, not 94); a server's
# step of 8 rows at 512 positions 28.5 -> 22.7 ms at 2 threads, 45.1 -> 37.8 at 1; one
# sequence's decoding the same speed as float32 (bench/RESULTS.md, thirteenth
# session). ``kv_dtype`` (``--kv-dtype``) picks another.
KV_DTYPE = float16


def kv_cache_dtype(name: str | None) -> DType:
    """The KV cache type a ``--kv-dtype`` names (``cli_args.KV_DTYPES``); None: ``KV_DTYPE``."""
    return KV_DTYPE if name is None else as_dtype(name, "--kv-dtype")


def _idle(model: Any) -> list[tuple[tuple[int, bool, Any, DType], DecodeStep]]:
    """The model's idle sessions, kept on the model itself (so they go with it)."""
    return vars(model).setdefault("_idle_decode_sessions", [])


def freeze_heap() -> None:
    """Collect, then move every object alive now (a loaded model, its plans, its captured
    steps) out of the garbage collector's reach (``gc.freeze``), so that its full
    collections scan only newer objects: over a model's ~100k objects they paused a
    first generation for 20-120 ms at a time (7-10 ms after). For the processes braze
    owns, once their model is loaded or warmed up (the CLI, the server), as vLLM does
    after its warm-up; an object frozen that later becomes cyclic garbage is not freed."""
    gc.collect()
    gc.freeze()


@contextmanager
def decode_session(model: Any, max_len: int, capture: bool = True, kv_dtype: DType = KV_DTYPE
                   ) -> Iterator[DecodeStep]:
    """A ``DecodeStep`` over empty KV caches (of ``kv_dtype``) of at least ``max_len`` positions (a
    multiple of ``CACHE_BUCKET``, at most the model's context), taken from the model's
    idle ones when one fits: a session's caches and its captured step outlive a
    generation, so the next generation replays at once instead of watching its first
    steps again (as a server keeps its CUDA graphs). Two sessions at once never share
    caches; at most ``IDLE_SESSIONS`` idle ones are kept. A captured step replays the
    weights it was captured with: after replacing a model's weights, call
    ``clear_sessions(model)``."""
    ctx = model.config.context_length
    n = min(ctx, -(-max_len // CACHE_BUCKET) * CACHE_BUCKET) if max_len <= ctx else max_len
    key = (n, capture, model_device(model), kv_dtype)  # (a model moved since keeps its old caches apart)
    idle = _idle(model)
    hit = next((i for i, (k, _) in enumerate(idle) if k == key), None)
    step = idle.pop(hit)[1] if hit is not None else DecodeStep(model, model.new_cache(n, dtype=kv_dtype), capture)
    for c in step.caches:
        if hasattr(c, "length"):
            c.length = 0
    try:
        yield step
    finally:
        idle.insert(0, (key, step))
        del idle[IDLE_SESSIONS:]


def clear_sessions(model: Any) -> None:
    """Forget the model's idle decoding sessions (their caches and captured steps)."""
    _idle(model).clear()


def generate_ids(model: Any, prompt_ids: Sequence[int], max_tokens: int, sampling: Sampling = Sampling(),
                 eos_ids: frozenset[int] = frozenset(), stats: GenerationStats | None = None,
                 max_context: int | None = None, capture: bool = True, kv_dtype: DType = KV_DTYPE) -> Iterator[int]:
    """Yield generated token ids, stopping at EOS (not yielded) or ``max_tokens``.
    With ``capture`` (the default) the decoding step is captured after its first
    steps and replayed without recording (``DecodeStep``)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidArgument("generate", f"max_tokens={max_tokens!r}: must be an integer >= 0")
    stats = stats if stats is not None else GenerationStats()
    ctx = model.config.context_length if max_context is None else min(max_context, model.config.context_length)
    if not prompt_ids:
        raise ShapeMismatch("generate", [(0,)], "the prompt is empty (no tokens)")
    if len(prompt_ids) >= ctx:
        raise ShapeMismatch("generate", [(len(prompt_ids),)], f"the prompt has {len(prompt_ids)} tokens; the context holds {ctx}")
    limit = min(ctx, len(prompt_ids) + max_tokens)  # positions this generation may fill
    with decode_session(model, limit, capture, kv_dtype) as step:
        yield from _generate(model, step, prompt_ids, max_tokens, sampling, eos_ids, stats, ctx, limit)


def _generate(model: Any, step: "DecodeStep", prompt_ids: Sequence[int], max_tokens: int, sampling: Sampling,
              eos_ids: frozenset[int], stats: GenerationStats, ctx: int, limit: int) -> Iterator[int]:
    # greedy decoding draws nothing: numpy.random (and the libcrypto it maps) stay unloaded
    rng = np.random.default_rng(sampling.seed) if sampling.temperature > 0 else None
    history = list(prompt_ids)
    stats.prompt_tokens = len(prompt_ids)
    t0 = time.perf_counter()
    if max_tokens > 1:  # the prompt's kernels compile while the step is recorded and scheduled
        step.prefill.compile_ahead(prompt_ids)
        step.compile_ahead(len(prompt_ids))
    logits = step.prefill(prompt_ids)
    stats.prompt_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats.stop_reason = "length"
    for _ in range(max_tokens):
        nxt = sample(logits, sampling, history, rng)
        if nxt in eos_ids:
            stats.stop_reason = "eos"
            break
        history.append(nxt)
        stats.token_ids.append(nxt)
        stats.generated_tokens += 1
        yield nxt
        if len(history) >= limit:
            stats.stop_reason = "length" if len(history) < ctx else "context"
            break
        logits = step(nxt)
        stats.generate_seconds = time.perf_counter() - t0
    stats.generate_seconds = time.perf_counter() - t0


class TextStream:
    """Token ids in, text out: the tokenizer's incremental decoder (no piece splits a
    UTF-8 character) with stop strings. ``feed`` returns the text that is safe to show
    (text that might be the start of a stop string is held back until it is known not
    to be) and sets ``stopped`` when a stop string appears (the text before it is
    returned; the rest, and the stop string, never are); ``finish`` returns what is
    held at the end. Used by ``generate_text`` and the server's engine."""

    def __init__(self, tok: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.decoder = tok.stream(skip_special_tokens=True)
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped = False

    def feed(self, token: int) -> str:
        if self.stopped:
            return ""
        self.pending += self.decoder.feed(token)
        return self._release(final=False)

    def finish(self) -> str:
        if self.stopped:
            return ""
        self.pending += self.decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        hit = _find_stop(self.pending, self.stop)
        if hit is not None:
            self.stopped = True
            out, self.pending = self.pending[:hit], ""
            return out
        safe = len(self.pending) if final else len(self.pending) - _held_back(self.pending, self.stop)
        out, self.pending = self.pending[:safe], self.pending[safe:]
        return out


def generate_text(model: Any, tok: Tokenizer, prompt: str, max_tokens: int = 128, sampling: Sampling = Sampling(),
                  stop: Sequence[str] = (), stats: GenerationStats | None = None, chat: bool = False,
                  parse_special: bool = True, kv_dtype: DType = KV_DTYPE) -> Iterator[str]:
    """Stream text pieces for ``prompt``; stops at EOS, at a stop string (not
    included), or after ``max_tokens``. With ``chat`` the prompt is rendered as one
    user message through the model's chat template."""
    if chat:
        prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=True, parse_special=parse_special)
    stats = stats if stats is not None else GenerationStats()
    text = TextStream(tok, stop)
    for token in generate_ids(model, ids, max_tokens, sampling, tok.eos_ids, stats, kv_dtype=kv_dtype):
        piece = text.feed(token)
        if piece:
            yield piece
        if text.stopped:
            stats.stop_reason = "stop"
            return
    piece = text.finish()
    if text.stopped:
        stats.stop_reason = "stop"
    if piece:
        yield piece


def _find_stop(text: str, stop: Sequence[str]) -> int | None:
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None


def _held_back(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                best = max(best, n)
                break
    return best
