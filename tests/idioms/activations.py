"""Activation functions as model files write them (HF ACT2FN, nanoGPT, CLIP, Gemma)."""

from __future__ import annotations

import math

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randn

X = randn(8, 48, scale=2.0)


@idiom(X, kernels=1, oracle=R.gelu)
def gelu_exact(x):
    return F.gelu(x)


@idiom(X, kernels=1, oracle=R.gelu_tanh)
def gelu_tanh_approximate(x):
    return F.gelu(x, approximate="tanh")


@idiom(X, kernels=1, oracle=R.gelu_tanh)
def new_gelu_nanogpt(x):  # nanoGPT / HF "gelu_new"
    return 0.5 * x * (1.0 + braze.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * braze.pow(x, 3.0))))


@idiom(X, kernels=1, oracle=R.gelu)
def gelu_from_erf(x):  # HF GELUActivation's python form
    return x * 0.5 * (1.0 + braze.erf(x / math.sqrt(2.0)))


@idiom(X, kernels=1, oracle=lambda x: R.f64(x) * R.sigmoid(1.702 * R.f64(x)))
def quick_gelu(x):  # CLIP
    return x * braze.sigmoid(1.702 * x)


@idiom(X, kernels=1, oracle=lambda x: 0.5 * R.f64(x) * (1 + np.tanh(0.7978845608 * R.f64(x) * (1 + 0.044715 * R.f64(x) ** 2))))
def fast_gelu(x):  # HF FastGELUActivation
    return 0.5 * x * (1.0 + braze.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


@idiom(X, kernels=1, oracle=R.silu)
def silu_functional(x):
    return F.silu(x)


@idiom(X, kernels=1, oracle=R.silu)
def silu_written_out(x):
    return x * x.sigmoid()


@idiom(X, kernels=1, oracle=R.silu)
def swish_from_exp(x):
    return x / (1.0 + (-x).exp())


@idiom(randn(6, 64), kernels=1, oracle=lambda x: R.silu(x[:, :32]) * R.f64(x[:, 32:]))
def swiglu_from_chunk(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@idiom(randn(6, 64), kernels=1, oracle=lambda x: R.f64(x[:, :32]) * R.gelu(x[:, 32:]))
def geglu_from_torch_chunk(x):
    h, gate = braze.chunk(x, 2, dim=-1)
    return h * F.gelu(gate)


@idiom(randn(6, 64), kernels=1, oracle=lambda x: R.f64(x[:, :32]) * R.sigmoid(x[:, 32:]))
def glu_functional(x):
    return F.glu(x, dim=-1)


@idiom(X, kernels=1, oracle=lambda x: np.maximum(R.f64(x), 0) ** 2)
def relu_squared(x):  # Primer
    return F.relu(x).square()


@idiom(X, kernels=1, oracle=lambda x: np.where(x >= 0, R.f64(x), 0.01 * R.f64(x)))
def leaky_relu(x):
    return F.leaky_relu(x, 0.01)


@idiom(X, kernels=1, oracle=R.softplus)
def softplus(x):
    return F.softplus(x)


@idiom(X, kernels=1, oracle=lambda x: R.f64(x) * np.tanh(R.softplus(x)))
def mish(x):
    return F.mish(x)


@idiom(X, kernels=1, oracle=lambda x: R.f64(x) * np.clip(R.f64(x) + 3, 0, 6) / 6)
def hard_swish(x):
    return x * (x + 3.0).clamp(0.0, 6.0) / 6.0


@idiom(X, kernels=1, oracle=lambda x: np.tanh(R.f64(x) / 3.0) * 3.0)
def tanh_softcap(x):  # Gemma 2's attention and final logit soft-capping
    return braze.tanh(x / 3.0) * 3.0


@idiom(X, kernels=1, oracle=lambda x: np.minimum(R.f64(x), 0) - np.log1p(np.exp(-np.abs(R.f64(x)))))
def logsigmoid(x):
    return F.logsigmoid(x)


@idiom(X, kernels=1, oracle=lambda x: np.where(x > 0, R.f64(x), np.expm1(R.f64(x))))
def elu(x):
    return F.elu(x)


@idiom(randn(4, 2, 32), kernels=1, oracle=lambda x: R.silu(x[..., 0, :]) * R.f64(x[..., 1, :]))
def swiglu_from_unbind(x):
    gate, up = x.unbind(-2)
    return F.silu(gate) * up


@idiom(X, kernels=1, oracle=lambda x: np.clip(R.f64(x), 0, 6))
def relu6(x):
    return F.relu6(x)
