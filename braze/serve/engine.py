"""The serving engine: one thread owns the model and runs every sequence.

braze records ops on one stream per device, so all model work of a process runs on
one thread: this one. Callers on other threads (the HTTP server's event loop) talk to
it through ``submit`` (a generation; events come back through a callback, called on
the engine's thread), ``cancel`` and ``embed`` (a future).

Each turn of the loop admits waiting requests while there is room in the batch, runs
one decoding step for every sequence that is decoding, with a bounded number of prompt
tokens as extra rows (alone, a prompt feeds a prefill chunk: ``runner.PagedRunner.step``);
a sequence joins and leaves the running batch at any turn.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..dtypes import DType
from ..errors import BrazeError, InvalidArgument, ShapeMismatch
from ..generate import KV_DTYPE, Sampling, TextStream, freeze_heap, sample
from .runner import PagedRunner


class QueueFull(BrazeError):
    """More requests wait than the engine's queue limit allows (HTTP 429)."""


@dataclass(frozen=True)
class Request:
    prompt_ids: Sequence[int]
    max_tokens: int
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # how many top alternatives per token (0: the token's own only); None: off
    ignore_eos: bool = False  # an end-of-sequence token is a token like any other (benchmarks)


@dataclass
class Event:
    """What one step produced for a sequence: new text (possibly empty: a token whose
    text is held back), the token, and, on the last event, why it finished."""

    seq_id: int
    text: str = ""
    token_id: int | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", "abort", "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: BaseException | None = None


@dataclass
class Metrics:
    """A snapshot of the engine, for /metrics."""

    waiting: int = 0
    running: int = 0
    batch_size: int = 0  # sequences in the last decoding step
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    generated_tokens: int = 0  # since start
    prompt_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    preemptions: int = 0
    ttft_seconds: list[float] = field(default_factory=list)  # since the last snapshot
    step_seconds: list[float] = field(default_factory=list)


@dataclass
class _Seq:
    id: int
    req: Request
    on_event: Callable[[Event], None]
    text: TextStream
    arrived: float
    history: list[int] = field(default_factory=list)
    generated: int = 0
    rng: np.random.Generator | None = None
    state: Any = None  # the runner's per-sequence state
    logits: np.ndarray | None = None  # the next token's, once the prompt is in
    first_token_at: float | None = None


def served_name(path: str | Path) -> str:
    """The name a model is served under: its file's stem, or its directory's name (the
    directory above, where it is a generic ``model``, as in a Python package)."""
    p = Path(path)
    if p.is_dir():
        return p.parent.name if p.name == "model" else p.name
    return p.stem


class Engine:
    """A model served to many callers. ``model``: a ``Loaded`` LLM (``models.load_llm``);
    ``embedder``: a ``Loaded`` BERT model for ``embed`` (optional). ``freeze``: the process
    is the server's own (``braze serve``, a Ray replica): the heap alive when the loop
    starts is frozen (``generate.freeze_heap``)."""

    def __init__(self, model: Any, embedder: Any = None, max_batch: int = 8, ctx: int | None = None,
                 queue_limit: int = 256, kv_tokens: int | None = None, chunk: int = 256,
                 warmup: bool = False, turn_tokens: int | None = None, kv_dtype: DType = KV_DTYPE,
                 freeze: bool = False) -> None:
        if max_batch < 1:
            raise InvalidArgument("Engine", f"max_batch={max_batch}: must be >= 1")
        self.loaded, self.embedder = model, embedder
        self.tokenizer = model.tokenizer
        self.model_name = served_name(model.path)
        self.embedder_name = served_name(embedder.path) if embedder is not None else None
        full = model.model.config.context_length
        self.context_length = min(ctx, full) if ctx else full
        self.max_batch, self.queue_limit = max_batch, queue_limit
        self._lock = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._cancel: set[int] = set()
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._next_id = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._m = Metrics()
        self._warmup = warmup  # capture every step (decoding and prefill buckets) on the engine's thread before serving
        self._freeze = freeze  # the process is the server's: generate.freeze_heap() once the loop starts
        self._runner = PagedRunner(model.model, self.context_length, max_batch, kv_tokens, chunk,
                                   turn_rows=turn_tokens, kv_dtype=kv_dtype)

    # -- the callers' side (any thread) --------------------------------------------------
    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="braze-engine", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    @property
    def alive(self) -> bool:
        """Whether the engine's thread is running (it serves requests)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def warming(self) -> bool:
        """Whether the engine is still capturing its steps (``warmup``): requests wait."""
        return self._warmup

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def check(self, req: Request) -> None:
        """Raise what ``submit`` would for this request, before anything is queued."""
        n = len(req.prompt_ids)
        if n == 0:
            raise ShapeMismatch("generate", [(0,)], "the prompt is empty (no tokens)")
        if n >= self.context_length:
            raise ShapeMismatch("generate", [(n,)], f"the prompt has {n} tokens; the context holds "
                                                    f"{self.context_length}")
        if isinstance(req.max_tokens, bool) or not isinstance(req.max_tokens, int) or req.max_tokens < 1:
            raise InvalidArgument("generate", f"max_tokens={req.max_tokens!r}: must be an integer >= 1")
        vocab = self.loaded.model.config.vocab_size
        bad = next((t for t in req.prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidArgument("generate", f"token id {bad} is outside the vocabulary (0..{vocab - 1})")

    def submit(self, req: Request, on_event: Callable[[Event], None]) -> int:
        """Queue a generation; ``on_event`` is called on the engine's thread with each
        step's ``Event`` (the last has ``finish_reason``). Returns the sequence id."""
        self.check(req)
        with self._lock:
            if len(self._waiting) >= self.queue_limit:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the queue limit is {self.queue_limit})")
            sid = self._next_id
            self._next_id += 1
            rng = np.random.default_rng(req.sampling.seed) if req.sampling.temperature > 0 else None
            self._waiting.append(_Seq(sid, req, on_event, TextStream(self.tokenizer, req.stop), time.perf_counter(),
                                      list(req.prompt_ids), rng=rng))
            self._lock.notify_all()
        return sid

    def cancel(self, seq_id: int) -> None:
        """Stop a sequence (a client went away); its memory is freed at the next step.
        Its last event has finish_reason "abort"."""
        with self._lock:
            self._cancel.add(seq_id)
            self._lock.notify_all()

    def run(self, fn: Callable[[], Any]) -> "Future[Any]":
        """Run ``fn`` on the engine's thread (between steps); its result as a future."""
        fut: Future[Any] = Future()
        with self._lock:
            self._jobs.append((fn, fut))
            self._lock.notify_all()
        return fut

    def embed(self, texts: Sequence[str]) -> "Future[tuple[np.ndarray, int]]":
        """Sentence embeddings (n, dim) of ``texts`` and the number of tokens they took."""
        if self.embedder is None:
            raise InvalidArgument("embed", "this server has no embedding model")
        e = self.embedder

        def job() -> tuple[np.ndarray, int]:
            batch = e.tokenizer.encode_batch(list(texts))
            vectors = e.model.embed(batch.ids, batch.attention_mask, batch.type_ids)
            return np.asarray(vectors), int(np.asarray(batch.attention_mask).sum())
        return self.run(job)

    def metrics(self) -> Metrics:
        """The counters so far; the latency lists are those since the last call."""
        with self._lock:
            m = self._m
            snap = Metrics(**{**vars(m), "ttft_seconds": list(m.ttft_seconds), "step_seconds": list(m.step_seconds)})
            snap.waiting, snap.running = len(self._waiting), len(self._running)
            m.ttft_seconds.clear()
            m.step_seconds.clear()
        snap.kv_blocks_used, snap.kv_blocks_total = self._runner.blocks()
        return snap

    # -- the engine's thread --------------------------------------------------------------
    def _loop(self) -> None:
        if self._warmup:
            self._runner.warm()
            self._warmup = False
        if self._freeze:  # the model, its plans and captures: out of the collector's full passes
            freeze_heap()
        while True:
            with self._lock:
                while not (self._stop or self._waiting or self._running or self._jobs):
                    self._lock.wait()
                if self._stop:
                    break
                jobs, self._jobs = list(self._jobs), deque()
                cancel, self._cancel = self._cancel, set()
            for fn, fut in jobs:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # the caller gets it
                        fut.set_exception(e)
            self._drop(cancel)
            self._admit()
            if self._running:
                self._step()
        for s in list(self._running) + list(self._waiting):
            self._finish(s, "abort")

    def _drop(self, ids: set[int]) -> None:
        if not ids:
            return
        with self._lock:
            gone = [s for s in self._waiting if s.id in ids]
            for s in gone:
                self._waiting.remove(s)
        for s in gone + [s for s in self._running if s.id in ids]:
            self._finish(s, "abort")

    def _admit(self) -> None:
        while len(self._running) < self.max_batch:
            with self._lock:
                if not self._waiting or not self._runner.can_admit(self._waiting[0]):
                    return
                s = self._waiting.popleft()
            self._running.append(s)
            hit = self._runner.admit(s)
            with self._lock:
                self._m.prefix_hit_tokens += hit

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            preempted = self._runner.step(self._running)
        except BaseException as e:  # a failed step fails its sequences, not the server
            for s in list(self._running):
                self._finish(s, "error", e)
            return
        with self._lock:
            self._m.preemptions += len(preempted)
            for s in reversed(preempted):  # back to the front of the queue, in order
                self._running.remove(s)
                self._waiting.appendleft(s)
        now = time.perf_counter()
        decoding = [s for s in self._running if s.logits is not None]
        with self._lock:
            self._m.steps += 1
            self._m.batch_size = len(decoding)
            self._m.step_seconds.append(now - t0)
        for s in decoding:
            self._emit(s, now)

    def _emit(self, s: _Seq, now: float) -> None:
        """Sample the next token of ``s`` from its logits and tell its caller."""
        assert s.logits is not None
        logits, s.logits = s.logits, None
        tok = sample(logits, s.req.sampling, s.history, s.rng)
        if s.first_token_at is None:
            s.first_token_at = now
            with self._lock:
                self._m.ttft_seconds.append(now - s.arrived)
                self._m.prompt_tokens += len(s.req.prompt_ids)
        ev = Event(s.id, prompt_tokens=len(s.req.prompt_ids))
        if s.req.logprobs is not None:
            lp = logits.astype(np.float64)
            lp = lp - lp.max()
            lp = lp - np.log(np.exp(lp).sum())
            ev.logprob = float(lp[tok])
            k = min(s.req.logprobs, lp.size)
            if k:
                top = np.argpartition(-lp, k - 1)[:k]
                top = top[np.argsort(-lp[top], kind="stable")]
                ev.top_logprobs = [(int(i), float(lp[i])) for i in top]
        if tok in self.tokenizer.eos_ids and not s.req.ignore_eos:
            ev.text = s.text.finish()
            ev.completion_tokens = s.generated
            return self._finish(s, "stop", event=ev)
        s.history.append(tok)
        s.generated += 1
        ev.token_id, ev.text, ev.completion_tokens = tok, s.text.feed(tok), s.generated
        with self._lock:
            self._m.generated_tokens += 1
        if s.text.stopped:
            return self._finish(s, "stop", event=ev)
        if s.generated >= s.req.max_tokens or len(s.history) >= self.context_length:
            ev.text += s.text.finish()
            return self._finish(s, "stop" if s.text.stopped else "length", event=ev)
        self._send(s, ev)

    def _finish(self, s: _Seq, reason: str, error: BaseException | None = None, event: Event | None = None) -> None:
        ev = event or Event(s.id, prompt_tokens=len(s.req.prompt_ids), completion_tokens=s.generated)
        ev.finish_reason, ev.error = reason, error
        if s in self._running:
            self._running.remove(s)
            self._runner.release(s)
        with self._lock:
            self._m.finished += 1
            self._m.aborted += reason == "abort"
        self._send(s, ev)

    def _send(self, s: _Seq, ev: Event) -> None:
        try:
            s.on_event(ev)
        except Exception:  # a caller's callback failing must not stop the engine
            self.cancel(s.id)
