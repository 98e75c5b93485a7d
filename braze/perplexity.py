"""Perplexity of a language model over a text, the way llama.cpp's ``llama-perplexity`` counts it.

    result = perplexity(loaded.model, loaded.tokenizer, text, ctx=256)
    print(f"PPL = {result.ppl:.4f} +/- {result.ppl_stderr:.5f}")

The text is tokenized once (with the tokenizer's own BOS rule) and cut into windows of
``ctx`` tokens; each window is run through the model from an empty context, and only the
tokens of its second half are scored, so every scored token sees at least ``ctx / 2``
tokens before it (the first tokens of a window see almost nothing, and counting them
would measure the window's length more than the model). Precisely, as llama.cpp:

* windows are ``[i * ctx, (i + 1) * ctx)``; a tail shorter than ``ctx`` is not scored
  (llama.cpp drops it too, so the two tools score the same tokens and their numbers
  compare). A text shorter than one window is scored as one window of all its tokens;
* a window of ``L`` tokens scores the predictions of its tokens ``first + 1 .. L - 1``
  with ``first = L // 2`` (``L - 1 - L // 2`` tokens: 127 of 256); at ``L = 2`` that
  would be none, so ``first`` is at most ``L - 2``: every window scores a token;
* when the tokenizer adds a BOS token, each window's first token is replaced by BOS,
  so that every window starts the way the model saw its training documents start.

With ``stride`` (llama.cpp's ``--ppl-stride``) the windows overlap instead: they start
every ``stride`` tokens and each scores its last ``stride`` tokens, so each scored token
sees ``ctx - stride`` or more tokens of context (slower: ``ctx / stride`` times the work).

The log-softmax is computed in float64 numpy from the model's float32 logits, so the
result does not depend on how the kernels order their sums beyond the logits themselves.
``ppl = exp(mean NLL)``; its standard error is llama.cpp's, by the delta method:
``ppl * sqrt(var(NLL) / (N - 1))`` over the N scored tokens (NaN when N < 2).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ShapeMismatch
from .creation import tensor
from .tokenizer import Tokenizer

DEFAULT_CTX = 256


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, start + length)``; the predictions of tokens ``first + 1 ..
    length - 1`` (relative to ``start``) are scored."""
    start: int
    length: int
    first: int

    @property
    def scored(self) -> int:
        return self.length - 1 - self.first


@dataclass
class PerplexityResult:
    ppl: float                 # exp(nll)
    nll: float                 # mean negative log-likelihood per scored token, in nats
    ppl_stderr: float          # standard error of ppl (delta method, as llama.cpp)
    tokens: int                # tokens scored
    chunks: int                # windows run through the model
    seconds: float             # wall time of the model calls and the scoring
    ctx: int                   # window length
    text_tokens: int           # tokens in the whole text
    chunk_ppl: list[float] = field(default_factory=list)  # running ppl after each window


def windows(n_tokens: int, ctx: int, stride: int | None = None) -> list[Window]:
    """The windows scored for a text of ``n_tokens`` tokens (see the module's docstring)."""
    if ctx < 2:
        raise ShapeMismatch("perplexity", [(ctx,)], f"ctx={ctx}: a window needs at least 2 tokens")
    if n_tokens < 2:
        raise ShapeMismatch("perplexity", [(n_tokens,)],
                            f"the text has {n_tokens} token(s); perplexity needs at least 2")
    if stride is None:
        if n_tokens < ctx:
            return [Window(0, n_tokens, min(n_tokens // 2, n_tokens - 2))]
        return [Window(i * ctx, ctx, min(ctx // 2, ctx - 2)) for i in range(n_tokens // ctx)]
    if not 1 <= stride < ctx:
        raise ShapeMismatch("perplexity", [(ctx,)], f"stride={stride}: it must be in [1, ctx - 1] (ctx={ctx})")
    if n_tokens < ctx:
        length = n_tokens
        return [Window(0, length, max(length - 1 - stride, 0))]
    return [Window(s, ctx, ctx - 1 - stride) for s in range(0, n_tokens - ctx + 1, stride)]


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood (float64) of ``targets[i]`` under ``softmax(logits[i])``.

    Max-shifted log-sum-exp in float64: the shift keeps exp from overflowing, and float64
    keeps the sum over a large vocabulary from losing the small probabilities."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=-1))
    nll: np.ndarray = lse - x[np.arange(len(targets)), targets]
    return nll


def _window_logits(model: Any, ids: list[int], batch_tokens: int | None) -> np.ndarray:
    """Logits (len(ids), vocab) of one window from an empty context: in one call, or in
    pieces of ``batch_tokens`` through a KV cache (bounds the activations' memory)."""
    if batch_tokens is None or batch_tokens >= len(ids):
        return np.asarray(model(tensor([ids])).numpy()[0])
    caches = model.new_cache(len(ids))
    parts = [model(tensor([ids[i:i + batch_tokens]]), caches).numpy()[0]
             for i in range(0, len(ids), batch_tokens)]
    return np.concatenate(parts, axis=0)


def perplexity(model: Any, tokenizer: Tokenizer, text: str, ctx: int = DEFAULT_CTX, stride: int | None = None,
               *, batch_tokens: int | None = None, max_chunks: int | None = None,
               on_chunk: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of ``model`` (a ``braze.models.llama.Llama``, or anything called as
    ``model(ids) -> logits (1, T, vocab)``) over ``text``; see the module's docstring
    for which tokens are scored. ``max_chunks`` scores only the first windows;
    ``on_chunk(i, n, running_ppl)`` is called after each window (for progress output)."""
    if batch_tokens is not None and batch_tokens < 1:
        raise ShapeMismatch("perplexity", [(batch_tokens,)], f"batch_tokens={batch_tokens}: it must be at least 1")
    ids = tokenizer.encode(text, add_special_tokens=True, parse_special=False)
    context = getattr(getattr(model, "config", None), "context_length", None)
    if context is not None and ctx > context:
        raise ShapeMismatch("perplexity", [(ctx,)], f"ctx={ctx} is longer than the model's context ({context})")
    wins = windows(len(ids), ctx, stride)
    if max_chunks is not None:
        wins = wins[:max(max_chunks, 1)]
    bos = tokenizer.bos_id if tokenizer.add_bos else None
    t0 = time.perf_counter()
    nll_sum = nll2_sum = 0.0
    count = 0
    running: list[float] = []
    for i, w in enumerate(wins):
        chunk = ids[w.start:w.start + w.length]
        if bos is not None:
            chunk[0] = bos
        logits = _window_logits(model, chunk, batch_tokens)
        # logits at position j predict token j + 1: positions first .. L-2 score first+1 .. L-1
        nll = token_nll(logits[w.first:w.length - 1], np.asarray(chunk[w.first + 1:], dtype=np.int64))
        nll_sum += float(nll.sum())
        nll2_sum += float((nll * nll).sum())
        count += len(nll)
        running.append(math.exp(nll_sum / count))
        if on_chunk is not None:
            on_chunk(i, len(wins), running[-1])
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    stderr = ppl * math.sqrt(max(var, 0.0) / (count - 1)) if count > 1 else math.nan
    return PerplexityResult(ppl=ppl, nll=mean, ppl_stderr=stderr, tokens=count, chunks=len(wins),
                            seconds=time.perf_counter() - t0, ctx=ctx, text_tokens=len(ids), chunk_ppl=running)
