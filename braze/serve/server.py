"""``braze serve``: load the models, start the engine, run the app under uvicorn until
interrupted, then close the engine."""

from __future__ import annotations

import sys
from typing import Any

from ..generate import kv_cache_dtype
from ..models import ModelNotFound, load_embedder, load_llm
from .app import create_app
from .engine import Engine


def _embedder(path: str | None, wanted: bool) -> Any:
    """The embedding model: the one named, else the default one when it is installed."""
    if not wanted:
        return None
    if path is not None:
        return load_embedder(path)
    try:
        return load_embedder()
    except ModelNotFound:
        print("braze serve: no embedding model installed; /v1/embeddings is off", file=sys.stderr)
        return None


def serve(model: str | None = None, embedding_model: str | None = None, embeddings: bool = True,
          host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None, max_batch: int = 8,
          ctx: int | None = None, queue_limit: int = 256, kv_tokens: int | None = None, replicas: int = 1,
          chunk: int = 256, warmup: bool = False, turn_tokens: int | None = None,
          kv_dtype: str | None = None) -> int:
    if replicas > 1:  # copies of this server behind Ray Serve's proxy
        unused = [f"--{name}" for name, given, default in (
            ("kv-tokens", kv_tokens, None), ("prefill-chunk", chunk, 256), ("warmup", warmup, False),
            ("turn-tokens", turn_tokens, None)) if given != default]
        if unused:
            print(f"braze serve: {', '.join(unused)} not passed to Ray Serve replicas (their defaults apply)",
                  file=sys.stderr)
        from .ray_serve import main as ray_main
        argv = ["--replicas", str(replicas), "--host", host, "--port", str(port), "--max-batch", str(max_batch),
                *(["--model", model] if model else []), *(["--ctx", str(ctx)] if ctx else []),
                *(["--api-key", api_key] if api_key else []),
                *(["--embedder", embedding_model] if embedding_model and embeddings else []),
                "--queue-limit", str(queue_limit), *(["--kv-dtype", kv_dtype] if kv_dtype else [])]
        return ray_main(argv)
    import uvicorn
    loaded = load_llm(model)
    engine = Engine(loaded, embedder=_embedder(embedding_model, embeddings), max_batch=max_batch, ctx=ctx,
                    queue_limit=queue_limit, kv_tokens=kv_tokens, chunk=chunk,
                    warmup=warmup, turn_tokens=turn_tokens, kv_dtype=kv_cache_dtype(kv_dtype), freeze=True)
    if ctx is not None and ctx > loaded.model.config.context_length:
        print(f"braze serve: --ctx {ctx} is past the model's context; using {engine.context_length}",
              file=sys.stderr)
    app = create_app(engine, api_key=api_key)
    with engine:
        print(f"braze serve: {engine.model_name}" + (f" and {engine.embedder_name}" if engine.embedder_name else "")
              + f" on http://{host}:{port}/v1 (context {engine.context_length}, batch {max_batch})"
              + (", API key required" if api_key else ""), file=sys.stderr)
        uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
    return 0
