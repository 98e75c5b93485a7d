"""The long fuzz campaign (``make fuzz``): each target's cases drawn by hypothesis,
run, and counted by outcome, in worker processes so that a crash is counted (and the
campaign goes on) rather than ending it.

    python -m tests.fuzz.campaign                  # the issue's scale (about 30 min on 2 cores)
    python -m tests.fuzz.campaign --scale 0.05     # a quick look

Prints one table of counts (targets x outcomes) and, for every case that was not
ok or typed, its detail; exits 1 if there was any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, given, seed, settings

from . import mutators as M
from . import targets as T

#: target -> (strategy, runner, cases at scale 1): 10,000 GGUF files (structure and
#: metadata values), 2,000 safetensors headers and embedder directories, 500 CLI
#: invocations and 500 templates
TARGETS: dict[str, tuple[Any, Callable[..., tuple[str, str]], int]] = {
    "gguf_structure": (M.gguf_bytes(), T.run_gguf_bytes, 6000),
    "gguf_metadata": (M.gguf_metadata(), T.run_gguf_metadata, 4000),
    "safetensors": (M.safetensors_bytes(), T.run_safetensors, 1000),
    "embedder_dir": (M.embedder_edits(), T.run_embedder, 1000),
    "cli": (M.cli_case(), lambda case: T.run_cli(*case), 500),
    "template": (M.template_case(), T.run_template, 500),
}


def worker(target: str, n: int, at_seed: int) -> None:
    """Run ``n`` cases of ``target``, one JSON line per case on stdout."""
    strategy, runner, _ = TARGETS[target]

    @seed(at_seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def each(case: Any) -> None:
        outcome, detail = runner(case)
        sys.stdout.write(json.dumps({"o": outcome, "d": detail if outcome not in ("ok", "typed") else ""}) + "\n")
        sys.stdout.flush()

    each()


def run_target(target: str, n: int, base_seed: int) -> tuple[Counter[str], list[str]]:
    counts: Counter[str] = Counter()
    details: list[str] = []
    chunk = 0
    while sum(counts.values()) < n:
        left = n - sum(counts.values())
        proc = subprocess.run([sys.executable, "-m", "tests.fuzz.campaign", "--worker", target, str(left),
                               str(base_seed + chunk)], capture_output=True, text=True,
                              timeout=max(600, 30 * left), env=dict(os.environ))
        ran = 0
        for line in proc.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            ran += 1
            counts[rec["o"]] += 1
            if rec["d"]:
                details.append(f"[{target}] {rec['o']}: {rec['d']}")
        if proc.returncode != 0:  # the process died (or hypothesis itself stopped): a crash
            counts["crash"] += 1
            details.append(f"[{target}] crash: exit {proc.returncode}: {proc.stderr[-1500:]}")
        elif ran == 0:
            break  # hypothesis found nothing more to draw
        chunk += 1
    return counts, details


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.campaign")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every target's case count")
    p.add_argument("--only", nargs="*", choices=sorted(TARGETS), help="run these targets only")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.environ.setdefault("BRAZE_FUSION", "0")  # the reference executor: no compiles per shape
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return 0
    total: Counter[str] = Counter()
    bad: list[str] = []
    print(f"{'target':<16}" + "".join(f"{o:>10}" for o in T.OUTCOMES) + f"{'cases':>8}{'seconds':>9}")
    for target, (_, _, n) in TARGETS.items():
        if args.only and target not in args.only:
            continue
        t0 = time.perf_counter()
        counts, details = run_target(target, max(1, round(n * args.scale)), args.seed * 1000)
        total.update(counts)
        bad += details
        print(f"{target:<16}" + "".join(f"{counts[o]:>10}" for o in T.OUTCOMES)
              + f"{sum(counts.values()):>8}{time.perf_counter() - t0:>9.0f}", flush=True)
    print(f"{'total':<16}" + "".join(f"{total[o]:>10}" for o in T.OUTCOMES) + f"{sum(total.values()):>8}")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
