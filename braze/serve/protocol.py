"""OpenAI's request shapes, read and checked: each field's type and range, with the
field named in the error (``APIError``, a 4xx the app returns as OpenAI's error JSON).

Unknown fields are ignored, as vLLM and llama-server do (clients send ``user``,
``store``, ``metadata``...); fields braze cannot honour (``n`` > 1, ``echo``, tools,
penalties other than 0) are refused rather than silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import BrazeError, InvalidArgument, ShapeMismatch, TemplateError
from ..generate import Sampling
from .engine import Engine, Request

#: the most alternatives per token OpenAI's API gives (``top_logprobs`` <= 20)
MAX_TOP_LOGPROBS = 20
MAX_STOPS = 4
#: the most texts one embeddings request may carry (OpenAI's limit)
MAX_EMBED_INPUTS = 2048
ROLES = {"system", "developer", "user", "assistant", "tool"}


class APIError(BrazeError):
    """A request the server refuses, as the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


# -- fields ------------------------------------------------------------------------------
_MISSING = object()


def _field(body: Mapping[str, Any], name: str) -> Any:
    """The field's value; a JSON null counts as absent (OpenAI's clients send nulls)."""
    value = body.get(name, _MISSING)
    return _MISSING if value is None else value


def integer(body: Mapping[str, Any], name: str, lo: int, hi: int | None, default: Any = None) -> Any:
    value = _field(body, name)
    if value is _MISSING:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"'{name}' must be an integer, not {type(value).__name__}", "invalid_type")
    if value < lo or (hi is not None and value > hi):
        upper = f" and <= {hi}" if hi is not None else ""
        raise bad(name, f"'{name}' is {value}: it must be >= {lo}{upper}")
    return value


def number(body: Mapping[str, Any], name: str, lo: float, hi: float, default: float, lo_open: bool = False) -> float:
    value = _field(body, name)
    if value is _MISSING:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, f"'{name}' must be a number, not {type(value).__name__}", "invalid_type")
    low_ok = value > lo if lo_open else value >= lo
    if not (math.isfinite(value) and low_ok and value <= hi):
        raise bad(name, f"'{name}' is {value}: it must be in {'(' if lo_open else '['}{lo}, {hi}]")
    return float(value)


def _typed(body: Mapping[str, Any], name: str, kind: type, kind_name: str, default: Any) -> Any:
    value = _field(body, name)
    if value is _MISSING:
        return default
    if not isinstance(value, kind):
        raise bad(name, f"'{name}' must be {kind_name}, not {type(value).__name__}", "invalid_type")
    return value


def boolean(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    return bool(_typed(body, name, bool, "a boolean", default))


def string(body: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    value = _typed(body, name, str, "a string", default)
    return None if value is None else str(value)


def unicode(value: str, param: str) -> str:
    """``value`` if it is valid Unicode: JSON's escapes can spell a lone surrogate
    (``"\\ud800"``), which no tokenizer encodes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(param, f"'{param}' is not valid Unicode (a lone surrogate at character {e.start})") from None
    return value


def _only(body: Mapping[str, Any], name: str, allowed: Sequence[Any], why: str) -> None:
    value = _field(body, name)
    if value is not _MISSING and value not in allowed:
        raise bad(name, f"'{name}' = {value!r} is not supported: {why}", "unsupported_value")


# -- generation --------------------------------------------------------------------------
@dataclass(frozen=True)
class Generation:
    """What a chat or completion request asks of the engine, besides its prompt."""

    model: str | None
    max_tokens: int | None  # None: up to the context
    sampling: Sampling
    stop: tuple[str, ...]
    logprobs: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # vLLM's and llama-server's: generate past EOS, to max_tokens


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = _field(body, "stop")
    if value is _MISSING:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", "'stop' must be a string or a list of strings", "invalid_type")
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise bad("stop", f"'stop' takes at most {MAX_STOPS} strings, none of them empty")
    return tuple(unicode(s, "stop") for s in stops)


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    opts = _field(body, "stream_options")
    if opts is _MISSING:
        return False
    if not isinstance(opts, dict):
        raise bad("stream_options", "'stream_options' must be an object", "invalid_type")
    if not stream:
        raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
    return boolean(opts, "include_usage")


def generation(body: Mapping[str, Any], logprobs: int | None) -> Generation:
    """The fields chat and completions share (``logprobs``: already read, as each API
    spells it differently)."""
    for name in ("presence_penalty", "frequency_penalty"):
        if number(body, name, -2.0, 2.0, 0.0) != 0:
            raise bad(name, f"'{name}' is not supported (use 'repetition_penalty')", "unsupported_value")
    _only(body, "n", [1], "one choice per request")
    _only(body, "best_of", [1], "one choice per request")
    max_tokens = integer(body, "max_completion_tokens", 1, None)
    max_tokens = integer(body, "max_tokens", 1, None, max_tokens)
    top_k = integer(body, "top_k", -1, None, 0)
    sampling = Sampling(temperature=number(body, "temperature", 0.0, 2.0, 1.0),
                        top_p=number(body, "top_p", 0.0, 1.0, 1.0, lo_open=True),
                        top_k=max(top_k, 0),  # vLLM's -1 is off, as 0 is here
                        repetition_penalty=number(body, "repetition_penalty", 0.0, 1e6, 1.0, lo_open=True),
                        seed=integer(body, "seed", 0, None))
    stream = boolean(body, "stream")
    return Generation(string(body, "model"), max_tokens, sampling, _stop(body), logprobs, stream,
                      _stream_options(body, stream), boolean(body, "ignore_eos"))


def _content(message: Mapping[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return unicode(content, f"messages[{i}].content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content", "only text content parts ({'type': 'text', 'text': ...}) "
                                                   "are supported", "unsupported_value")
            parts.append(unicode(part["text"], f"messages[{i}].content"))
        return "".join(parts)
    raise bad(f"messages[{i}].content", "a message's 'content' must be a string or a list of text parts",
              "invalid_type")


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list of messages", "invalid_type")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", "each message must be an object with 'role' and 'content'", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role", f"unknown role {role!r}: expected one of {', '.join(sorted(ROLES))}")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return out


def chat_request(body: Mapping[str, Any]) -> tuple[list[dict[str, str]], Generation]:
    if _field(body, "tools") not in (_MISSING, []):
        raise bad("tools", "tools (function calling) are not supported", "unsupported_value")
    fmt = _field(body, "response_format")
    if fmt is not _MISSING and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad("response_format", "only {'type': 'text'} is supported", "unsupported_value")
    top = integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not boolean(body, "logprobs"):
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    logprobs = (top or 0) if boolean(body, "logprobs") else None
    return chat_messages(body), generation(body, logprobs)


def completion_request(body: Mapping[str, Any]) -> tuple[str | list[int], Generation]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    ok_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or ok_ids):
        raise bad("prompt", "'prompt' must be a string or a list of token ids (one prompt per request)",
                  "invalid_type")
    if isinstance(prompt, str):
        unicode(prompt, "prompt")
    _only(body, "echo", [False], "the prompt is not echoed")
    _only(body, "suffix", [""], "no suffix (fill-in-the-middle)")
    assert isinstance(prompt, (str, list))
    return prompt, generation(body, integer(body, "logprobs", 0, MAX_TOP_LOGPROBS))


def engine_request(engine: Engine, prompt_ids: Sequence[int], g: Generation, param: str) -> Request:
    """The engine's request, checked against the context: errors name the field
    (``param``: where the prompt came from, "messages" or "prompt")."""
    n, ctx = len(prompt_ids), engine.context_length
    if n >= ctx:
        raise APIError(400, f"the prompt has {n} tokens; this model's context holds {ctx} (the prompt must leave "
                            "room for at least one generated token)", param=param, code="context_length_exceeded")
    max_tokens = g.max_tokens if g.max_tokens is not None else ctx - n
    if n + max_tokens > ctx:
        raise APIError(400, f"max_tokens is {max_tokens} and the prompt has {n} tokens: together past this model's "
                            f"context of {ctx} tokens", param="max_tokens", code="context_length_exceeded")
    req = Request(list(prompt_ids), max_tokens, g.sampling, g.stop, g.logprobs, g.ignore_eos)
    try:
        engine.check(req)
    except (ShapeMismatch, InvalidArgument) as e:
        raise bad(param, str(e)) from None
    return req


def encode_chat(engine: Engine, messages: list[dict[str, str]]) -> list[int]:
    tok = engine.tokenizer
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
    except TemplateError as e:
        raise bad("messages", f"the model's chat template refused these messages: {e}") from None
    return list(tok.encode(text, add_special_tokens=True, parse_special=True))


def encode_prompt(engine: Engine, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    return list(engine.tokenizer.encode(prompt, add_special_tokens=True, parse_special=True))


# -- embeddings --------------------------------------------------------------------------
def embedding_request(body: Mapping[str, Any]) -> tuple[list[str], str, str | None]:
    """The texts, the encoding ("float" or "base64") and the model asked for."""
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad("input", "'input' must be a string or a non-empty list of strings", "invalid_type")
    for t in texts:
        unicode(t, "input")
    if len(texts) > MAX_EMBED_INPUTS:
        raise bad("input", f"'input' has {len(texts)} texts; at most {MAX_EMBED_INPUTS} per request")
    fmt = string(body, "encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad("encoding_format", f"'encoding_format' is {fmt!r}: expected 'float' or 'base64'")
    _only(body, "dimensions", [], "the model's own dimension only")
    assert fmt is not None
    return texts, fmt, string(body, "model")
