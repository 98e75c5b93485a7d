"""The fusion compiler: kernel counts for canonical programs, plan reuse, warm caches,
and fused results against the reference executor.

These tests force fusion on (they set BRAZE_FUSION=1 themselves), so they check the
compiler in both runs of the suite; every other test runs both ways through the
Makefile.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.nn.functional
from braze import plan
from braze.runtime.cpu import compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler")

P = 0.3275911
A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@pytest.fixture(autouse=True)
def fused(monkeypatch: Any) -> None:
    monkeypatch.setenv("BRAZE_FUSION", "1")


def erf_as(x: braze.Tensor) -> braze.Tensor:
    """Abramowitz-Stegun 7.1.26 from elementary ops, with ``where`` for the sign."""
    sign = braze.where(x < 0, -1.0, 1.0)
    ax = x.abs()
    t = 1.0 / (1.0 + P * ax)
    poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t
    return sign * (1.0 - poly * (-ax * ax).exp())


def gelu_custom(x: braze.Tensor) -> braze.Tensor:
    return x * (erf_as(x / math.sqrt(2.0)) + 1.0) / 2.0


def layer_norm(x: braze.Tensor, eps: float = 1e-5) -> braze.Tensor:
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / (var + eps).sqrt()


def softmax(x: braze.Tensor) -> braze.Tensor:
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def run(fn: Callable[[braze.Tensor], braze.Tensor], x: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    t = braze.from_numpy(x)
    braze.reset_stats()
    out = fn(t).numpy()
    return out.copy(), braze.stats()


def reference(fn: Callable[[braze.Tensor], braze.Tensor], x: np.ndarray, monkeypatch: Any) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setenv("BRAZE_FUSION", "0")
        return fn(braze.from_numpy(x)).numpy().copy()


@pytest.mark.parametrize("name, fn, atol", [("gelu", gelu_custom, 2e-6), ("layernorm", layer_norm, 2e-5),
                                            ("softmax", softmax, 1e-6)])
def test_canonical_programs_are_one_kernel(name: str, fn: Any, atol: float, monkeypatch: Any) -> None:
    x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    got, st = run(fn, x)
    assert st["kernel_launches"] == 1, st
    assert st["allocations"] + st["pool_hits"] == 1, "only the result is written to memory"
    np.testing.assert_allclose(got, reference(fn, x, monkeypatch), atol=atol, rtol=1e-5)


def test_second_call_compiles_and_schedules_nothing() -> None:
    x = np.random.default_rng(1).standard_normal((16, 40)).astype(np.float32)
    run(layer_norm, x)
    out, st = run(layer_norm, x * 2)
    assert st["plan_hits"] == 1 and st["plan_misses"] == 0 and st["kernels_compiled"] == 0
    _, st = run(layer_norm, x + 1)
    assert st["plan_hits"] == 1 and st["kernels_compiled"] == 0


def test_scalars_are_placeholders() -> None:
    """The same program with other constants reuses its plan (constants are arguments)."""
    x = braze.ones(8, 8).realize()
    (x * 2.0 + 1.0).numpy()
    braze.reset_stats()
    out = (x * 3.0 + 5.0).numpy()
    assert braze.stats()["plan_hits"] == 1 and braze.stats()["kernels_compiled"] == 0
    assert np.all(out == 8.0)


def test_new_process_with_a_warm_cache_compiles_nothing(new_processes: Any) -> None:
    code = ("import braze, numpy as np\n"
            "x = braze.from_numpy(np.linspace(-3, 3, 999, dtype=np.float32).reshape(9, 111))\n"
            "mu = x.mean(-1, keepdim=True)\n"
            "y = ((x - mu) * (x - mu)).sum(-1).sqrt().numpy()\n"
            "print(braze.stats()['kernels_compiled'])\n")
    first, second = new_processes(code)
    assert int(first) >= 1
    assert int(second) == 0


def test_refused_fusions_say_why(capfd: Any, monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("BRAZE_DEBUG", "1")
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))  # no stored plan: schedule afresh
    plan.clear()
    x = braze.randn(8, 6)
    y = (x * 2)
    (y.T + 1).numpy()  # reads y transposed: not element-aligned
    err = capfd.readouterr().err
    assert "not fused" in err and "add" in err


def test_unreachable_intermediates_are_never_materialised() -> None:
    x = braze.randn(256, 256)
    braze.reset_stats()
    y = (((x * 2).exp() + 1).log() - 3).relu()
    y.numpy()
    assert braze.stats()["allocations"] + braze.stats()["pool_hits"] == 1  # only y


def test_reachable_intermediates_are_materialised(monkeypatch: Any) -> None:
    x = braze.randn(32, 32)
    a = x * 2
    b = (a + 1).exp()
    np.testing.assert_allclose(a.numpy(), x.numpy() * 2)
    np.testing.assert_allclose(b.numpy(), np.exp(x.numpy() * 2 + 1), rtol=1e-6)


def test_matmul_is_an_extern_step_between_fused_kernels() -> None:
    x = braze.randn(16, 32)
    w = braze.randn(32, 8)
    braze.reset_stats()
    out = ((x * 0.5).relu() @ w + 1.0).sigmoid()
    got = out.numpy()
    st = braze.stats()
    assert st["kernel_launches"] == 3  # prologue kernel, BLAS, epilogue kernel
    xs, ws = x.numpy(), w.numpy()
    want = 1 / (1 + np.exp(-(np.maximum(xs * 0.5, 0) @ ws + 1)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mean_and_variance_share_one_pass() -> None:
    from braze.codegen.loops import passes as _passes
    from braze.schedule import KernelStep, schedule
    x = braze.randn(4, 64)
    m = x.mean(-1, keepdim=True)
    s = (x * x).mean(-1, keepdim=True)
    out = s - m * m
    nodes = list(braze.stream.stream("cpu").nodes)
    key_of = plan.Form.of(nodes).key_of
    sched = schedule(nodes, key_of, {key_of[id(out._storage)]})
    kernels = [s for s in sched.steps if isinstance(s, KernelStep)]
    assert len(kernels) == 1
    assert [len(p) for p in _passes(kernels[0].kernel)] == [2]
    np.testing.assert_allclose(out.numpy(), x.numpy().var(-1, keepdims=True), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int32"])
def test_dtypes_agree_with_the_reference(dtype: str, monkeypatch: Any) -> None:
    rng = np.random.default_rng(3)
    d = getattr(braze, dtype)
    base = rng.standard_normal((8, 33)) * 4

    def prog(t: braze.Tensor) -> braze.Tensor:
        return (t * 3 - 1).abs().maximum(t).amax(-1, keepdim=True) + t

    x = base.astype(d.np) if dtype != "int32" else base.astype(np.int32)
    got, _ = run(prog, x)
    want = reference(prog, x, monkeypatch)
    np.testing.assert_array_equal(got, want) if dtype == "int32" else np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol={"float16": 2e-3, "bfloat16": 2e-2}.get(dtype, 1e-12),
        atol={"float16": 2e-2, "bfloat16": 0.2}.get(dtype, 1e-9))


def test_a_loop_over_fresh_inputs_allocates_nothing_after_the_first_step() -> None:
    """Freed buffers go back to the size-class pool, and the next step takes them."""
    rng = np.random.default_rng(5)
    counts = []
    for _ in range(4):
        x = braze.from_numpy(rng.standard_normal((128, 256)).astype(np.float32))
        braze.reset_stats()
        y = layer_norm(x)
        y.numpy()
        counts.append((braze.stats()["allocations"], braze.stats()["pool_hits"]))
        del y
    assert all(a == 0 and h >= 1 for a, h in counts[1:]), counts


def test_a_buffer_a_user_still_sees_is_not_reused() -> None:
    x = braze.from_numpy(np.ones((128, 256), np.float32))
    view = (x * 2).numpy()  # the user keeps a numpy view of the result's memory
    (x * 3).numpy()
    assert np.all(view == 2.0)


def test_cat_of_computed_halves_writes_slices_of_one_output(monkeypatch: Any) -> None:
    """Rotary embedding's two halves are stored straight into the concatenated output:
    one kernel, one buffer."""
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((1, 4, 16, 8)).astype(np.float32)
    cs, sn = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)

    def rope(x: braze.Tensor) -> braze.Tensor:
        cos, sin = braze.from_numpy(cs), braze.from_numpy(sn)
        x1, x2 = x[..., :4], x[..., 4:]
        return braze.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    got, st = run(rope, xs)
    assert st["kernel_launches"] == 1 and st["allocations"] + st["pool_hits"] == 1, st
    np.testing.assert_allclose(got, reference(rope, xs, monkeypatch), rtol=1e-6, atol=1e-6)


def test_cat_with_an_input_that_is_only_a_view_is_read_in_place(monkeypatch: Any) -> None:
    """One input computed from a tensor that exists before the flush, one a plain view:
    the cat is guarded reads inside its consumer's kernel, the computed input recomputed
    under its guard (rotate_half's ``-x2``): one kernel, nothing stored but the result."""
    xs = np.arange(24, dtype=np.float32).reshape(2, 12)

    def prog(x: braze.Tensor) -> braze.Tensor:
        return braze.cat([x[:, :6] * 2, x[:, 6:]], 1) + 1

    got, st = run(prog, xs)
    assert st["kernel_launches"] == 1, st
    np.testing.assert_array_equal(got, reference(prog, xs, monkeypatch))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_cat_and_pad_of_views_are_index_arithmetic_in_the_consumer(dtype: str, monkeypatch: Any) -> None:
    """cat of transposed and sliced views, an empty piece, and a constant pad, each read
    by an element-wise consumer: one kernel per program, only its output allocated."""
    rng = np.random.default_rng(3)
    xs = (rng.standard_normal((6, 5)) * 4).astype(dtype)

    def cat_prog(x: braze.Tensor) -> braze.Tensor:
        y = braze.cat([x.T[:, :2], x.T[:, 6:], x.T[:, 2:6]], 1)
        return y != 0 if dtype == "bool" else y * 3

    def pad_prog(x: braze.Tensor) -> braze.Tensor:
        y = braze.nn.functional.pad(x.T[1:], (2, 1, 0, 3), value=1)
        return y.logical_not() if dtype == "bool" else y - 1

    for prog in (cat_prog, pad_prog):
        got, st = run(prog, xs)
        assert st["kernel_launches"] == 1 and st["allocations"] + st["pool_hits"] <= 1, (prog.__name__, st)
        np.testing.assert_array_equal(got, reference(prog, xs, monkeypatch))


def test_cat_along_a_reduced_dim_and_reflect_pad(monkeypatch: Any) -> None:
    """A reduction over a cat (the cat's dim inside the row) is one kernel; a reflect
    pad indexes non-linearly and stays an extern step, with the same result."""
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((4, 7)).astype(np.float32)

    def prog(x: braze.Tensor) -> braze.Tensor:
        return (braze.cat([x[:, 3:], x[:, :3]], 1) * 2).amax(1)

    def reflect(x: braze.Tensor) -> braze.Tensor:
        return braze.nn.functional.pad(x, (2, 2), mode="reflect") * 2

    got, st = run(prog, xs)
    assert st["kernel_launches"] == 1, st
    np.testing.assert_array_equal(got, reference(prog, xs, monkeypatch))
    got, _ = run(reflect, xs)
    np.testing.assert_array_equal(got, reference(reflect, xs, monkeypatch))


def test_a_kernel_that_fails_to_compile_runs_unfused_and_says_so(monkeypatch: Any, capfd: Any,
                                                                tmp_path: Any) -> None:
    from braze.errors import CompileError
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    plan.clear()
    monkeypatch.setattr(plan, "_warned", set())

    def broken(source: str, names: Any, flags: Any = None) -> Any:
        raise CompileError("simulated compiler failure")

    monkeypatch.setattr(plan.cpu, "compile_c", broken)
    x = braze.from_numpy(np.arange(6, dtype=np.float32))
    np.testing.assert_allclose(((x + 1) * 2).numpy(), (np.arange(6) + 1) * 2)
    assert "failed to compile" in capfd.readouterr().err
    plan.clear()


@pytest.mark.parametrize("op", ["floor", "ceil", "round", "abs", "sign"])
def test_integer_rounding_ops_are_exact_for_large_values(op: str, monkeypatch: Any) -> None:
    """Integers must not pass through float32 (47830817 is not a float32)."""
    xs = np.array([47830817, -47830817, 2**31 - 1, 0], dtype=np.int32)
    got, _ = run(lambda t: getattr(t, op)(), xs)
    np.testing.assert_array_equal(got, reference(lambda t: getattr(t, op)(), xs, monkeypatch))


def test_slice_bounds_into_existing_tensors_are_placeholders() -> None:
    """``x[i]`` for every row, and writes at a moving position into an existing buffer
    (a KV cache), each replay one plan: the offset goes to the kernel at run time."""
    xs = np.arange(40, dtype=np.float32).reshape(10, 4)
    x = braze.from_numpy(xs)
    cache = braze.from_numpy(np.zeros((10, 4), np.float32))
    braze.reset_stats()
    for i in range(10):
        got = (x[i] * 2 + 1).numpy()
        np.testing.assert_array_equal(got, xs[i] * 2 + 1)
        cache[i] = x[i] * 3
        cache.realize()
    st = braze.stats()
    assert st["plan_misses"] == 2 and st["plan_hits"] == 18, st
    np.testing.assert_array_equal(cache.numpy(), xs * 3)


def test_operands_sharing_an_offset_are_part_of_the_plan_key() -> None:
    """Two slices of one tensor at the same offset are read through one kernel argument;
    a flush where they differ is another program (it must not replay that kernel)."""
    xs = np.arange(40, dtype=np.float32).reshape(10, 4)
    x = braze.from_numpy(xs)
    braze.reset_stats()
    for i, j in [(0, 0), (1, 1), (2, 3), (3, 2), (4, 4)]:
        np.testing.assert_array_equal((x[i] * x[i] + x[j]).numpy(), xs[i] * xs[i] + xs[j])
    assert braze.stats()["plan_misses"] == 2


def _rope(x: braze.Tensor, cos: braze.Tensor, sin: braze.Tensor) -> braze.Tensor:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return braze.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


@pytest.mark.parametrize("case", ["gelu", "layernorm", "rope", "transposed", "float16", "bool", "long_rows",
                                  "slice_write"])
def test_streamed_stores_agree_with_the_reference(case: str, monkeypatch: Any, tmp_path: Any) -> None:
    """Kernels whose operands fill the last-level cache store around it (``c_stream.streams``).
    With the cache size taken as 1 byte every kernel with element stores does: odd row
    lengths (a block's tail), rows longer than a block, outputs that start off a vector
    boundary (a write into a slice) and every stored dtype agree with the reference.
    (Softmax does not stream: its last pass already wrote the output's lines.)"""
    import braze.codegen.c_stream as c_stream

    monkeypatch.setattr(c_stream, "_LLC", 1)
    monkeypatch.setattr(plan, "_code_id", None)  # stored plans carry C rendered for another cache size
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    plan.clear()
    streamed = []
    real = c_stream.streamed_loop
    monkeypatch.setattr(c_stream, "streamed_loop", lambda *a: streamed.append(1) or real(*a))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 37)).astype(np.float32)
    progs: dict[str, tuple[Callable[..., braze.Tensor], list[np.ndarray]]] = {
        "gelu": (gelu_custom, [x]),
        "transposed": (lambda t: t.mT.sin() * 2, [x]),
        "layernorm": (layer_norm, [x]),
        "rope": (_rope, [rng.standard_normal((2, 5, 24)).astype(np.float32),
                         rng.standard_normal((5, 12)).astype(np.float32), rng.standard_normal((5, 12)).astype(np.float32)]),
        "float16": (lambda t: (t * 3).to(braze.float16) + 1, [x]),
        "bool": (lambda t: t > 0.25, [x]),
        "long_rows": (lambda t: (t * 2).exp(), [rng.standard_normal((3, 1000)).astype(np.float32)]),
        "slice_write": (lambda t: _write_into_slice(t), [x]),
    }
    fn, arrays = progs[case]
    try:
        got = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
        with monkeypatch.context() as m:
            m.setenv("BRAZE_FUSION", "0")
            want = fn(*[braze.from_numpy(a) for a in arrays]).numpy().copy()
    finally:
        plan.clear()
    assert streamed, "no kernel streamed its stores"
    if got.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3, atol=2e-5)


def _write_into_slice(t: braze.Tensor) -> braze.Tensor:
    out = braze.zeros((t.shape[0], t.shape[1] + 3))
    out[:, 3:] = t * 2 + 1  # rows start 12 bytes past a boundary
    return out


def test_every_float16_converts_exactly_in_a_kernel() -> None:
    """All 65536 float16 bit patterns (subnormals, infinities, nans) read by a fused
    kernel: braze's bitwise float16 -> float conversion against numpy's."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    got = (braze.from_numpy(x).float() * 2.0).numpy()
    with np.errstate(invalid="ignore"):  # the signalling nans
        want = x.astype(np.float32) * np.float32(2.0)
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86's MXCSR")
def test_float16_conversion_is_exact_under_denormals_are_zero() -> None:
    """Code built with -ffast-math, or ``torch.set_flush_denormal(True)``, may leave the
    CPU treating float32 subnormals as zero. braze's float16 -> float conversion must not
    pass through one: every float16 subnormal is a normal float32."""
    import ctypes

    from braze.codegen.c_expr import PRELUDE
    from braze.runtime.cpu import compile_c

    source = PRELUDE + r"""
#include <xmmintrin.h>
void convert_daz(const uint16_t *h, float *out, int64_t n) {
    const unsigned int saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040);  /* denormals are zero, flush to zero */
    for (int64_t i = 0; i < n; i++) out[i] = braze_h2f(h[i]);
    _mm_setcsr(saved);
}
"""
    fn = compile_c(source, ["convert_daz"])["convert_daz"]
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(1 << 16, dtype=np.float32)
    fn(ctypes.c_void_p(bits.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(1 << 16))
    want = bits.view(np.float16).astype(np.float32)
    ok = (out.view(np.uint32) == want.view(np.uint32)) | (np.isnan(out) & np.isnan(want))
    assert ok.all(), bits[~ok][:8]


def test_full_holds_its_value_rounded_to_a_half_type() -> None:
    """``full(-1e5, float16)`` is -inf, ``full(0.1, bfloat16)`` is 0.10009766, fused or not."""
    with np.errstate(over="ignore"):
        for value, dtype in ((-1e5, "float16"), (0.1, "bfloat16"), (0.1, "float16")):
            got = (braze.full((3,), value, dtype=getattr(braze, dtype)) * 1.0).numpy().astype(np.float32)
            want = np.full(3, value, dtype=np.float32).astype(getattr(braze, dtype).np).astype(np.float32)
            np.testing.assert_array_equal(got, want)


def test_tril_and_triu_masks_are_computed_in_their_consumer() -> None:
    """``triu(full(-inf), 1)`` and ``tril(ones) == 0`` are index arithmetic in the kernel
    that reads them, also where they are recomputed under a broadcast (B, H, N, N) read."""
    rng = np.random.default_rng(3)
    s = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    braze.reset_stats()
    a = (braze.from_numpy(s) + braze.triu(braze.full((9, 9), float("-inf")), diagonal=1)).numpy()
    assert braze.stats()["kernel_launches"] == 1
    np.testing.assert_array_equal(a, s + np.triu(np.full((9, 9), -np.inf, np.float32), 1))
    braze.reset_stats()
    b = braze.from_numpy(s).masked_fill(braze.tril(braze.ones(9, 9)).view(1, 1, 9, 9) == 0, float("-inf")).numpy()
    assert braze.stats()["kernel_launches"] == 1
    np.testing.assert_array_equal(b, np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf))
    x = rng.standard_normal((4, 5, 7)).astype(np.float32)
    for k in (-2, 0, 3):
        np.testing.assert_array_equal(braze.from_numpy(x).tril(k).mul(2).numpy(), np.tril(x, k) * 2)
        np.testing.assert_array_equal(braze.from_numpy(x).triu(k).mul(2).numpy(), np.triu(x, k) * 2)


def test_a_value_read_through_a_reshape_of_its_expansion_is_recomputed_at_the_right_element() -> None:
    """``a[:, :, None].expand(3, 4, 2).reshape(3, 8)`` (repeat_interleave): one loop
    coordinate of the reader walks two dims of the copy's shape; recomputing the copy
    must not take it for the last dim alone (it read a[i, 0] for the whole row)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    got = (braze.from_numpy(x) * braze.from_numpy(a).unsqueeze(-1).expand(3, 4, 2).reshape(3, 8)).numpy()
    np.testing.assert_array_equal(got, x * np.repeat(a, 2, axis=1))
    got = (braze.from_numpy(x) * (braze.from_numpy(a) * 2).unsqueeze(-1).expand(3, 4, 2).reshape(3, 8)).numpy()
    np.testing.assert_array_equal(got, x * np.repeat(a * 2, 2, axis=1))



def test_a_node_its_producers_refuse_joins_a_sibling_group() -> None:
    """Hugging Face's ``q * cos + rotate_half(q) * sin`` with q made in the flush (a
    matmul): ``-x2`` has another shape than ``q``, so its group refuses the cat; the cat
    then joins the group computing ``q * cos`` (it loads q too) instead of opening a third
    kernel. With q given (it exists before the flush), ``-x2`` is recomputed under the
    cat's guard instead: one kernel."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 8, 4)).astype(np.float32)
    b = rng.standard_normal((4, 16)).astype(np.float32)
    ang = rng.standard_normal((8, 16)).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x: braze.Tensor, c: braze.Tensor, s: braze.Tensor) -> braze.Tensor:
        return x * c + braze.cat((-x[..., 8:], x[..., :8]), dim=-1) * s

    q = a @ b
    want = q * cos + np.concatenate([-q[..., 8:], q[..., :8]], -1) * sin
    args = [braze.from_numpy(v) for v in (a, b, cos, sin)]
    braze.reset_stats()
    got = rope(args[0] @ args[1], args[2], args[3]).numpy()
    assert braze.stats()["kernel_launches"] == 3  # the matmul, -x2, then everything else
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    braze.reset_stats()
    got = rope(braze.from_numpy(q), args[2], args[3]).numpy()
    assert braze.stats()["kernel_launches"] == 1
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_extern_step_reads_the_values_its_placement_meant_to_recompute() -> None:
    """``x.abs() // y.exp()`` of given x, y: both values are recomputable where read, and
    float floor division has no lowering. Trying to place it first drops it from its
    operands' readers (as a recomputed read would); it then runs as an extern step and
    must find both operands stored (it lost the second, read before it was computed)."""
    rng = np.random.default_rng(9)
    x = rng.uniform(1, 8, (2, 3)).astype(np.float32)
    y = rng.uniform(0, 1, (2, 3)).astype(np.float32)
    for make, want in ((lambda a, b: a.abs() // b.exp(), np.abs(x) // np.exp(y)),
                       (lambda a, b: a.half().float() % b.abs(), x.astype(np.float16).astype(np.float32) % y)):
        got = make(braze.from_numpy(x), braze.from_numpy(y)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("shape", [(2, 2, 4, 2), (1, 2, 4, 2), (3, 2, 6, 2)])
def test_max_indices_over_a_merged_view_of_a_transpose(shape: tuple[int, int, int, int]) -> None:
    """``max(dim)`` of a transposed tensor reshaped to merge two dims: the kernel reads it
    with a division, its loop is split (``schedule/split.py``), and the position the
    fold gives must be the folded dim's (it was the split loop's, silently)."""
    b, c, d, e = shape
    a = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    want = a.transpose(0, 2, 1, 3).reshape(b, d, c * e)
    for dim in range(3):
        x = braze.tensor(a).transpose(1, 2).reshape(b, d, c * e)
        values, indices = x.max(dim)
        np.testing.assert_array_equal(values.numpy(), want.max(dim))
        np.testing.assert_array_equal(indices.numpy(), want.argmax(dim))


def test_a_copy_computed_by_a_closed_group_is_read_from_memory() -> None:
    """A copy of a value made in the flush is read through to that value where it is
    read (a view, not a buffer), but not once the group that computed both has closed
    (a write into a given tensor closes it): that group stored the copy, not always
    its input (the read through found an unwritten buffer: "storage read before it
    was computed")."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = braze.tensor(x)
    v = (a * 2).clone()
    a[0, 0] = 3.0
    np.testing.assert_array_equal((v + 1).numpy(), x * 2 + 1)
    np.testing.assert_array_equal(a.numpy(), np.where(np.arange(6).reshape(2, 3) == 0, 3.0, x))

    rows = np.random.default_rng(0).standard_normal((25, 5)).astype(np.float32)
    a0, a1 = braze.tensor(np.float32([0.5])), braze.tensor(rows)
    v0 = a0.amin(0)
    v1 = braze.stack([v0], 0)  # a copy of an intermediate
    v4 = braze.tril(a1).amax(1)
    v4[1] = v0  # a write into an intermediate
    v5 = a0.amin(0, keepdim=True)
    got = braze.where(v5 <= v1, v5, a1).numpy()
    np.testing.assert_array_equal(got, np.full((25, 5), 0.5, dtype=np.float32))


def test_an_element_wise_kernel_of_few_rows_is_cut_among_the_threads() -> None:
    """A 1-d tensor, or a few rows, used to run on one thread however long: such a
    kernel now cuts its rows into parts when it runs (a generic kernel of later shapes
    too), and a part's result is the whole's (element-wise: bit for bit at any thread
    count). A loop forks a team only for work worth it: an add at 32768
    elements, an exp-heavy expression much sooner."""
    from braze.codegen import c

    rng = np.random.default_rng(5)
    old = braze.get_num_threads()
    try:
        for shape in [(50000,), (3, 5000), (1, 64, 300), (5,), (2, 3)]:
            a = rng.standard_normal(shape).astype(np.float32)
            got = []
            for nt in (1, 2, 3):
                braze.set_num_threads(nt)
                got.append(((braze.from_numpy(a) * 2.0).exp() + 1.0).numpy())
            np.testing.assert_allclose(got[0], np.exp(a * 2.0) + 1.0, rtol=1e-6)
            for g in got[1:]:
                np.testing.assert_array_equal(g, got[0])
    finally:
        braze.set_num_threads(old)
    plan.clear()
    x = braze.from_numpy(rng.standard_normal((3, 20000)).astype(np.float32))
    (x + x).numpy()
    ((x * 2.0).exp() + 1.0).numpy()
    braze.softmax(x, -1).numpy()
    kernels = [s.step.kernel for p in plan.stored_plans() for s in p.steps if isinstance(s, plan.CompiledKernel)]
    by_work = sorted(kernels, key=c.parallel_min)
    assert c.parallel_min(by_work[-1]) == 32768  # the add: 2 loads, an op, a store
    assert c.parallel_min(by_work[0]) < 32768 // 4  # an exp counts as several
    sources = [c.kernel_source(k, "k") for k in kernels]
    assert sum("parts" in src for src in sources) == 2  # the element-wise ones, not the softmax
    y = braze.from_numpy(rng.standard_normal((3, 100)).astype(np.float32))
    plan.clear()
    (y + y).numpy()  # too small to fork ever: no second loop nest to compile
    assert not any("parts" in c.kernel_source(s.step.kernel, "k") for p in plan.stored_plans() for s in p.steps)
