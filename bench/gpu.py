"""GPU benchmark (issue 16, part 5): braze's cuda device beside torch eager and torch.compile.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 bench/gpu.py --out $OUT/gpu.json   # on a GPU
    PYTHONPATH=. python3 bench/gpu.py --quick --out $OUT/gpu.json              # ~3 minutes
    PYTHONPATH=.:/tmp/torchsite .venv/bin/python bench/gpu.py --smoke          # here, no GPU

Sections (``--only elementwise,attention,llm``; each runs inside its own guard, so a
failure prints its traceback and the others still run: one run on a lent GPU gives every
number it can):

- **elementwise**: custom-erf GELU, softmax and LayerNorm, the programs of
  ``bench/fusion.py`` (imported: written once over a module ``m``, so braze and torch
  run the same formula op for op) at the fusion benchmark's shapes and at GPU-sized ones
  (~256 MiB per float32 operand, far past launch overhead and the 50 MiB L2), in float32
  and bfloat16 (inputs rounded to bfloat16 once, so both sides read the same values).
  The programs' one dtype-less constant (``where(x < 0, -1.0, 1.0)``) is cast to the
  case's dtype on both sides (braze does not promote; torch would promote to float32).
  Beside them ``scale`` (``x * 2.0``, GPU-sized only): the simplest streaming kernel, what
  braze's element-wise kernels reach by their launch structure alone. The full run also
  times the fusion benchmark's tiny smoke shapes in float32 (what a call costs beside
  its kernel); ``--quick`` runs the GPU-sized shapes only.
- **attention**, **llm**: ``run(log)`` of ``bench/gpu_attention.py`` and
  ``bench/gpu_llm.py`` when those modules exist; keyword arguments ``quick`` / ``smoke``
  are passed when their ``run`` takes them (in ``--smoke`` a ``run`` without ``smoke`` is
  skipped). ``run`` may return a JSON-able dict (its ``"markdown"``, if any, goes with
  the tables), a markdown string, or nothing: the markdown tables it printed (lines
  starting with "|") are taken then, and all it printed is kept in the JSON.

Timing, the same for every variant: wall time (``time.perf_counter``) around one call
and its synchronization (braze: ``y = prog(...); y.realize(); braze.cuda.synchronize()``;
torch: the call, then ``torch.cuda.synchronize()``), after warm-up calls; the median of
``--reps`` (>= 10 on a GPU) such calls. So launch and Python overhead are in it, as a
user sees them. After braze's synchronize, ``torch.cuda.synchronize()`` (a device-wide
wait) is timed too: if that tail is not negligible, braze's synchronize did not wait for
its kernels, which the run says, and then the time counts to the end of the tail. Also
reported: "back to back", per call over 20 calls with one synchronize at the end (what
the kernels cost when launches overlap them). First calls (braze: plan + Triton compile;
torch.compile: its compile) are timed separately. GB/s is the bytes a kernel must move at
least (every input read once, the output written once) over the time, and "% copy" its
fraction of the device-to-device copy bandwidth measured at the start of the same run
(torch ``copy_`` of 1 GiB: bytes read + written / time), the HBM ceiling reached in
practice. Errors: max abs difference of braze (and of torch.compile) from torch eager,
both in the case's dtype; for bfloat16 also each against torch in float32 on the same
(rounded) inputs.

``--smoke`` runs all of it at tiny sizes with the cuda device under Triton's interpreter
(``BRAZE_CUDA_INTERPRET=1``) and torch on the CPU: the script's own test.

Writes the results as JSON to ``--out`` (after every case, so a run cut short keeps what it
measured) and the markdown beside it (``.md``), and prints the markdown at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import importlib.util
import inspect
import io
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
# Run as a script (``python3 bench/gpu.py``), Python puts bench/ itself first on the path,
# where its modules (attention, llm, shapes...) would shadow installed ones: the repo root
# goes there instead, so ``bench.*`` and ``braze`` import as packages.
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == _ROOT / "bench":
    sys.path[0] = str(_ROOT)
elif str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.gpu_device import Log, copy_bandwidth, describe, log, open_device  # noqa: E402
from bench.gpu_elementwise import DTYPES, PROGRAMS, elementwise, elementwise_md  # noqa: E402
from bench.harness import machine  # noqa: E402

SECTIONS = ("elementwise", "attention", "llm")  # the last two: bench/gpu_<name>.py, when present
COPY_BYTES = 1 << 30


# --------------------------------------------------------------------------- optional sections

class _Tee(io.TextIOBase):
    """stdout that is also kept: a section's printed tables go into the results too."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return int(self.real.write(text))

    def flush(self) -> None:
        self.real.flush()


def sibling(name: str, kwargs: dict[str, bool], out: dict[str, Any], log: Log) -> None:
    """Run ``bench/<name>.py``'s ``run(log, ...)`` if the module exists. What it prints
    (through ``log`` or ``print``) is kept under "output"; unless ``run`` returns
    markdown, the tables it printed (lines starting with "|") stand for it, also when it fails."""
    if importlib.util.find_spec(f"bench.{name}") is None:
        out["skipped"] = f"bench/{name}.py does not exist"
        log(f"{name}: skipped ({out['skipped']})")
        return
    mod = importlib.import_module(f"bench.{name}")
    params = inspect.signature(mod.run).parameters
    if kwargs.get("smoke") and "smoke" not in params:
        out["skipped"] = "its run() takes no smoke flag: not run in --smoke"
        log(f"{name}: skipped ({out['skipped']})")
        return
    tee = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            r = mod.run(log, **{k: v for k, v in kwargs.items() if k in params})
    finally:  # what it printed before a failure counts too
        out["output"] = tee.kept.getvalue()
        table = [line for line in out["output"].splitlines() if line.startswith("|")]
        if table:
            out["markdown"] = f"{name} (the tables bench/{name}.py printed):\n\n" + "\n".join(table)
    if isinstance(r, str):
        out["markdown"] = r
    elif isinstance(r, dict):
        out.update(r)


# --------------------------------------------------------------------------- report

def markdown(res: dict[str, Any]) -> str:
    """The run as markdown, in bench/RESULTS.md's form: a heading naming the GPU, the
    command, then each section's tables."""
    g = res["gpu"]
    cp = res.get("copy") or {}
    head = (f"## GPU (issue 16): {g.get('gpu', 'no GPU, torch on the ' + g['torch_device'])}, {res['date']}, "
            f"braze {res['machine'].get('commit', '?')}")
    lines = [head, "", f"    {res['command']}", "",
             f"driver {g.get('driver')}, CUDA {g.get('cuda')}, torch {g['torch']}, Triton {g.get('triton')}; "
             f"braze's cuda device: {g['braze_cuda']}"
             + (" (under Triton's interpreter)" if g.get("braze_interpreting") else "") + ".  "]
    if cp:
        lines.append(f"Copy bandwidth (torch `copy_` of {cp['bytes'] / 2**30:.2f} GiB, read + write): "
                     f"**{cp['gbs']:.0f} GB/s** median, {cp['gbs_best']:.0f} best"
                     + (f"; spec {g['spec_bandwidth_gbs']:.0f} GB/s" if g.get("spec_bandwidth_gbs") else "")
                     + ". % copy below is a fraction of the median.")
    for name, sec in res["sections"].items():
        if name == "elementwise":
            lines += elementwise_md(sec, res["reps"])
        elif sec.get("markdown"):
            lines += ["", sec["markdown"].rstrip()]
        if sec.get("skipped"):
            lines += ["", f"{name}: skipped ({sec['skipped']})"]
        if sec.get("error"):
            lines += ["", f"{name}: FAILED: {sec['error'].strip().splitlines()[-1]}"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main

def guarded(name: str, fn: Callable[[dict[str, Any]], None], res: dict[str, Any], sink: Callable[[], None],
            over: Callable[[], bool], log: Log) -> None:
    """Run one section into ``res["sections"][name]``; a failure is printed and recorded,
    and the run goes on."""
    sec: dict[str, Any] = {}
    res["sections"][name] = sec
    if over():
        sec["skipped"] = "past --budget"
        log(f"{name}: skipped (past --budget)")
        return
    t0 = time.perf_counter()
    try:
        fn(sec)
    except Exception:  # noqa: BLE001 - device time is precious: every other section still runs
        tb = traceback.format_exc()
        sec["error"] = tb
        log(f"{name}: FAILED\n{tb}")
    sec["seconds"] = round(time.perf_counter() - t0, 1)
    sink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu.py", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/gpu-<date>[-smoke].json); "
                    "the markdown goes beside it as .md")
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    ap.add_argument("--quick", action="store_true", help="GPU-sized shapes only, 10 reps (fits ~3 minutes)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, braze under Triton's interpreter, "
                    "torch on the CPU: tests the script without a GPU")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per variant (default 20; quick 10; smoke 2)")
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated: scale (x * 2.0) or "
                    "bench/fusion.py's programs")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--budget", type=float, default=None, help="seconds: start no case or section after this "
                    "(the run then ends cleanly, inside the caller's time limit)")
    args = ap.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        ap.error(f"--only: no section {', '.join(sorted(unknown))} (sections: {', '.join(SECTIONS)})")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.reps is None:
        args.reps = {"smoke": 2, "quick": 10, "full": 20}[mode]
    date = _dt.date.today().isoformat()
    out = Path(args.out) if args.out else _ROOT / "bench" / "results" / f"gpu-{date}{'-smoke' if args.smoke else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    dev = open_device(args.smoke)
    res: dict[str, Any] = {"date": date, "mode": mode, "reps": args.reps,
                           "command": "python3 bench/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
                           "machine": machine(), "gpu": describe(dev), "sections": {}}
    g = res["gpu"]
    log(f"GPU: {g.get('gpu', 'none: torch on ' + dev.name)}; driver {g.get('driver')}; CUDA {g.get('cuda')}; "
        f"torch {g['torch']}; Triton {g.get('triton')}; braze's cuda device: {g['braze_cuda']}")

    def sink() -> None:  # after every case: a run cut short keeps what it measured, table included
        res["seconds"] = time.perf_counter() - t_start
        res["markdown"] = markdown(res)
        out.write_text(json.dumps(res, indent=1, default=str) + "\n")
        out.with_suffix(".md").write_text(res["markdown"])

    def over() -> bool:
        return args.budget is not None and time.perf_counter() - t_start > args.budget

    try:
        res["copy"] = copy_bandwidth(dev, 1 << 22 if args.smoke else COPY_BYTES, 5 if args.smoke else 30)
        log(f"copy bandwidth: {res['copy']['gbs']:.0f} GB/s (median), {res['copy']['gbs_best']:.0f} best")
    except Exception:  # noqa: BLE001
        res["copy"] = None
        log("copy bandwidth: FAILED\n" + traceback.format_exc())
    sink()
    copy_gbs = res["copy"]["gbs"] if res["copy"] else 0.0
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    flags = {"quick": args.quick, "smoke": args.smoke}
    for name in only:
        if name == "elementwise":
            guarded(name, lambda sec: elementwise(dev, args, mode, copy_gbs, sink, over, sec, log), res, sink, over,
                    log)
        else:
            module = f"gpu_{name}"
            guarded(name, lambda sec: sibling(module, flags, sec, log), res, sink, over, log)
    sink()
    md = res["markdown"]
    log(f"wrote {out} and {out.with_suffix('.md')} ({time.perf_counter() - t_start:.0f} s)")
    print("\n" + md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
