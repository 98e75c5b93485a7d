"""Softmax as it is written: with a temperature, with max(dim) for the shift, in float32
then cast back, over a non-last dim, log-softmax, logsumexp, entropy."""

from __future__ import annotations

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randn

X = randn(16, 50, scale=3.0)


@idiom(X, kernels=1, oracle=lambda x: R.softmax(R.f64(x) / 0.7))
def softmax_with_temperature(x):
    return F.softmax(x / 0.7, dim=-1)


@idiom(X, kernels=1, oracle=R.softmax)
def softmax_method(x):
    return x.softmax(-1)


@idiom(X, kernels=1, oracle=R.softmax)
def softmax_shift_by_max_values_index(x):
    e = (x - x.max(dim=-1, keepdim=True)[0]).exp()
    return e / e.sum(dim=-1, keepdim=True)


@idiom(X, kernels=1, oracle=R.softmax)
def softmax_shift_by_max_values_attribute(x):
    e = braze.exp(x - braze.max(x, -1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


@idiom(X, kernels=1, oracle=R.softmax)
def softmax_shift_by_amax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


@idiom(randn(16, 50, dtype=np.float16), kernels=1,
       oracle=lambda x: R.softmax(x.astype(np.float32)).astype(np.float16), rtol=2e-3, atol=1e-3)
def softmax_in_float32_cast_back(x):  # HF eager attention's softmax(dtype=float32).to(dtype)
    return F.softmax(x, dim=-1, dtype=braze.float32).to(x.dtype)


@idiom(randn(4, 12, 9), kernels=1, oracle=lambda x: R.softmax(x, 1))
def softmax_over_middle_dim(x):
    return x.softmax(dim=1)


@idiom(randn(12, 7), kernels=1, oracle=lambda x: R.softmax(x, 0))
def softmax_over_dim0(x):
    return braze.softmax(x, 0)


@idiom(X, kernels=1, oracle=R.log_softmax)
def log_softmax(x):
    return F.log_softmax(x, dim=-1)


@idiom(X, kernels=1, oracle=lambda x: np.log(np.exp(R.f64(x)).sum(-1)))
def logsumexp(x):
    return braze.logsumexp(x, dim=-1)


@idiom(X, kernels=1, oracle=lambda x: R.f64(x) - np.log(np.exp(R.f64(x)).sum(-1, keepdims=True)))
def log_softmax_via_logsumexp(x):
    return x - x.logsumexp(-1, keepdim=True)


@idiom(X, kernels=1, oracle=lambda x: -(R.softmax(x) * R.log_softmax(x)).sum(-1))
def entropy_of_logits(x):
    p = F.softmax(x, -1)
    return -(p * F.log_softmax(x, -1)).sum(-1)


@idiom(X, kernels=1, oracle=lambda x: (R.softmax(x), R.softmax(x).max(-1)))
def softmax_and_its_confidence(x):  # probabilities, and the top probability per row
    p = x.softmax(-1)
    return p, p.max(-1).values


@idiom(X, randn(16, 50), kernels=1, oracle=lambda s, t: (R.softmax(t) * (R.log_softmax(t) - R.log_softmax(s))).sum(-1))
def kl_divergence_of_logits(student, teacher):
    p = teacher.softmax(-1)
    return (p * (teacher.log_softmax(-1) - student.log_softmax(-1))).sum(-1)


@idiom(X, kernels=1, oracle=lambda x: R.softmax(np.tanh(R.f64(x) / 30.0) * 30.0))
def softmax_of_softcapped_logits(x):
    return (braze.tanh(x / 30.0) * 30.0).softmax(-1)
