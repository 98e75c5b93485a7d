"""The fusion benchmark keeps working: ``python -m bench.fusion --smoke`` on tiny shapes.

No timing is asserted (the machine is shared and noisy); only that every program runs
in every variant, that braze's results agree with the hand-written C, and that the
report has what the issue asks for (medians, ratios, counters, Python overhead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from braze.stream import fusion_enabled

# Each benchmark sets BRAZE_FUSION around each of its variants itself: under
# BRAZE_FUSION=0 a smoke test would repeat the fused run's exactly.
IDENTICAL_UNFUSED = pytest.mark.skipif(not fusion_enabled(), reason="the same run as in the fused suite")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@IDENTICAL_UNFUSED
def test_fusion_benchmark_smoke(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("BRAZE_FUSION", None)  # the benchmark sets it around each variant itself
    proc = subprocess.run(
        # --keep-cache: the machine's kernel cache, not a fresh one (gcc for every kernel
        # on every run: most of the test's time; what the report says is the same)
        [sys.executable, "-m", "bench.fusion", "--smoke", "--no-torch", "--threads", "1,2", "--out", str(tmp_path),
         "--keep-cache"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    files = list(tmp_path.glob("fusion-*-smoke.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())
    names = {p["program"] for p in res["programs"]}
    assert names == {"gelu_ref", "gelu_erf", "gelu_custom", "softmax", "softmax_fn", "layernorm", "rmsnorm", "rope"}
    for p in res["programs"]:
        vs = p["variants"]
        assert {"c", "braze", "unfused"} <= set(vs)
        for name, v in vs.items():
            assert set(v["median_ms"]) == {"1", "2"}, (p["program"], name)
            assert all(t > 0 for t in v["median_ms"].values())
            if name != "c":
                assert v["max_abs_err_vs_c"] < 1e-4, (p["program"], name, v["max_abs_err_vs_c"])
        for name in ("braze", "unfused"):
            s = vs[name]["stats"]
            assert s["kernel_launches"] >= 1 and "bytes_allocated" in s and "peak_bytes" in s
        assert vs["braze"]["first_call_ms"] > 0
    o = res["overhead"]
    assert o["record_us_per_op_tensor"] > 0 and o["program10_us"]["braze"] > 0
    md = res["markdown"]
    assert "| program |" in md and "(x) = ratio" in md
    assert "| gelu_custom |" in proc.stdout


@pytest.mark.slow
@IDENTICAL_UNFUSED
def test_attention_benchmark_smoke(tmp_path: Path) -> None:
    """``bench.attention`` on tiny shapes, in this process: every program runs in every
    variant, every result agrees with numpy, and the report has the issue's columns."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # bench/ is beside braze in the checkout, not installed
    from bench.attention import main
    from braze.runtime.cpu import get_num_threads

    threads_before = get_num_threads()
    # --keep-cache, as in test_fusion_benchmark_smoke: its chain kernels took most of the time
    assert main(["--smoke", "--threads", "1,2", "--out", str(tmp_path), "--keep-cache"]) == 0
    assert get_num_threads() == threads_before  # the settings it changed are put back
    assert os.environ.get("BRAZE_SHAPE_VARIANTS") != "1000"
    files = list(tmp_path.glob("attention-*-smoke.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())
    names = {p["program"] for p in res["programs"]}
    assert names == {"softmax_16x32", "softmax_2x256", "prefill_N16", "prefill_N16_causal", "prefill_N64",
                     "prefill_N64_causal", "decode_N64"}
    has_torch = res["torch"] is not None
    for p in res["programs"]:
        vs = p["variants"]
        want = {"braze", "unfused", "numpy"} | ({"c"} if p["kind"] == "softmax" else {"user", "gemm"})
        want |= {"user_jit"} if p["kind"] == "decode" else set()
        assert want | ({"torch"} if has_torch else set()) == set(vs), p["program"]
        for name, v in vs.items():
            assert set(v["median_ms"]) == {"1", "2"}, (p["program"], name)
            assert all(t > 0 for t in v["median_ms"].values())
            if name != "gemm":  # the matmuls alone: timed, not an attention result
                assert v["max_abs_err"] < 1e-5, (p["program"], name, v["max_abs_err"])
        for name in ("braze", "unfused") + (("user",) if p["kind"] != "softmax" else ()):
            s = vs[name]["stats"]
            assert s["kernel_launches"] >= 1 and s["peak_above_live_before"] >= 0 and "bytes_allocated" in s
            assert vs[name]["first_call_ms"] > 0
    md = res["markdown"]
    assert "| softmax_16x32 | 1 |" in md and "| prefill_N64_causal |" in md and "peak above inputs" in md


def test_peak_benchmark_smoke() -> None:
    """``python -m bench.peak --smoke``: every row is measured (no speed is asserted)."""
    proc = subprocess.run([sys.executable, "-m", "bench.peak", "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "GFLOP/s" not in line]
    assert [r.split(" | ")[0][2:].split(" ")[0] for r in rows] == ["fma8", "fma16", "braze_tile", "numpy_sgemm", "numpy"]
    assert all(float(r.rstrip(" |").split(" | ")[-1]) > 0 for r in rows)
