#!/bin/bash
# One lent GPU's checks, in order of value, each bounded so that one failing step leaves
# the others their time: the machine's facts, the device runtime's own tests, the kernel
# tests on the GPU, then the benchmark. Logs and results go to $OUT (the device tool
# brings that folder back). Usage: bench/gpu_session.sh [bench seconds] [bench args...]
set -u
OUT=${OUT:-/tmp/braze-gpu}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
BENCH_S=${1:-240}
shift || true

step() {  # step NAME SECONDS COMMAND...: run bounded, log to $OUT/NAME.log, show its tail
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "=== $name: rc=$? in $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
python3 - <<'PY'
import importlib.metadata as m, sys
def version(p):
    try:
        return m.version(p)
    except m.PackageNotFoundError:
        return "absent"
print("python", sys.version.split()[0], *(f"{p}={version(p)}" for p in
      ("torch", "triton", "cuda-core", "cuda-bindings", "numpy", "sympy", "tokenizers", "jinja2", "tqdm", "pytest")))
PY
step runtime 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_on_gpu.py
step kernels 180 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu
step bench "$BENCH_S" python3 bench/gpu.py --out "$OUT/gpu.json" "$@"
