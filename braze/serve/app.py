"""The OpenAI-compatible HTTP API over an ``Engine``: ``create_app`` builds the FastAPI
app (chat, completions, embeddings, models, health, metrics).

Every refusal is OpenAI's error JSON with a 4xx status (``protocol.APIError``); a 5xx
means the server failed (an engine step raised, or it is shutting down), never that the
request was bad. The engine's thread does the model work; handlers parse and check on
the event loop, submit, and await events (``bridge.Submitted``).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from contextlib import aclosing, asynccontextmanager
from typing import Any, AsyncIterator

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import InvalidArgument, ShapeMismatch
from . import protocol
from .bridge import Submitted
from .engine import Engine, Event, QueueFull
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import APIError, Generation
from .responses import Chat, Format, Text, embeddings

DEFAULT_MAX_BODY_BYTES = 4 << 20
#: texts embedded per engine job (a request's list is split; generation steps run between)
EMBED_BATCH = 32
#: how often the app drains the engine's latency samples into its histograms between scrapes
METRICS_REFRESH_S = 5.0
#: the status logged for a request whose client left before its answer (nginx's)
CLIENT_CLOSED = 499
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/models/{model}",
             "/health", "/metrics")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read no further than ``limit`` bytes (413 past it)."""
    too_big = APIError(413, f"the request body is over the limit of {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return body


class _SequenceStream(StreamingResponse):
    """A stream of server-sent events that cancels its sequence however it ends: its
    generator's own cleanup runs only if the generator was started, and a client can
    leave before the first chunk."""

    def __init__(self, content: AsyncIterator[str], sub: Submitted) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.sub = sub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.sub.finished:
                self.sub.engine.cancel(self.sub.seq_id)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _failure(ev: Event) -> APIError:
    if ev.finish_reason == "abort":
        return APIError(503, "the server is shutting down", type="server_error", code="unavailable")
    return APIError(500, f"generation failed: {ev.error}", type="server_error", code="internal_error")


class _CountRequests:
    """Counts every HTTP answer by endpoint and status (a plain ASGI wrapper, so
    streaming responses pass through untouched)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what the client sees if the app fails before answering

        async def send_counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, send_counting)
        finally:
            path = scope.get("path", "")
            if path.startswith("/v1/models/"):
                path = "/v1/models/{model}"
            self.metrics.requests.labels(path if path in ENDPOINTS else "other", str(status)).inc()


def create_app(engine: Engine, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The API over ``engine`` (started when the app starts, if it is not already;
    closing it stays with its owner). ``api_key``: every /v1 request must carry
    ``Authorization: Bearer KEY``. ``max_body_bytes``: larger bodies get a 413."""
    if max_body_bytes < 1:
        raise InvalidArgument("create_app", f"max_body_bytes={max_body_bytes}: must be >= 1")
    metrics = ServerMetrics(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()

        async def drain() -> None:  # keeps the engine's latency samples from piling up between scrapes
            while True:
                await asyncio.sleep(METRICS_REFRESH_S)
                metrics.refresh()
        task = asyncio.ensure_future(drain())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="braze", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.metrics = engine, metrics
    app.add_middleware(_CountRequests, metrics=metrics)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return _error(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        return _error(APIError(500, f"internal error: {type(e).__name__}", type="server_error", code="internal_error"))

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "a valid API key is required: 'Authorization: Bearer KEY'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_model(name: str | None, served: str | None) -> None:
        if name is not None and name != served:
            raise APIError(404, f"the model {name!r} is not served here (this endpoint serves {served!r}; "
                                "GET /v1/models lists them)", param="model", code="model_not_found")

    async def disconnected_of(request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    def submit(request: Request, ids: list[int], g: Generation, param: str) -> Submitted:
        req = protocol.engine_request(engine, ids, g, param)
        try:
            return Submitted(engine, req, lambda: disconnected_of(request))
        except QueueFull as e:
            raise APIError(429, f"the server is busy: {e}; retry later", type="rate_limit_exceeded",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None

    async def stream(sub: Submitted, fmt: Format, g: Generation) -> AsyncIterator[str]:
        want_lp = g.logprobs is not None
        first = fmt.first_chunk()
        if first is not None:
            yield _sse(first)
        last: Event | None = None
        async with aclosing(sub.events()) as events:
            async for ev in events:
                last = ev
                if ev.finish_reason in ("abort", "error"):
                    yield _sse(_failure(ev).body())
                    break
                if ev.text or ev.finish_reason or (want_lp and ev.token_id is not None):
                    yield _sse(fmt.chunk(ev.text, [ev], want_lp, ev.finish_reason))
        if sub.client_gone:
            return
        if last is not None and g.include_usage:
            yield _sse(fmt.usage_chunk(last.prompt_tokens, last.completion_tokens))
        yield "data: [DONE]\n\n"

    async def generate(request: Request, ids: list[int], g: Generation, fmt: Format) -> Response:
        check_model(g.model, engine.model_name)
        sub = submit(request, ids, g, "messages" if isinstance(fmt, Chat) else "prompt")
        if g.stream:
            return _SequenceStream(stream(sub, fmt, g), sub)
        async with aclosing(sub.events()) as events:
            got = [ev async for ev in events]
        if sub.client_gone or not got:
            return Response(status_code=CLIENT_CLOSED)
        last = got[-1]
        if last.finish_reason not in ("stop", "length"):
            raise _failure(last)
        assert last.finish_reason is not None
        text = "".join(ev.text for ev in got)
        return JSONResponse(fmt.response(text, got, g.logprobs is not None, last.finish_reason,
                                         last.prompt_tokens, last.completion_tokens))

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        messages, g = protocol.chat_request(await read_json(request, max_body_bytes))
        return await generate(request, protocol.encode_chat(engine, messages), g,
                              Chat(engine.model_name, engine.tokenizer))

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        prompt, g = protocol.completion_request(await read_json(request, max_body_bytes))
        return await generate(request, protocol.encode_prompt(engine, prompt), g,
                              Text(engine.model_name, engine.tokenizer))

    @v1.post("/embeddings")
    async def create_embeddings(request: Request) -> Response:
        texts, encoding, model = protocol.embedding_request(await read_json(request, max_body_bytes))
        if engine.embedder is None:
            raise APIError(404, "this server has no embedding model (start it with --embedding-model)",
                           param="model", code="model_not_found")
        check_model(model, engine.embedder_name)
        parts, n_tokens = [], 0
        try:  # in batches: a long list neither takes the memory of one huge batch nor stalls generation
            for i in range(0, len(texts), EMBED_BATCH):
                vectors, n = await asyncio.wrap_future(engine.embed(texts[i:i + EMBED_BATCH]))
                parts.append(vectors)
                n_tokens += n
        except (ShapeMismatch, InvalidArgument) as e:
            raise protocol.bad("input", str(e)) from None
        assert engine.embedder_name is not None
        return JSONResponse(embeddings(engine.embedder_name, np.concatenate(parts), n_tokens, encoding))

    started = int(time.time())

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": started, "owned_by": "braze"}

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(n) for n in (engine.model_name, engine.embedder_name)
                                           if n is not None]}

    @v1.get("/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name not in (engine.model_name, engine.embedder_name):
            check_model(name, engine.model_name)  # the 404
        return model_card(name)

    app.include_router(v1)

    @app.get("/health")
    async def health() -> JSONResponse:
        alive, warming = engine.alive, engine.warming
        m = metrics.refresh()
        status = "engine stopped" if not alive else "warming up" if warming else "ok"
        return JSONResponse({"status": status, "running": m.running, "waiting": m.waiting},
                            status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app

