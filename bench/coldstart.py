"""A cold process's first ``braze generate``: what it compiles, and how long it waits.

``python -m bench.coldstart [--runs N] [--tree A --tree B ...]`` runs ``braze generate
"The capital of France is" --max-tokens 16`` in a fresh process over an empty
``BRAZE_CACHE_DIR``, once per tree per round (trees alternate, so load from other work
falls on each alike), and reports per run:

- ``compile_wait``: wall time the process spent in ``units.compile_units`` (every compile
  it waited on, libraries included): the critical path of compiling; ``prompt_wait`` the
  prompt's part of it (the waits inside the prefill call);
- ``gcc_cpu``: CPU time of the compiler runs this process made (each one's rusage),
  those compiled ahead or as libraries included; the background process that builds the
  whole modules (nice 19) is not in it;
- ``wall``: the whole command, start to exit.

After each run the bench waits until that run's background compiles (the whole modules,
``units.later``, at nice 19: they outlive the process) are done, so that no round starts
while an earlier one still compiles: each is a first run on a machine where nothing of
braze is compiling, as a user's first run would be.

The child patches ``subprocess.run`` inside ``braze.runtime.cpu`` to take each compiler
run's rusage, and wraps ``units.compile_units`` in a timer; nothing else changes.
``--empty-runtime`` points ``BRAZE_RUNTIME_DIR`` at an empty directory (a machine whose
``make install`` did not build the machine-wide libraries); otherwise the default one,
as ``make install`` leaves it, is used (a tree without libraries ignores it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The capital of France is"

CHILD = r"""
import json, os, resource, subprocess, sys, tempfile, threading, time
t_start = time.perf_counter()
from braze.runtime import cpu, units
log = {"gcc": [], "waits": []}
real_run = subprocess.run

class _Shim:
    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def run(args, *a, input=None, capture_output=False, text=False, **kw):
        if "-shared" not in args:
            return real_run(args, *a, input=input, capture_output=capture_output, text=text, **kw)
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=out, stderr=err)
            p.stdin.write((input or "").encode())
            p.stdin.close()
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0), err.seek(0)
            so, se = out.read(), err.read()
        t1 = time.perf_counter()
        if os.environ.get("COLDSTART_DUMP"):
            with open(os.path.join(os.environ["COLDSTART_DUMP"], f"unit{len(log['gcc'])}.c"), "w") as f:
                f.write(input or "")
        log["gcc"].append({"wall": t1 - t0, "cpu": ru.ru_utime + ru.ru_stime, "chars": len(input or ""),
                           "t0": t0 - t_start, "thread": threading.current_thread().name})
        return subprocess.CompletedProcess(args, p.returncode, so.decode() if text else so, se.decode() if text else se)

cpu.subprocess = _Shim()
real_cu = units.compile_units

log["starts"], log["prefill"] = [], []

def timed_cu(*a, **kw):
    t0 = time.perf_counter()
    try:
        return real_cu(*a, **kw)
    finally:
        log["starts"].append(t0 - t_start)
        log["waits"].append(time.perf_counter() - t0)

units.compile_units = timed_cu
import braze.plan as plan
plan.units.compile_units = timed_cu
from braze import generate
real_prefill = generate.PrefillStep.__call__

def timed_prefill(self, *a, **kw):
    t0 = time.perf_counter()
    try:
        return real_prefill(self, *a, **kw)
    finally:
        log["prefill"].append((t0 - t_start, time.perf_counter() - t_start))

generate.PrefillStep.__call__ = timed_prefill
from braze.cli import main
rc = main(["generate", sys.argv[1], "--max-tokens", "16"])
log["gcc_cpu"] = sum(g["cpu"] for g in log["gcc"])
log["total"] = time.perf_counter() - t_start
print("COLDSTART " + json.dumps(log), file=sys.stderr)
sys.exit(rc)
"""


def _settle(cache: Path, quiet: float = 1.5, limit: float = 300.0) -> float:
    """Wait until the run's background compiles are done (no ``.later-`` marker, which a
    background compile keeps until its modules are built, and no compiler output in
    flight, for ``quiet`` seconds), so that they do not overlap the next round: each round
    is a first run on a machine where nothing of braze is compiling. Seconds waited."""
    t0 = time.perf_counter()
    calm_since = t0
    while time.perf_counter() - t0 < limit:
        busy = any(n.startswith(".later-") or n.endswith(".so.tmp") for n in os.listdir(cache))
        now = time.perf_counter()
        if busy:
            calm_since = now
        elif now - calm_since >= quiet:
            break
        time.sleep(0.1)
    return time.perf_counter() - t0


def one_run(tree: Path, python: str, empty_runtime: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="braze-cold-") as d:
        os.chmod(d, 0o700)
        env = dict(os.environ, BRAZE_CACHE_DIR=d, PYTHONPATH=str(tree))
        if empty_runtime:  # a machine where make install did not build the libraries
            env["BRAZE_RUNTIME_DIR"] = os.path.join(d, "runtime")
        t0 = time.perf_counter()
        p = subprocess.run([python, "-c", CHILD, PROMPT], env=env, capture_output=True, text=True, cwd=tree)
        wall = time.perf_counter() - t0
        line = [ln for ln in p.stderr.splitlines() if ln.startswith("COLDSTART ")]
        if p.returncode != 0 or not line:
            raise SystemExit(f"{tree}: exit {p.returncode}\n{p.stderr[-3000:]}")
        log = json.loads(line[-1].removeprefix("COLDSTART "))
        waited = _settle(Path(d))
        if os.environ.get("COLDSTART_VERBOSE"):
            for g in log["gcc"]:
                print(f"  gcc at {g['t0']:.2f} s: {g['wall']:.2f} s wall, {g['cpu']:.2f} s cpu, {g['chars']} chars, "
                      f"{g['thread']}")
            print(f"  waits {[round(w, 2) for w in log['waits']]}")
        in_prefill = [w for t, w in zip(log["starts"], log["waits"]) if any(a <= t <= b for a, b in log["prefill"])]
        return {"wall": wall, "settle": waited, "compile_wait": sum(log["waits"]), "prompt_wait": sum(in_prefill),
                "gcc_cpu": log["gcc_cpu"], "n_gcc": float(len(log["gcc"])), "text": p.stdout.strip()}  # type: ignore[dict-item]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--empty-runtime", action="store_true", help="no machine-wide libraries built beforehand")
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in (args.tree or ["."])]
    print(f"load before: {os.getloadavg()}")
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(args.runs):
        for t in trees:
            res = one_run(t, args.python, args.empty_runtime)
            results[t].append(res)
            print(f"round {r} {t.name}: wall {res['wall']:.2f} s, compile wait {res['compile_wait']:.2f} s "
                  f"(prompt {res['prompt_wait']:.2f}), "
                  f"gcc cpu {res['gcc_cpu']:.2f} s ({res['n_gcc']:.0f} runs), background done {res['settle']:.1f} s "
                  f"after, load {os.getloadavg()[0]:.2f}",
                  flush=True)
    texts = {t: {r["text"] for r in rs} for t, rs in results.items()}
    for t, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall", "compile_wait", "prompt_wait", "gcc_cpu")}
        lo = {k: min(r[k] for r in rs) for k in med}
        hi = {k: max(r[k] for r in rs) for k in med}
        print(f"{t}: " + ", ".join(f"{k} median {med[k]:.2f} [{lo[k]:.2f}-{hi[k]:.2f}]" for k in med))
        print(f"  text: {texts[t]}")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
