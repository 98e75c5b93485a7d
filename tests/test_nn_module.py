"""braze.nn.Module: parameters, buffers and submodules, state dicts (strict and not,
every problem reported at once), tied weights, casts, calls."""

from __future__ import annotations

import numpy as np
import pytest

import braze
import braze.nn as nn
from braze.errors import StateDictMismatch
from nn_oracle import as_tensor, assert_close, randf32, seeded


# =========================================================================================
# Module
# =========================================================================================

class Leaf(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.w = braze.zeros(n, n)
        self.b = braze.zeros(n)

    def forward(self, x: braze.Tensor) -> braze.Tensor:
        return x @ self.w.T + self.b


class Tree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = braze.ones(3)
        self.leaf = Leaf()
        self.layers = nn.ModuleList([Leaf(), Leaf()])
        self.count = braze.zeros(1, dtype=braze.int64)
        self.register_buffer("stat", braze.zeros(3))
        self.register_buffer("tmp", braze.zeros(4), persistent=False)
        self.note = "not a tensor"

    def forward(self, x: braze.Tensor) -> braze.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.leaf(x) * self.scale


PARAM_NAMES = ["scale", "count", "leaf.w", "leaf.b", "layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b"]


def _fresh_state(m: nn.Module) -> dict[str, braze.Tensor]:
    rng = seeded(1)
    out = {}
    for k, v in m.state_dict().items():
        if v.dtype.is_floating_point:
            out[k] = braze.tensor(rng.standard_normal(v.shape).astype(np.float32))
        else:
            out[k] = braze.tensor(np.arange(v.numel(), dtype=np.int64).reshape(v.shape))
    return out


def test_module_registers_parameters_and_submodules() -> None:
    m = Tree()
    assert set(m._modules) == {"leaf", "layers"}
    assert "note" not in m._parameters and m.note == "not a tensor"
    assert isinstance(m.leaf, Leaf)
    assert isinstance(m.layers[1], Leaf) and len(m.layers) == 2
    assert [n for n, _ in m.named_parameters()] == PARAM_NAMES
    params = list(m.parameters())
    assert len(params) == len(PARAM_NAMES)
    assert params[2] is m.leaf.w and params[6] is m.layers[1].w
    # buffers are not parameters
    assert not any(p is m.stat for p in params)
    # re-assigning a name to a non-tensor unregisters it
    m.leaf.b = None
    assert [n for n, _ in m.leaf.named_parameters()] == ["w"]
    assert m.leaf.b is None
    # named_modules and children
    assert [n for n, _ in m.named_modules()] == ["", "leaf", "layers", "layers.0", "layers.1"]
    assert list(m.children()) == [m.leaf, m.layers]


def test_module_requires_super_init() -> None:
    class Bad(nn.Module):
        def __init__(self) -> None:
            self.w = braze.zeros(2)

    with pytest.raises(AttributeError):
        Bad()


def test_reassigning_a_plain_attribute_to_a_tensor_registers_it() -> None:
    # regression: ``self.bias = None`` stored a plain attribute that shadowed a tensor
    # assigned later under the same name (the getter returned None)
    lin = nn.Linear(3, 2, bias=False)
    b = braze.ones(2)
    lin.bias = b
    assert lin.bias is b
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    x = np.ones((1, 3), np.float32)
    assert_close(lin(as_tensor(x)), np.ones((1, 2)))
    m = Tree()
    m.note = None
    m.register_buffer("note", braze.zeros(2))
    assert isinstance(m.note, braze.Tensor) and "note" in m.state_dict()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear.from_weights(self.embed.weight)


def test_tied_weights_counted_once_and_stay_tied() -> None:
    m = Tied()
    # as PyTorch: parameters() lists a shared tensor once, state_dict() under every name
    assert [n for n, _ in m.named_parameters()] == ["embed.weight"]
    assert list(m.state_dict()) == ["embed.weight", "head.weight"]
    # regression: to() cast each name separately, untying the weights and doubling memory
    m.to(braze.float64)
    assert m.head.weight is m.embed.weight and m.embed.weight.dtype is braze.float64


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError):
        Tree().nope  # noqa: B018


def test_state_dict_persistent_buffers() -> None:
    m = Tree()
    sd = m.state_dict()
    assert list(sd) == PARAM_NAMES[:2] + ["stat"] + PARAM_NAMES[2:]
    assert "tmp" not in sd
    assert sd["stat"] is m.stat
    assert sd["layers.0.w"] is m.layers[0].w


def test_load_state_dict_binds_without_copy() -> None:
    m = Tree()
    new = _fresh_state(m)
    missing, unexpected = m.load_state_dict(new)
    assert missing == [] and unexpected == []
    for k, v in m.state_dict().items():
        assert v is new[k], k
        assert v.shares_storage(new[k])
    assert m.layers[1].w is new["layers.1.w"]
    assert m.stat is new["stat"]
    # a write through the loaded tensor shows in the module (same memory)
    new["leaf.b"][0] = 42.0
    assert m.leaf.b.numpy()[0] == 42.0
    # the non-persistent buffer is untouched
    assert m.tmp.shape == (4,)


def test_load_state_dict_reports_every_problem_at_once() -> None:
    m = Tree()
    before = dict(m.state_dict())
    tmp_before = m.tmp
    bad = _fresh_state(m)
    del bad["leaf.w"]
    del bad["stat"]
    bad["extra.one"] = braze.zeros(1)
    bad["tmp"] = braze.zeros(4)  # a non-persistent buffer is not part of the state
    bad["layers.0.w"] = braze.zeros(3, 4)  # shape
    bad["layers.1.b"] = braze.zeros(3, dtype=braze.float64)  # dtype
    bad["scale"] = np.ones(3, np.float32)  # not a braze tensor
    with pytest.raises(StateDictMismatch) as info:
        m.load_state_dict(bad)
    err = info.value
    msg = str(err)
    assert isinstance(err, KeyError)
    assert sorted(err.missing) == ["leaf.w", "stat"]
    assert sorted(err.unexpected) == ["extra.one", "tmp"]
    for key in ["leaf.w", "stat", "extra.one", "tmp", "layers.0.w", "layers.1.b", "scale"]:
        assert key in msg, key
    assert "(3, 4)" in msg and "(3, 3)" in msg
    assert "float64" in msg and "float32" in msg
    assert len(err.mismatched) == 3
    assert any(s.startswith("layers.0.w") and "shape" in s for s in err.mismatched)
    assert any(s.startswith("layers.1.b") and "dtype" in s for s in err.mismatched)
    assert any(s.startswith("scale") for s in err.mismatched)
    # nothing was bound: even the keys that were fine
    after = m.state_dict()
    assert list(after) == list(before)
    for k in before:
        assert after[k] is before[k], k
    assert m.tmp is tmp_before


def test_load_state_dict_non_strict() -> None:
    m = Tree()
    new = _fresh_state(m)
    del new["leaf.w"]
    new["extra"] = braze.zeros(2)
    old_leaf_w = m.leaf.w
    missing, unexpected = m.load_state_dict(new, strict=False)
    assert missing == ["leaf.w"]
    assert unexpected == ["extra"]
    assert m.leaf.w is old_leaf_w
    assert m.leaf.b is new["leaf.b"]
    assert not hasattr(m, "extra")
    # shapes are still checked without strict, and nothing is bound on failure
    m2 = Tree()
    b_before = m2.leaf.b
    with pytest.raises(StateDictMismatch) as info:
        m2.load_state_dict({"leaf.w": braze.zeros(2, 2), "leaf.b": braze.ones(3), "zzz": braze.zeros(1)},
                           strict=False)
    assert "leaf.w" in str(info.value)
    assert info.value.missing == [] and info.value.unexpected == []
    assert m2.leaf.b is b_before


def test_to_casts_floating_only() -> None:
    m = Tree()
    out = m.to(braze.float64)
    assert out is m
    for name, p in m.named_parameters():
        want = braze.int64 if name == "count" else braze.float64
        assert p.dtype is want, name
    assert m.stat.dtype is braze.float64 and m.tmp.dtype is braze.float64
    x = braze.tensor(np.ones((2, 3)))
    assert m(x).dtype is braze.float64


def test_call_runs_forward_and_repr() -> None:
    m = Tree()
    m.load_state_dict(_fresh_state(m))
    x = randf32(seeded(2), 2, 3)
    sd = {k: v.numpy().astype(np.float64) for k, v in m.state_dict().items()}
    y = x.astype(np.float64)
    for i in range(2):
        y = y @ sd[f"layers.{i}.w"].T + sd[f"layers.{i}.b"]
    y = (y @ sd["leaf.w"].T + sd["leaf.b"]) * sd["scale"]
    assert_close(m(as_tensor(x)), y)
    r = repr(m)
    assert r.startswith("Tree(") and "(leaf): Leaf()" in r and "(layers): ModuleList(" in r
    assert "(0): Leaf()" in r and r.endswith(")")
    assert repr(nn.Linear(4, 5)) == "Linear(in_features=4, out_features=5, bias=True)"

    class NoForward(nn.Module):
        pass

    with pytest.raises(NotImplementedError):
        NoForward()(1)
