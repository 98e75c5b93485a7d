"""Repair terms (Neptune): derivations, proofs, refusals, memoisation, and the IR side,
checked end to end by running the fused one-pass loop on numbers against two passes."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import sympy

from braze import dtypes as dt
from braze import ir
from braze.ops.registry import REGISTRY
from braze.schedule import repair
from braze.schedule.repair import Repair, derive, derive_ir

x, s, v, m, l, mean, r = sympy.symbols("x s v m l mean r", real=True)
F32 = dt.float32


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.simplify(a - b) == 0


def ok(res: Repair | str) -> Repair:
    assert isinstance(res, Repair), res
    return res


def test_softmax_denominator() -> None:
    rep = ok(derive(sympy.exp(x - m), [m], "sum"))
    assert rep.method == "separation"
    assert same(rep.h, rep.t * sympy.exp(rep.r[0] - rep.r_new[0]))


def test_attention_accumulator() -> None:
    rep = ok(derive(sympy.exp(s - m) * v, [m], "sum"))
    assert same(rep.h, rep.t * sympy.exp(m - rep.r_new[0]))


def test_two_producers() -> None:
    rep = ok(derive(sympy.exp(s - m) / l * v, [m, l], "sum"))
    mn, ln = rep.r_new
    assert same(rep.h, rep.t * sympy.exp(m - mn) * l / ln)


def test_variance_with_running_mean_is_refused() -> None:
    why = derive((x - mean) ** 2, [mean], "sum")
    assert isinstance(why, str)
    assert "g is not invertible in its constant argument: 2 solutions" in why
    assert "separation" in why


def test_affine_repair_is_max_only() -> None:
    rep = ok(derive(x - m, [m], "amax"))
    assert rep.method == "inversion"
    assert same(rep.h, rep.t + m - rep.r_new[0])
    why = derive(x - m, [m], "sum")
    assert isinstance(why, str) and "h does not distribute over sum" in why


def test_scaling_by_a_producer() -> None:
    # t * r'/r would divide by the running r, which starts at 0: refused (documented).
    why = derive(x * r, [r], "sum")
    assert isinstance(why, str) and "divides by" in why
    why = derive(x * r, [r], "amax")
    assert isinstance(why, str) and "not provably positive" in why
    # dividing by r' is dividing by what g(r', c) divides by already: accepted
    rep = ok(derive(x / r, [r], "sum"))
    assert same(rep.h, rep.t * r / rep.r_new[0])


def test_max_and_min_of_exponentials() -> None:
    for red in ("amax", "amin"):
        rep = ok(derive(sympy.exp(x - m) * sympy.exp(v), [m], red))
        assert same(rep.h, rep.t * sympy.exp(m - rep.r_new[0]))


def test_no_dependence_is_identity() -> None:
    rep = ok(derive(sympy.exp(x) * v, [m], "sum"))
    assert rep.method == "identity" and rep.h == rep.t
    assert ok(derive(x, [m], "prod")).method == "identity"


def test_prod_and_unknown_reducers_refused() -> None:
    why = derive(sympy.exp(x - m), [m], "prod")
    assert isinstance(why, str) and "does not distribute over prod" in why
    assert "any" in str(derive(x - m, [m], "any"))


def test_partial_functions_of_producers_refused() -> None:
    why = derive(sympy.log(x - m), [m], "sum")
    assert isinstance(why, str) and "log" in why and "domain" in why


def test_memoised() -> None:
    g = sympy.exp(2 * (s - m)) * v * 3
    before = repair.cache_info()
    a = derive(g, [m], "sum")
    b = derive(sympy.exp(2 * (s - m)) * v * 3, (m,), "sum")
    after = repair.cache_info()
    assert a is b
    assert after.misses == before.misses + 1 and after.hits == before.hits + 1


# -- IR ---------------------------------------------------------------------------------

def load(arg: int) -> ir.Load:
    return ir.Load(arg, ir.Affine(0, (0, 1)), F32)


def op(name: str, *args: ir.Expr) -> ir.Op:
    return ir.Op(name, args, F32)


def acc(stage: int) -> ir.Acc:
    return ir.Acc(stage, F32)


NP: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "neg": np.negative,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1 / np.sqrt(a),
    "reciprocal": lambda a: 1 / a, "maximum": np.maximum, "minimum": np.minimum, "pow": np.power,
    "cast": lambda a: a, "where": np.where, "lt": np.less,
}


def evaluate(e: ir.Expr, loads: Sequence[float], accs: dict[int, float]) -> float:
    if isinstance(e, ir.Const):
        return float(e.value)
    if isinstance(e, ir.Load):
        return loads[e.arg]
    if isinstance(e, ir.Acc):
        return accs[e.stage]
    assert isinstance(e, ir.Op), e
    assert e.name in REGISTRY, e.name
    with np.errstate(all="ignore"):
        return float(NP[e.name](*(evaluate(a, loads, accs) for a in e.args)))


FOLD = {"sum": (0.0, lambda a, b: a + b), "amax": (-math.inf, max)}


def one_pass(stages: list[tuple[str, ir.Expr]], rows: np.ndarray, safe: bool = False) -> list[float]:
    """Run every stage in one pass over the rows, repairing each accumulator with the
    derived repair whenever an earlier accumulator moves (what the fused kernel does).
    ``safe``: g and h see 0 for a running max that is still -inf (a masked prefix)."""
    reps = [ok(derive_ir(e, list(range(k)), red)) for k, (red, e) in enumerate(stages)]
    accs = {k: FOLD[red][0] for k, (red, _) in enumerate(stages)}

    def seen(a: dict[int, float]) -> dict[int, float]:
        return {k: 0.0 if safe and val == -math.inf else val for k, val in a.items()}

    for row in rows:
        old = seen(accs)
        for k, (red, e) in enumerate(stages):
            new = seen(accs)
            fixed = reps[k].apply(ir.Const(accs[k], F32), [ir.Const(old[p], F32) for p in range(k)],
                                  [ir.Const(new[p], F32) for p in range(k)])
            t = evaluate(fixed, [], {}) if k else accs[k]
            accs[k] = FOLD[red][1](t, evaluate(e, list(row), new))
    return [accs[k] for k in range(len(stages))]


def test_online_softmax_and_attention_end_to_end() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(50, 2)) * 3  # (score, value) per element
    sc, val = load(0), load(1)
    p = op("exp", op("sub", sc, acc(0)))
    stages = [("amax", sc), ("sum", p), ("sum", op("mul", op("div", p, acc(1)), val))]
    m_, l_, o_ = one_pass(stages, rows)
    w = np.exp(rows[:, 0] - rows[:, 0].max())
    assert m_ == rows[:, 0].max()
    assert l_ == pytest.approx(w.sum(), rel=1e-12)
    assert o_ == pytest.approx((w / w.sum() * rows[:, 1]).sum(), rel=1e-12)


def test_masked_scores_and_constants() -> None:
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(40, 1))
    sc = load(0)
    masked = ir.Op("where", (op("lt", sc, ir.Const(1.0, F32)), sc, ir.Const(-math.inf, F32)), F32)
    scaled = op("mul", ir.Const(0.125, F32), op("sub", op("cast", masked), acc(0)))
    stages = [("amax", masked), ("sum", op("exp", scaled)), ("amax", op("sub", sc, acc(0)))]
    m_, l_, d_ = one_pass(stages, rows)
    xs = rows[:, 0][rows[:, 0] < 1.0]
    assert l_ == pytest.approx(np.exp(0.125 * (xs - xs.max())).sum(), rel=1e-12)
    assert d_ == pytest.approx(rows[:, 0].max() - xs.max(), rel=1e-12)


def test_masked_prefix_needs_a_finite_running_max() -> None:
    """While the running max is -inf, exp(s - m') is nan: the kernel must use a stand-in."""
    rows = np.array([[-math.inf], [-math.inf], [0.5], [2.0], [-math.inf], [1.0]])
    sc = load(0)
    stages = [("amax", sc), ("sum", op("exp", op("sub", sc, acc(0))))]
    assert math.isnan(one_pass(stages, rows)[1])
    expect = np.exp(np.array([0.5, 2.0, 1.0]) - 2.0).sum()
    assert one_pass(stages, rows, safe=True)[1] == pytest.approx(expect, rel=1e-12)


def test_ir_refusals() -> None:
    sc = load(0)
    why = derive_ir(op("sin", op("sub", sc, acc(0))), [0], "sum")
    assert isinstance(why, str) and "op sin" in why
    cond = op("lt", sc, acc(0))
    why = derive_ir(ir.Op("where", (cond, sc, ir.Const(0.0, F32)), F32), [0], "sum")
    assert isinstance(why, str) and "where" in why
    why = derive_ir(ir.Op("cast", (op("sub", sc, acc(0)),), dt.float16), [0], "sum")
    assert isinstance(why, str) and "float16" in why
    why = derive_ir(op("mul", op("sub", sc, acc(0)), op("sub", sc, acc(0))), [0], "sum")
    assert isinstance(why, str) and "2 solutions" in why


def test_equal_subtrees_share_a_symbol() -> None:
    sc, other = load(0), load(1)
    e = op("mul", op("exp", op("sub", sc, acc(3))), op("add", sc, acc(1)))  # acc(1): not a producer
    consts: dict[Any, sympy.Symbol] = {}
    g = repair._to_sympy(op("mul", e, op("add", other, sc)), {3: sympy.Symbol("m", real=True)}, consts)
    assert len(consts) == 3  # sc, acc(1), other
    rep = ok(derive_ir(e, [3], "sum"))
    assert rep.r == (sympy.Symbol("acc3", real=True),)
    assert g.free_symbols == set(consts.values()) | {sympy.Symbol("m", real=True)}


def test_apply_emits_registry_ops() -> None:
    rep = ok(derive(sympy.exp(s - m) / l**2 * v / sympy.sqrt(x), [m, l], "sum"))
    t64 = ir.Const(2.0, dt.float64)
    out = rep.apply(t64, [ir.Const(1.0, F32), ir.Const(3.0, F32)], [ir.Const(1.5, F32), ir.Const(4.0, F32)])
    names = {n.name for n in ir.walk(out) if isinstance(n, ir.Op)}
    assert names <= set(REGISTRY) and "exp" in names and "div" in names
    assert all(n.dtype is dt.float64 for n in ir.walk(out) if isinstance(n, ir.Op))
    assert evaluate(out, [], {}) == pytest.approx(2.0 * math.exp(1.0 - 1.5) * 9 / 16)
