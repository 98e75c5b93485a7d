"""Normalisation layers as model files write them: LayerNorm, RMSNorm variants (Llama,
Gemma, T5, qk-norm), F.normalize, L2 and standardisation."""

from __future__ import annotations

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randn

X = randn(6, 10, 64)
W = randn(64)
B = randn(64)


@idiom(X, W, B, kernels=1, oracle=lambda x, w, b: R.layer_norm(x, w, b))
def layer_norm_functional(x, w, b):
    return F.layer_norm(x, w, b, 1e-5)


@idiom(X, W, B, kernels=1, oracle=lambda x, w, b: R.layer_norm(x, w, b))
def layer_norm_written_out(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / braze.sqrt(var + 1e-5) * w + b


@idiom(X, W, B, kernels=1, oracle=lambda x, w, b: R.layer_norm(x, w, b))
def layer_norm_with_var_unbiased_false(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return w * (x - mean) / (var + 1e-5).sqrt() + b


@idiom(X, W, kernels=1, oracle=lambda x, w: R.layer_norm(x, w))
def layer_norm_without_bias_nanogpt(x, w):
    return F.layer_norm(x, w, None, 1e-5)


@idiom(X, W, B, kernels=1, oracle=lambda x, w, b: R.f64(w) * (R.f64(x) - R.f64(x).mean(-1, keepdims=True)) / (R.f64(x).std(-1, ddof=1, keepdims=True) + 1e-6) + R.f64(b))
def standardise_with_std_annotated_transformer(x, w, b):
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)
    return w * (x - mean) / (std + 1e-6) + b


@idiom(X, W, kernels=1, oracle=lambda x, w: R.rms_norm(x, w))
def rms_norm_functional(x, w):
    return F.rms_norm(x, w, 1e-6)


@idiom(X, W, kernels=1, oracle=lambda x, w: R.rms_norm(x, w))
def rms_norm_pow_mean_rsqrt(x, w):  # HF LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * braze.rsqrt(variance + 1e-6))


@idiom(X, W, kernels=1, oracle=lambda x, w: R.rms_norm(x, w))
def rms_norm_llama_reference(x, w):  # x * rsqrt(mean(x^2)), computed in float, cast back
    def _norm(t):
        return t * braze.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)
    return _norm(x.float()).type_as(x) * w


@idiom(X, W, kernels=1, oracle=lambda x, w: R.rms_norm(x) * (1.0 + R.f64(w)))
def rms_norm_gemma_one_plus_weight(x, w):
    out = x * braze.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return out * (1.0 + w.float())


@idiom(X, W, kernels=1, oracle=lambda x, w: R.rms_norm(x, w, 0.0))
def rms_norm_with_norm_and_sqrt_dim(x, w):  # x / (||x|| / sqrt(d))
    return w * x / (x.norm(2, dim=-1, keepdim=True) * 64 ** -0.5)


@idiom(X, W, kernels=1, oracle=lambda x, w: R.f64(w) * R.f64(x) / np.sqrt((R.f64(x) ** 2).mean(-1, keepdims=True) + 1e-6))
def t5_layer_norm(x, w):  # T5: no mean subtraction, variance in float32
    variance = x.to(braze.float32).pow(2).mean(-1, keepdim=True)
    return w * (x * braze.rsqrt(variance + 1e-6))


@idiom(randn(2, 4, 8, 16), randn(16), kernels=1, oracle=lambda x, w: R.rms_norm(x, w))
def qk_norm_per_head(x, w):  # Qwen3 / OLMo-2: RMSNorm over each head's dims
    return F.rms_norm(x, w, 1e-6)


@idiom(randn(8, 32), kernels=1, oracle=lambda x: R.l2_normalize(x, 1))
def normalize_default_dim(x):
    return F.normalize(x)


@idiom(randn(8, 32), kernels=1, oracle=lambda x: R.l2_normalize(x, -1))
def normalize_p2_dim_minus_one(x):
    return F.normalize(x, p=2, dim=-1)


@idiom(randn(8, 32), kernels=1, oracle=lambda x: R.f64(x) / np.abs(R.f64(x)).sum(0, keepdims=True))
def normalize_p1_dim0(x):
    return F.normalize(x, p=1, dim=0)


@idiom(randn(8, 32), kernels=1, oracle=lambda x: R.f64(x) / np.linalg.norm(R.f64(x), axis=1, keepdims=True))
def divide_by_norm_method(x):
    return x / x.norm(dim=1, keepdim=True)


@idiom(randn(4, 6, 32), randn(32), randn(32), randn(32), randn(32), kernels=1,
       oracle=lambda x, m, v, w, b: (R.f64(x) - m) / np.sqrt(np.abs(R.f64(v)) + 1e-5) * w + b)
def batch_norm_inference(x, mean, var, w, b):
    return (x - mean) / braze.sqrt(var.abs() + 1e-5) * w + b


@idiom(X, randn(6, 10, 64), W, B, kernels=1, oracle=lambda x, r, w, b: R.layer_norm(R.f64(x) + r, w, b, 1e-12))
def residual_add_then_layer_norm_bert(x, residual, w, b):
    return F.layer_norm(x + residual, w, b, 1e-12)


@idiom(X, randn(6, 10, 64), W, kernels=1, oracle=lambda x, r, w: (R.f64(x) + r, R.rms_norm(R.f64(x) + r, w)))
def fused_add_rms_norm_two_outputs(x, residual, w):  # the residual stream and its norm
    h = x + residual
    return h, F.rms_norm(h, w, 1e-6)


@idiom(randn(6, 64), kernels=1, oracle=lambda x: 1.0 / np.sqrt((R.f64(x) ** 2).mean(-1, keepdims=True) + 1e-6))
def add_then_rsqrt_in_place(x):
    return x.pow(2).mean(-1, keepdim=True).add_(1e-6).rsqrt_()
