"""Batched decoding steps: the server's ``PagedRunner`` bucket replays at B rows.

One step decodes B sequences together (``braze serve``'s continuous batching): each row
at its own position (a context of ``--ctx`` tokens, its own blocks of the paged cache),
the step captured and replayed as the server replays it. Times are the replay's wall
time, median of ``--reps`` after warm-up, per batch size and thread count.

    .venv/bin/python -m bench.steps [--batches 1,2,4,8,16] [--threads 1,2] [--reps 10]
    .venv/bin/python -m bench.steps --against /work/main   # before/after, side by side

With ``--against DIR``, the same measurement runs in two worker processes, one on this
checkout and one on the braze at DIR (its own Python path), asked in turn, round by
round (``--rounds``), so both see the same load; each cell is the median over rounds of
each round's median. ``--kv-dtypes float32,float16`` does the same with one worker per
KV cache type on this checkout. Prints a markdown table with the load average before
and after.

Every position of the pool holds a random value before the steps run (every page
resident, as in a server that has been serving): attention then reads memory, not the
zero page an unwritten pool maps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


CLOCKS = ("wall", "cpu")


def _runner(path: str, ctx: int, kv_dtype: str) -> Any:
    import numpy as np

    from braze.dtypes import as_dtype
    from braze.models import load_llm
    from braze.serve.runner import PagedRunner
    loaded = load_llm(path)
    # (only when asked: an --against tree may predate the parameter)
    runner = PagedRunner(loaded.model, 2 * ctx + 16, 16, **({"kv_dtype": as_dtype(kv_dtype)} if kv_dtype else {}))
    rng = np.random.default_rng(0)
    for pools in runner.pools:
        for pool in pools:
            a = pool.numpy()
            a[...] = rng.standard_normal(a.shape).astype(a.dtype)
    return runner


def _step_ms(runner: Any, batch: int, ctx: int, reps: int) -> list[tuple[float, float]]:
    """``reps`` timed replays of a B-row decoding step, each row at position ctx - 1:
    (wall, CPU time of the calling thread) in ms each."""
    from braze.serve.runner import BLOCK_SIZE
    blocks = -(-ctx // BLOCK_SIZE)
    k = runner._bucket(batch, 1, 1 << max(0, (blocks - 1).bit_length()))
    k.ids[:] = 1
    for i in range(batch):  # rows share nothing: blocks of their own, as distinct requests
        own = [1 + i * blocks + j for j in range(blocks)]
        k.index.pos[i, 0] = ctx - 1
        k.index.slots[i] = own[-1] * BLOCK_SIZE + (ctx - 1) % BLOCK_SIZE
        runner._table(k.index.table[i], own)
    for _ in range(6):  # recorded twice, captured, then warm replays
        runner._run(k, [1] * batch, prefill=False)
    assert k.capture is None or k.capture.ready, k.capture.reason if k.capture else ""
    out = []
    for _ in range(reps):
        t, c = time.perf_counter(), time.thread_time()
        runner._run(k, [1] * batch, prefill=False)
        out.append(((time.perf_counter() - t) * 1e3, (time.thread_time() - c) * 1e3))
    return out


def worker(path: str, ctx: int, kv_dtype: str) -> None:
    """Answers lines "batch threads reps" on stdin with a JSON list of step times (ms,
    wall and the calling thread's CPU time)."""
    import braze
    runner = _runner(path, ctx, kv_dtype)
    print(f"ready {Path(braze.__file__).resolve()}", flush=True)  # which braze it runs
    for line in sys.stdin:
        batch, threads, reps = (int(v) for v in line.split())
        braze.set_num_threads(threads)
        print(json.dumps(_step_ms(runner, batch, ctx, reps)), flush=True)


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--ctx", type=int, default=64, help="tokens each row attends over")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", default=None, help="another braze checkout: the 'before' column")
    ap.add_argument("--kv-dtypes", default="", help="KV cache types, one worker each (default: the runner's)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from bench.harness import model_file
    path = model_file(args.model, "bench.steps")
    if path is None:
        return 1
    if args.worker:
        worker(path, args.ctx, args.kv_dtypes)
        return 0
    here = str(Path(__file__).resolve().parent.parent)
    kinds = [d for d in args.kv_dtypes.split(",") if d]
    trees = [(f"after {d}" if d else "after", here, d) for d in kinds or [""]] \
        + ([("before", str(Path(args.against).resolve()), "")] if args.against else [])
    procs = {}
    for name, tree, kv in trees:
        env = dict(os.environ, PYTHONPATH=tree)
        # run as a script from the tree's root: `-m` would put this checkout's directory
        # first on the path, and its braze with it
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--ctx", str(args.ctx), "--kv-dtypes", kv]
        if args.model:
            cmd += ["--model", args.model]
        env["PYTHONPATH"] = os.pathsep.join([tree, here])  # braze from its tree
        # 1..16 rows are five shapes of one program: past the default 4, one would run on
        # the reference executor, which the server (at most 8 rows a step) never meets
        env.setdefault("BRAZE_SHAPE_VARIANTS", "8")
        procs[name] = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True)
        line = procs[name].stdout.readline()  # type: ignore[union-attr]
        if line.strip() != f"ready {Path(tree) / 'braze' / '__init__.py'}":
            print(f"bench.steps: the {name} worker did not start on {tree}'s braze: {line!r}", file=sys.stderr)
            return 1
    load0 = _loadavg()
    batches = [int(v) for v in args.batches.split(",")]
    threads = [int(v) for v in args.threads.split(",")]
    cells: dict[tuple[str, str, int, int], list[float]] = {}
    for _ in range(args.rounds):
        for t in threads:
            for b in batches:
                for name, _tree, _kv in trees:
                    p = procs[name]
                    p.stdin.write(f"{b} {t} {args.reps}\n")  # type: ignore[union-attr]
                    p.stdin.flush()  # type: ignore[union-attr]
                    times = json.loads(p.stdout.readline())  # type: ignore[union-attr]
                    for i, clock in enumerate(CLOCKS):
                        cells.setdefault((clock, name, t, b), []).append(statistics.median(v[i] for v in times))
    for p in procs.values():
        p.stdin.close()  # type: ignore[union-attr]
        p.wait()
    names = [n for n, _, _ in trees]
    print(f"load average before {load0}, after {_loadavg()}; median of {args.reps} replays, "
          f"median over {args.rounds} rounds, ms; context {args.ctx}")
    for clock in CLOCKS:
        # one thread's step runs on the calling thread: its CPU time leaves out the time
        # other processes held the core (on a loaded machine, the steadier number)
        ts = threads if clock == "wall" else [t for t in threads if t == 1]
        if not ts:
            continue
        print(f"\n{clock} ms:")
        print("| B | " + " | ".join(f"{t} thr {n}" for t in ts for n in names) + " |")
        print("|---|" + "---|" * (len(ts) * len(names)))
        for b in batches:
            row = " | ".join(f"{statistics.median(cells[(clock, n, t, b)]):.1f}" for t in ts for n in names)
            print(f"| {b} | {row} |")
        for t in ts:
            for n in names:
                one = statistics.median(cells[(clock, n, t, batches[0])])
                ratios = ", ".join(f"B={b} {statistics.median(cells[(clock, n, t, b)]) / one:.2f}x" for b in batches[1:])
                print(f"{clock}, {t} thread(s), {n}: per step against B={batches[0]}: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
