"""OpenAI's response shapes, built from the engine's events: a whole response, or the
chunks of a stream (``chat.completion.chunk`` / ``text_completion``), for chat and for
completions (``Chat`` and ``Text``: the two APIs differ in where text and log
probabilities go)."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer
from .engine import Event


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def token_text(tok: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text (a cut UTF-8 character as U+FFFD) and its bytes, as OpenAI gives them."""
    piece = tok.token_to_piece(token_id)
    return piece.decode("utf-8", errors="replace"), list(piece)


class Format:
    """One response's ids and shapes; ``Chat`` and ``Text`` fill in the API's own parts."""

    object = ""
    chunk_object = ""
    prefix = ""

    def __init__(self, model: str, tok: Tokenizer) -> None:
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model, self.tok = model, tok

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def logprobs(self, events: list[Event]) -> Any:
        raise NotImplementedError

    def _choice(self, text: str, events: list[Event], want_logprobs: bool, final: bool) -> dict[str, Any]:
        raise NotImplementedError

    def response(self, text: str, events: list[Event], want_logprobs: bool, finish: str,
                 prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        choice = {**self._choice(text, events, want_logprobs, final=True), "finish_reason": finish}
        body = self._envelope(self.object, [choice])
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body

    def first_chunk(self) -> dict[str, Any] | None:
        return None

    def chunk(self, text: str, events: list[Event], want_logprobs: bool,
              finish: str | None = None) -> dict[str, Any]:
        choice = {**self._choice(text, events, want_logprobs, final=False), "finish_reason": finish}
        return self._envelope(self.chunk_object, [choice])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        body = self._envelope(self.chunk_object, [])
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body


def _tokens(events: list[Event]) -> list[Event]:
    """The events that carry a generated token (the end-of-sequence token is not output)."""
    return [e for e in events if e.token_id is not None and e.logprob is not None]


class Chat(Format):
    object, chunk_object, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def logprobs(self, events: list[Event]) -> Any:
        content = []
        for e in _tokens(events):
            assert e.token_id is not None
            text, raw = token_text(self.tok, e.token_id)
            top = []
            for t, lp in e.top_logprobs or []:
                t_text, t_raw = token_text(self.tok, t)
                top.append({"token": t_text, "logprob": lp, "bytes": t_raw})
            content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
        return {"content": content, "refusal": None}

    def _choice(self, text: str, events: list[Event], want_logprobs: bool, final: bool) -> dict[str, Any]:
        body = {"role": "assistant", "content": text} if final else ({"content": text} if text else {})
        return {"index": 0, "message" if final else "delta": body,
                "logprobs": self.logprobs(events) if want_logprobs else None}

    def first_chunk(self) -> dict[str, Any] | None:
        return self._envelope(self.chunk_object, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}])


class Text(Format):
    object, chunk_object, prefix = "text_completion", "text_completion", "cmpl"

    def __init__(self, model: str, tok: Tokenizer) -> None:
        super().__init__(model, tok)
        self.offset = 0  # text_offset of the next token, across the chunks of a stream

    def logprobs(self, events: list[Event]) -> Any:
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in _tokens(events):
            assert e.token_id is not None
            text, _ = token_text(self.tok, e.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append({token_text(self.tok, t)[0]: lp for t, lp in e.top_logprobs or []})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _choice(self, text: str, events: list[Event], want_logprobs: bool, final: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": self.logprobs(events) if want_logprobs else None}


def embeddings(model: str, vectors: np.ndarray, n_tokens: int, encoding: str) -> dict[str, Any]:
    def encode(v: np.ndarray) -> Any:
        if encoding == "base64":  # little-endian float32, as OpenAI's client decodes it
            return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
        return [float(x) for x in v]
    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
