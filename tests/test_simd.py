"""runtime/simd.py: whether 512-bit integer instructions run whole, measured once per
machine, and what reads the verdict (the quantized matmul's C, stored plans' keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from braze import plan
from braze.codegen.headers import quant_source
from braze.runtime import simd


def _cpu_has(flag: str) -> bool:
    try:
        return any(line.startswith("flags") and f" {flag} " in f"{line} " for line in open("/proc/cpuinfo"))
    except OSError:
        return False


def test_the_probe_times_both_widths_where_the_machine_has_them() -> None:
    ratio = simd.measure_split_ratio(iterations=20_000)
    if _cpu_has("avx512bw"):
        assert ratio is not None and 0.3 < ratio < 5.0  # whole ~1, split ~2
    else:
        assert ratio is None


def test_the_verdict_is_measured_once_and_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BRAZE_WIDE512", raising=False)
    monkeypatch.setenv("BRAZE_RUNTIME_DIR", str(tmp_path))
    calls: list[int] = []

    def split() -> float:
        calls.append(1)
        return 2.0  # as Zen 4: each 512-bit instruction in two halves
    monkeypatch.setattr(simd, "measure_split_ratio", split)
    monkeypatch.setattr(simd, "_verdict", None)
    assert simd.wide_512() is False
    assert simd.wide_512() is False and len(calls) == 1
    monkeypatch.setattr(simd, "_verdict", None)  # a new process: reads the kept verdict
    monkeypatch.setattr(simd, "measure_split_ratio", lambda: pytest.fail("measured again"))
    assert simd.wide_512() is False
    (kept,) = tmp_path.glob("simd-*")
    assert kept.read_text().startswith("0 ")


def test_whole_512_bit_instructions_are_the_other_verdict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BRAZE_WIDE512", raising=False)
    monkeypatch.setenv("BRAZE_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(simd, "measure_split_ratio", lambda: 1.02)
    monkeypatch.setattr(simd, "_verdict", None)
    assert simd.wide_512() is True


def test_the_environment_overrides_the_verdict_and_reaches_the_c(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv("BRAZE_WIDE512", value)
        assert simd.wide_512() is want
        assert f"#define BRAZE_WIDE512 {value}\n" in quant_source()


def test_a_stored_plan_is_kept_under_the_verdict_its_c_was_rendered_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module names the quant library it links against by a hash of the library's C,
    which carries the verdict: a plan stored under one verdict would name a library a
    process of the other never loads (undefined symbols), so its key differs."""
    ids: list[Any] = []
    for value in ("0", "1"):
        monkeypatch.setenv("BRAZE_WIDE512", value)
        monkeypatch.setattr(plan, "_code_id", None)
        ids.append(plan._code_identity())
    assert ids[0] != ids[1]


def test_a_damaged_verdict_is_measured_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BRAZE_WIDE512", raising=False)
    monkeypatch.setenv("BRAZE_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(simd, "_verdict", None)
    (tmp_path / Path(simd._verdict_file()).name).write_text("garbage\n")
    monkeypatch.setattr(simd, "measure_split_ratio", lambda: 1.0)
    assert simd.wide_512() is True
    assert Path(simd._verdict_file()).read_text().startswith("1 ")
