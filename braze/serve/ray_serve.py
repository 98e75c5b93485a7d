"""Scale-out: replicas of the serving engine behind Ray Serve's HTTP proxy.

    python -m braze.serve.ray_serve --model FILE.gguf --replicas 2 --port 8000

Each replica is a Ray actor (its own process) that loads the model, starts its own
``Engine`` and serves ``braze.serve.app.create_app(engine)``: the same OpenAI-compatible
API as ``braze serve``, so a client cannot tell the two apart except by the
``x-braze-replica`` response header, which names the replica (Ray's replica id and
the process id) that answered. Ray's proxy (one per node of the cluster) accepts the
HTTP connections and routes each request to a replica: its default router picks the
less loaded of two random replicas. Replicas share nothing: each has its own KV cache
and batch, so a conversation's next turn may land on a replica that has none of its
prefix cached (docs/ARCHITECTURE.md, "Serving on many machines").

``deploy`` starts (or joins, with ``address`` or ``$RAY_ADDRESS``) a Ray cluster and
runs the application; ``shutdown`` stops it. Ray is an optional dependency (the
``scale`` extra: ``pip install -e '.[scale]'``); importing this module does not
import it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..cli_args import KV_DTYPES

REPLICA_HEADER = "x-braze-replica"
APP_NAME = "braze"
THREAD_VARS = ("BRAZE_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class _ReplicaHeader:
    """ASGI middleware: every HTTP response carries ``x-braze-replica: NAME``."""

    def __init__(self, app: Any, name: str) -> None:
        self.app, self.value = app, name.encode()

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), self.value)]}
            await send(message)
        await self.app(scope, receive, tagged)


class Replica:
    """One replica's state, independent of Ray: the model, its engine and the app.
    ``build_app()`` is what Ray Serve's ingress serves (``_deployment``)."""

    def __init__(self, model_path: str | None, embedder_path: str | None = None, max_batch: int = 8,
                 ctx: int | None = None, queue_limit: int = 256, api_key: str | None = None,
                 name: str | None = None, kv_dtype: str | None = None) -> None:
        from ..generate import kv_cache_dtype
        from ..models import load_embedder, load_llm
        from .engine import Engine
        embedder = load_embedder(embedder_path) if embedder_path else None
        self.engine = Engine(load_llm(model_path), embedder=embedder, max_batch=max_batch, ctx=ctx,
                             queue_limit=queue_limit, kv_dtype=kv_cache_dtype(kv_dtype), freeze=True).start()
        self.api_key = api_key
        self.name = name or f"pid-{os.getpid()}"

    def build_app(self) -> Any:
        from .app import create_app
        app = create_app(self.engine, api_key=self.api_key)
        app.add_middleware(_ReplicaHeader, name=self.name)
        return app

    def close(self) -> None:
        self.engine.close()


def _replica_name() -> str:
    """Ray's id of the replica this runs in, and the process id."""
    from ray import serve
    try:
        ctx = serve.get_replica_context()
        rid = getattr(getattr(ctx, "replica_id", None), "unique_id", None) or ctx.replica_tag
        return f"{rid} pid-{os.getpid()}"
    except Exception:  # not inside a replica (a test constructing it directly)
        return f"pid-{os.getpid()}"


def _deployment(replicas: int, cpus_per_replica: float, threads: int | None, max_ongoing: int) -> Any:
    """The Ray Serve deployment class: ``serve.ingress`` with the app built at replica
    start (``__serve_build_asgi_app__``, called after the constructor), since the app
    needs the replica's own engine."""
    from ray import serve

    @serve.ingress()
    class BrazeReplica:
        def __init__(self, model_path: str | None, embedder_path: str | None, max_batch: int, ctx: int | None,
                     queue_limit: int, api_key: str | None, kv_dtype: str | None) -> None:
            self.replica = Replica(model_path, embedder_path, max_batch, ctx, queue_limit, api_key,
                                   name=_replica_name(), kv_dtype=kv_dtype)

        def __serve_build_asgi_app__(self) -> Any:
            return self.replica.build_app()

        async def check_health(self) -> None:
            """Ray Serve calls this every ``health_check_period_s``; an exception (here:
            the engine's thread not taking a job within a minute: it runs jobs between
            steps, and a step is well under that) restarts the replica."""
            import asyncio
            if not self.replica.engine.alive:
                raise RuntimeError("the engine's thread has stopped")
            await asyncio.wait_for(asyncio.wrap_future(self.replica.engine.run(lambda: None)), 60)

        def __del__(self) -> None:
            replica = getattr(self, "replica", None)
            if replica is not None:
                replica.close()

    env = {var: str(threads) for var in THREAD_VARS} if threads else {}
    options: dict[str, Any] = {"num_cpus": cpus_per_replica}
    if env:
        options["runtime_env"] = {"env_vars": env}
    return serve.deployment(BrazeReplica, name="BrazeReplica", num_replicas=replicas, ray_actor_options=options,
                            max_ongoing_requests=max_ongoing, health_check_period_s=10, health_check_timeout_s=90)


def deploy(model_path: str | Path | None = None, replicas: int = 2, *, host: str = "127.0.0.1", port: int = 8000,
           api_key: str | None = None, max_batch: int = 8, ctx: int | None = None, queue_limit: int = 256,
           embedder_path: str | Path | None = None, threads: int | None = None, cpus_per_replica: float = 1.0,
           address: str | None = None, max_ongoing: int | None = None, ready_timeout: float = 600.0,
           kv_dtype: str | None = None) -> str:
    """Run ``replicas`` copies of the engine behind Ray Serve's HTTP proxy on
    ``host:port``; returns the base URL once ``/health`` answers through the proxy.

    Starts a local Ray cluster unless Ray is initialised already or ``address`` (or
    ``$RAY_ADDRESS``) names one to join. ``threads``: the kernels' threads in each
    replica (``BRAZE_NUM_THREADS``); ``cpus_per_replica``: the CPUs Ray reserves for
    each (replicas that do not fit wait for a node with room). ``max_ongoing``: the
    requests Ray's router hands one replica at a time (default ``2 * max_batch``: a
    batch running and one waiting in the engine's queue); more wait in Ray's queue and
    go to whichever replica frees first (Ray's own default, 5, would keep a replica's
    batch from ever filling)."""
    if replicas < 1:
        raise ValueError(f"replicas={replicas}: must be >= 1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray reports usage over the network unless told not to
    import ray
    from ray import serve
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    app = _deployment(replicas, cpus_per_replica, threads, max_ongoing or 2 * max_batch).bind(
        str(model_path) if model_path is not None else None, str(embedder_path) if embedder_path else None,
        max_batch, ctx, queue_limit, api_key, kv_dtype)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    _wait_ready(url, ready_timeout)
    return url


def _wait_ready(url: str, timeout: float) -> None:
    import urllib.error
    import urllib.request
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.5)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout:.0f} s ({last})")


def shutdown() -> None:
    """Stop Serve (its proxies and replicas, on the whole cluster) and disconnect from
    Ray, which stops a local cluster that this process started."""
    import ray
    from ray import serve
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m braze.serve.ray_serve",
                                 description="braze's OpenAI-compatible server, as replicas behind Ray Serve's proxy")
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--embedder", help="embedding model for /v1/embeddings (default: none)")
    ap.add_argument("--replicas", type=int, default=2, help="engine replicas (default 2)")
    ap.add_argument("--host", default="127.0.0.1", help="the proxy's address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="the proxy's port (default 8000)")
    ap.add_argument("--api-key", help="require Authorization: Bearer KEY")
    ap.add_argument("--max-batch", type=int, default=8, help="sequences per replica's batch (default 8)")
    ap.add_argument("--ctx", type=int, help="context per sequence (default: the model's)")
    ap.add_argument("--queue-limit", type=int, default=256, help="requests waiting per replica before 429 (default 256)")
    ap.add_argument("--kv-dtype", choices=KV_DTYPES, help="the KV cache's element type (default float16)")
    ap.add_argument("--threads", type=int, help="kernel threads per replica (BRAZE_NUM_THREADS)")
    ap.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs Ray reserves per replica (default 1)")
    ap.add_argument("--max-ongoing", type=int,
                    help="requests Ray hands one replica at a time (default 2 x --max-batch)")
    ap.add_argument("--address", help="join this Ray cluster (default: $RAY_ADDRESS, else start a local one)")
    args = ap.parse_args(argv)
    try:
        import ray  # noqa: F401
    except ImportError:
        print("braze: Ray Serve is not installed: pip install 'ray[serve]' (braze's 'scale' extra)", file=sys.stderr)
        return 1
    url = deploy(args.model, args.replicas, host=args.host, port=args.port, api_key=args.api_key,
                 max_batch=args.max_batch, ctx=args.ctx, embedder_path=args.embedder, threads=args.threads,
                 queue_limit=args.queue_limit, kv_dtype=args.kv_dtype,
                 cpus_per_replica=args.cpus_per_replica, address=args.address, max_ongoing=args.max_ongoing)
    print(f"braze: {args.replicas} replica(s) serving at {url}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
