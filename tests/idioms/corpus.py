"""The registry of the idiom corpus.

A snippet is a function of braze tensors written the way users of a model family
write it, registered with ``@idiom``: its inputs (numpy arrays drawn from a seeded
generator, or plain Python values), an independent numpy oracle, and the number of
steps the fused executor should take (kernels plus extern steps, counted by
``stats()["kernel_launches"]``). A case whose count is not met yet says why: ``pending``
names the concurrent work it waits on, ``bug`` a limitation of the scheduler (both a
strict xfail where kernels are counted, fused); ``wrong`` names a wrong answer (a
strict xfail in both modes).

    @idiom(randn(4, 16), kernels=1, oracle=lambda x: np_softmax(x / 0.7))
    def softmax_with_temperature(x):
        return (x / 0.7).softmax(-1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Spec = Callable[[np.random.Generator], Any]


@dataclass(frozen=True)
class Idiom:
    family: str
    name: str
    fn: Callable[..., Any]
    oracle: Callable[..., Any]
    args: tuple[Any, ...]
    kernels: int
    rtol: float
    atol: float
    pending: str | None
    bug: str | None
    wrong: str | None

    @property
    def id(self) -> str:
        return f"{self.family}.{self.name}"


CASES: list[Idiom] = []


def idiom(*args: Any, kernels: int, oracle: Callable[..., Any], rtol: float = 1e-4, atol: float = 1e-5,
          pending: str | None = None, bug: str | None = None,
          wrong: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated snippet; ``args`` are specs (called with a generator)
    or values passed as they are to both the snippet and the oracle."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        family = fn.__module__.rsplit(".", 1)[-1]
        case = Idiom(family, fn.__name__, fn, oracle, args, kernels, rtol, atol, pending, bug, wrong)
        if any(c.id == case.id for c in CASES):
            raise ValueError(f"idiom {case.id} registered twice")
        CASES.append(case)
        return fn
    return register


class _Spec:
    """An input drawn from the case's generator (a class, so the runner can tell an
    input spec from a plain callable value)."""

    def __init__(self, draw: Spec) -> None:
        self.draw = draw

    def __call__(self, rng: np.random.Generator) -> Any:
        return self.draw(rng)


def randn(*shape: int, dtype: Any = np.float32, scale: float = 1.0) -> _Spec:
    return _Spec(lambda rng: (rng.standard_normal(shape) * scale).astype(dtype))


def rand(*shape: int, dtype: Any = np.float32, lo: float = 0.0, hi: float = 1.0) -> _Spec:
    return _Spec(lambda rng: rng.uniform(lo, hi, shape).astype(dtype))


def randint(lo: int, hi: int, *shape: int, dtype: Any = np.int64) -> _Spec:
    return _Spec(lambda rng: rng.integers(lo, hi, shape).astype(dtype))


def bools(*shape: int, p: float = 0.5) -> _Spec:
    return _Spec(lambda rng: rng.random(shape) < p)


def padding_mask(batch: int, seq: int, dtype: Any = np.int64, left: bool = False) -> _Spec:
    """An attention mask as tokenizers return it: 1 for tokens, 0 for padding; row i
    keeps ``seq - i`` tokens (at least one), padded on the right (or the left)."""
    def draw(rng: np.random.Generator) -> np.ndarray:
        m = np.zeros((batch, seq), dtype)
        for i in range(batch):
            n = max(1, seq - i)
            if left:
                m[i, seq - n:] = 1
            else:
                m[i, :n] = 1
        return m
    return _Spec(draw)


def value(x: Any) -> _Spec:
    """A fixed array (copied for each use)."""
    return _Spec(lambda rng: np.array(x, copy=True))


def draw(case: Idiom, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    return [a(rng) if isinstance(a, _Spec) else a for a in case.args]
