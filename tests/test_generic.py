"""Kernels generic in their sizes (``codegen/generic.py``): every shape of a program
after its first replays compiled kernels with its own sizes, and computes what the
reference computes at that shape."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import braze
import braze.plan as plan
from braze import dtypes as dt
from braze import from_numpy, ir
from braze.codegen.generic import canonical, symbolize
from braze.ir import Size
from braze.stream import fusion_enabled


def test_a_size_is_spelled_by_name_and_computes_by_value() -> None:
    a, b = Size(64, "n0"), Size(256, "n1")
    assert f"{a * b}" == "(n0 * n1)" and a * b == 64 * 256
    assert f"{a * 1}" == "n0" and f"{1 * a}" == "n0" and f"{a + 0}" == "n0"
    assert f"{b // 16}" == "(n1 / 16)" and b // 16 == 16 and f"{a % 5}" == "(n0 % 5)" and a % 5 == 4
    assert f"{3 - a}" == "(3 - n0)" and 3 - a == -61
    assert f"{-a}" == "(-n0)" and f"{-(-Size(33, 'n2') // 16)}" == "(-(-((n2 + 15) / 16)))" \
        and -(-Size(33, "n2") // 16) == 3  # a ceiling, spelled for C's truncating division
    y = -1 - Size(2, "n0")  # not a negation: its floor is not spelled as a ceiling's
    assert type(y // 4) is int and y // 4 == -1
    assert f"{abs(a)}" == "64"  # what is not spelled stays a literal of the value: other text, never a wrong one
    assert hash(a) == hash(64) and a == 64 and max(b, 1) is b


def _kernel(outer: tuple[int, ...], inner: tuple[int, ...], *indices: ir.Affine) -> ir.Kernel:
    loads = [ir.Load(i, a, dt.float32) for i, a in enumerate(indices[:-1])]
    expr: ir.Expr = loads[0]
    for ld in loads[1:]:
        expr = ir.Op("add", (expr, ld), dt.float32)
    n = len(indices) - 1
    return ir.Kernel(outer, inner, [ir.Store(n, indices[-1], expr)], [(dt.float32, False)] * n + [(dt.float32, True)])


def test_canonical_merges_what_every_index_walks_as_one() -> None:
    # x (4, 5, 6) + b (6,): the first two loops merge into rows, b's broadcast keeps the last apart
    k = _kernel((4, 5), (6,), ir.Affine(0, (30, 6, 1)), ir.Affine(0, (0, 0, 1)), ir.Affine(0, (30, 6, 1)))
    c = canonical(k)
    assert (c.outer, c.inner) == ((20,), (6,))
    st = c.stages[0]
    assert isinstance(st, ir.Store) and st.index.coeffs == (6, 1)
    # a transposed read does not merge
    t = _kernel((4,), (5,), ir.Affine(0, (1, 4)), ir.Affine(0, (5, 1)))
    assert canonical(t) is t
    # rows = 1 (a small tensor the scheduler left in one row) becomes rows x columns
    s = canonical(_kernel((), (8, 16), ir.Affine(0, (16, 1)), ir.Affine(0, (16, 1))))
    assert (s.outer, s.inner) == ((8,), (16,))


def test_symbolize_names_extents_and_the_strides_made_of_them() -> None:
    k = _kernel((8,), (16,), ir.Affine(0, (16, 1)), ir.Affine(0, (0, 1)), ir.Affine(0, (16, 1)))
    got = symbolize(k)
    assert got is not None
    g, values = got
    assert values == (8, 16) and [str(d) for d in g.outer + g.inner] == ["n0", "n1"]
    st = g.stages[0]
    assert isinstance(st, ir.Store) and [str(c) for c in st.index.coeffs] == ["n1", "1"]


Program = Callable[[Any], Any]


def _softmax(x: Any) -> Any:
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _layernorm(x: Any) -> Any:
    c = x - x.mean(-1, keepdim=True)
    return c * ((c * c).mean(-1, keepdim=True) + 1e-5).rsqrt()


def _bias_gelu(x: Any) -> Any:  # a broadcast vector, a scalar, and tanh
    b = braze.arange(x.shape[-1]).to(braze.float32) * 0.01
    y = x + b
    return 0.5 * y * (1 + (0.7978845608 * (y + 0.044715 * y * y * y)).tanh())


def _sliced(x: Any) -> Any:  # views with offsets and strides into the input
    return x[..., 1:] * 2 - x[..., :-1].abs()


def _concatenated(x: Any) -> Any:  # a cat's split point and a pad's range move with the shape
    return braze.pad(braze.cat([x, x.exp()], -1), (2, 3)) * 2


def _np_softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _np_layernorm(a: np.ndarray) -> np.ndarray:
    c = a - a.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)


def _np_bias_gelu(a: np.ndarray) -> np.ndarray:
    y = a + np.arange(a.shape[-1], dtype=np.float32) * np.float32(0.01)
    return 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y ** 3)))


CASES = [(_softmax, _np_softmax), (_layernorm, _np_layernorm), (_bias_gelu, _np_bias_gelu),
         (_sliced, lambda a: a[..., 1:] * 2 - np.abs(a[..., :-1])),
         (_concatenated, lambda a: np.pad(np.concatenate([a, np.exp(a)], -1), [(0, 0)] * (a.ndim - 1) + [(2, 3)]) * 2)]
SHAPES = [(3, 5), (17, 40), (2, 3, 33), (64, 100), (1, 7), (9, 1, 260), (130, 3)]


@pytest.mark.parametrize("prog,ref", CASES, ids=[c[0].__name__ for c in CASES])
def test_every_shape_of_a_program_computes_what_the_reference_does(prog: Program, ref: Callable[..., Any],
                                                                  monkeypatch: Any, capfd: Any) -> None:
    monkeypatch.setenv("BRAZE_SHAPE_VARIANTS", "3")  # generic kernels need no more
    monkeypatch.setattr(plan, "_warned", set())
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        a = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(prog(from_numpy(a)).numpy(), ref(a), rtol=2e-5, atol=2e-5, err_msg=str(shape))
    if fusion_enabled():
        assert "reference executor" not in capfd.readouterr().err


def test_a_generic_kernel_decides_its_streamed_stores_when_it_runs(monkeypatch: Any, plan_builds: list[bool]) -> None:
    """Past the last-level cache a kernel streams its stores: a generic kernel has both
    bodies, so a small and a large shape share one compiled object."""
    if not fusion_enabled():
        pytest.skip("the fused executor's kernels")
    from braze.codegen import c_stream
    monkeypatch.setattr(c_stream, "_LLC", 64 * 1024)  # a 64 KiB "cache": the larger shape is past it
    monkeypatch.setattr(plan, "_plan_path", lambda key: None)  # render now, with this cache size
    rng = np.random.default_rng(1)
    for shape in [(4, 33), (8, 40), (300, 200), (5, 6)]:
        a = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose((from_numpy(a) * 3 + 1).exp().numpy(), np.exp(a * 3 + 1), rtol=1e-6)
    assert not any(plan_builds[2:]), plan_builds


def test_a_quantized_matmul_takes_its_rows_at_run_time(plan_builds: list[bool]) -> None:
    """Past the matrix-vector path a quantized matmul's rows (a prompt's tokens) and a
    row gather's count are sizes: prompts of new lengths compile nothing."""
    from braze.quant import DTYPES, GGMLType, dequantize
    from braze.creation import from_blocks
    from braze.functions import qembedding, qlinear

    rng = np.random.default_rng(5)
    n, k = 48, 64
    raw = np.zeros((n, k // 32 * 20), np.uint8)
    for r in range(n):  # Q4_1 blocks: f16 scale and min, then 16 bytes of nibbles
        for b in range(k // 32):
            blk = raw[r, b * 20:(b + 1) * 20]
            blk[:2] = np.frombuffer(np.float16(0.01 + 0.001 * r).tobytes(), np.uint8)
            blk[2:4] = np.frombuffer(np.float16(-0.05).tobytes(), np.uint8)
            blk[4:] = rng.integers(0, 256, 16, dtype=np.uint8)
    w = from_blocks(raw.reshape(-1), DTYPES[GGMLType.Q4_1], (n, k))
    wf = dequantize(raw.reshape(-1), GGMLType.Q4_1, (n, k))
    for m in (20, 33, 50, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_allclose(qlinear(from_numpy(x), w).numpy(), x @ wf.T.astype(np.float32), rtol=1e-3, atol=2e-3)
        ids = rng.integers(0, n, m)
        np.testing.assert_array_equal(qembedding(w, braze.tensor(ids.tolist())).numpy(), wf[ids].astype(np.float32))
    if fusion_enabled():
        assert len(plan_builds) == 8 and not any(plan_builds[4:]), plan_builds


def test_causal_attention_at_every_prompt_length_compiles_two(monkeypatch: Any, plan_builds: list[bool]) -> None:
    """Prefill's attention at its first length is specialised, from the second on one
    generic kernel: its choices by size (one thread or a team, packed key tiles, split-K)
    are made when it runs, and a stride equal to a length (a 64-wide head against 64
    keys) is no coincidence that changes its text."""
    if not fusion_enabled():
        pytest.skip("the fused executor's kernels")
    import braze.nn.functional as F
    monkeypatch.setattr(plan, "_plan_path", lambda key: None)  # render now: compiled objects may be cached
    rng = np.random.default_rng(2)
    for n in (8, 16, 64, 96, 384, 40):
        q = rng.standard_normal((1, 6, n, 64)).astype(np.float32)
        k, v = (rng.standard_normal((1, 2, n, 64)).astype(np.float32) for _ in range(2))
        got = F.scaled_dot_product_attention(from_numpy(q), from_numpy(k), from_numpy(v), is_causal=True,
                                             enable_gqa=True).numpy()
        kr, vr = np.repeat(k, 3, 1), np.repeat(v, 3, 1)
        s = q @ kr.transpose(0, 1, 3, 2) / 8.0 + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ vr, atol=2e-5, rtol=0, err_msg=str(n))
    assert len(plan_builds) == 6 and not any(plan_builds[2:]), plan_builds
