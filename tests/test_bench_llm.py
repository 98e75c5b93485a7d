"""``braze bench llm`` keeps working: ``bench.llm.main`` on tiny settings (one thread
count, 8 prompt tokens, 4 decoded, 8 timed steps), without llama.cpp.

No speed is asserted (the machine is shared and noisy): only that every number the
issue asks for is there and positive, that the table is printed, and that the chart is
a PNG whose image data has the size its header says."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from braze.stream import fusion_enabled

ROOT = Path(__file__).resolve().parent.parent


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the inflated image data (filter bytes included) of an RGB PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert (depth, color) == (8, 2)  # 8-bit RGB
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert kind == b"IEND"
    return width, height, zlib.decompress(idat)


def test_png_encoder_round_trips() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.png import encode_png
    img = np.random.default_rng(0).integers(0, 256, size=(7, 5, 3), dtype=np.uint8)
    w, h, raw = _png_pixels(encode_png(img))
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + w * 3)
    assert (w, h) == (5, 7) and not rows[:, 0].any()
    np.testing.assert_array_equal(rows[:, 1:].reshape(h, w, 3), img)


@pytest.mark.slow
def test_llm_benchmark_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not fusion_enabled():  # its braze process would inherit BRAZE_FUSION=0: the same checks, slower
        pytest.skip("the benchmark times the fused executor: the fused run of the suite checks it")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # bench/ is beside braze in the checkout, not installed
    from bench.llm import main

    out_json, out_png = tmp_path / "llm.json", tmp_path / "llm.png"
    assert main(["--threads", "1", "--prompt-tokens", "8", "--gen-tokens", "4", "--latency-tokens", "8",
                 "--latency-rounds", "2", "--reps", "2", "--tg-reps", "1", "--no-llama-bench", "--generate-tokens", "4", "--depth", "20",
                 "--json", str(out_json), "--png", str(out_png)]) == 0
    res = json.loads(out_json.read_text())
    assert {"machine", "model", "settings", "braze", "llama_cpp", "markdown"} <= set(res)
    assert res["machine"]["cpu"] and isinstance(res["machine"]["cpu_flags"], list)
    assert res["llama_cpp"]["status"].startswith("llama.cpp: skipped") and res["llama_cpp"]["runs"] == []
    [row] = res["braze"]
    assert "error" not in row, row
    assert row["threads"] == 1 and row["braze_threads"] == 1  # the thread variables reached the subprocess
    assert row["pp"]["tokens"] == 8 and len(row["pp"]["seconds"]) == 2 and row["pp"]["tokens_per_s"] > 0
    assert row["tg"]["tokens"] == 4 and len(row["tg"]["seconds"]) == 1 and row["tg"]["tokens_per_s"] > 0
    lat = row["latency"]
    assert len(lat["steps_ms"]) == 8 and all(t > 0 for t in lat["steps_ms"])
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] and lat["p99_over_p50"] >= 1
    assert lat["rounds"] == 2 and lat["p99_over_p50_position_median"] >= 1  # each position's median over 2 rounds
    if "runqueue_wait_ms" in lat:  # Linux with schedstats: each step's wait for a CPU
        assert len(lat["runqueue_wait_ms"]) == 8 and min(lat["runqueue_wait_ms"]) >= 0
        assert 0 <= lat["descheduled_steps"] <= 8
    assert row["rss_mib"] > 0 and row["load_s"] > 0 and row["background_compile_wait_s"] >= 0
    ps = row["per_step"]
    assert set(ps) == {"kernel_launches", "c_calls", "allocations", "nodes_recorded"}
    assert ps["kernel_launches"] > 0 and all(v is None or v >= 0 for v in ps.values())
    gen = res["generate_rss"]  # braze generate in its own process, twice
    assert gen["tokens"] == 4 and gen["braze_rss_mib"] > 0 and gen["llama"] == {}
    assert "peak RSS generating 4 tokens" in res["markdown"]
    out = capsys.readouterr().out
    assert "| braze pp8 tok/s | braze tg4 @ d20 tok/s |" in out and "llama.cpp: skipped" in out
    assert res["settings"]["depth"] == 20 and res["settings"]["decode_cache_len"] == 20 + 8 + 8
    assert f"| {res['model']['name']} | 1 | " in out and res["markdown"] in out
    w, h, raw = _png_pixels(out_png.read_bytes())
    assert w > 100 and h > 100 and len(raw) == h * (1 + 3 * w)


def test_runqueue_wait_splits_the_steps_the_machine_made_late() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.schedstat import DESCHEDULED, runqueue_wait_ns, split

    a = runqueue_wait_ns()
    if a is None:
        pytest.skip("no per-thread schedstat on this kernel")
    sum(range(100_000))
    b = runqueue_wait_ns()
    assert b is not None and b >= a >= 0  # a sum over the threads: never goes back
    step = np.array([10.0] * 97 + [10.5, 30.0, 40.0])
    wait = np.zeros(100)
    wait[[98, 99]] = 20.0  # the two slowest steps waited for a CPU
    wait[0] = DESCHEDULED * 10 / 2  # a wait under the threshold does not count
    got = split(step, wait)
    assert got["descheduled_steps"] == 2
    calm = step[:98]
    assert got["p99_over_p50_not_descheduled"] == pytest.approx(np.percentile(calm, 99) / np.percentile(calm, 50))
    assert got["runqueue_wait_ms_total"] == pytest.approx(wait.sum())


def test_the_parent_sleeps_while_a_child_runs_and_still_times_it_out() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import resource
    import subprocess

    from bench.llm import _wait_rusage

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    rc, usage = _wait_rusage(child, 60)
    woke = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
    assert rc == 0 and usage is not None and usage.ru_maxrss > 0
    # polling every 50 ms would sleep and wake ~12 times over the child's 0.6 s
    assert woke <= 4, woke
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    assert _wait_rusage(slow, 0.3) == (124, None) and slow.returncode is not None
