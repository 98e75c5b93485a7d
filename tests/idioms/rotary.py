"""Rotary position embeddings in both layouts: half-split (HF ``rotate_half``, GPT-NeoX)
and interleaved pairs (GPT-J, the Llama reference's complex multiply written in reals),
with their cos/sin tables built as models build them."""

from __future__ import annotations

import numpy as np

import braze

from . import npref as R
from .corpus import idiom, randint, randn, value

B, H, S, D = 2, 4, 8, 16
COS, SIN = (t.astype(np.float32) for t in R.rope_tables(S, D))


def _rope_np(x, cos=COS, sin=SIN):
    return R.f64(x) * cos + R.rotate_half(x) * sin


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return braze.cat((-x2, x1), dim=-1)


@idiom(randn(B, H, S, D), value(COS), value(SIN), kernels=1, oracle=_rope_np)
def rope_rotate_half(x, cos, sin):
    return x * cos + rotate_half(x) * sin


@idiom(randn(B, H, S, D), randn(B, 2, S, D), value(COS), value(SIN), kernels=2,
       oracle=lambda q, k, c, s: (_rope_np(q), _rope_np(k)))
def rope_apply_to_q_and_k_unsqueeze_dim(q, k, cos, sin):  # HF apply_rotary_pos_emb; q and k: two shapes
    cos, sin = cos[None].unsqueeze(1), sin[None].unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@idiom(randn(B, H, S, D), value(COS), value(SIN), kernels=1, oracle=_rope_np)
def rope_rotate_half_with_chunk(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + braze.cat([-x2, x1], -1) * sin


@idiom(randn(B, S, H, D), kernels=1, oracle=lambda x: R.rope_interleaved(x, 1))
def rope_interleaved_pairs_llama_reference(x):  # (B, S, H, D): xq_.view(..., D/2, 2) as (re, im)
    inv = 1.0 / (10000.0 ** (braze.arange(0, D, 2).float() / D))
    freqs = braze.outer(braze.arange(S).float(), inv)  # (S, D/2)
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    out = braze.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    return out.flatten(3).type_as(x)


@idiom(randn(B, H, S, D), kernels=1, oracle=lambda x: R.rope_interleaved(x, 2))
def rope_interleaved_gptj_rotate_every_two(x):
    inv = 1.0 / (10000.0 ** (braze.arange(0, D, 2, dtype=braze.float32) / D))
    ang = braze.einsum("i,j->ij", braze.arange(S, dtype=braze.float32), inv)
    sin = ang.sin().repeat_interleave(2, dim=-1)
    cos = ang.cos().repeat_interleave(2, dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    rotated = braze.stack((-x2, x1), dim=-1).flatten(-2)
    return x * cos + rotated * sin


@idiom(kernels=1, oracle=lambda: (COS, SIN))
def rope_tables_from_inv_freq(cos_only=None):  # HF LlamaRotaryEmbedding: outer product, cat, cos/sin
    inv_freq = 1.0 / (10000 ** (braze.arange(0, D, 2, dtype=braze.int64).float() / D))
    t = braze.arange(S).float()
    freqs = braze.outer(t, inv_freq)
    emb = braze.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


@idiom(value(np.arange(S)[None].repeat(2, 0)), kernels=1,
       oracle=lambda p: (np.broadcast_to(COS, (2, S, D)), np.broadcast_to(SIN, (2, S, D))))
def rope_tables_from_position_ids_matmul(position_ids):  # HF: inv_freq[None, :, None] @ position_ids[:, None, :]
    # (an outer product: a mul, recomputed with its operands where the cat reads it)
    inv_freq = 1.0 / (10000 ** (braze.arange(0, D, 2).float() / D))
    inv_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    pos_expanded = position_ids[:, None, :].float()
    freqs = (inv_expanded @ pos_expanded).transpose(1, 2)
    emb = braze.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


@idiom(randn(B, H, S, D), value(COS), value(SIN), randint(0, S, B, S), kernels=1,
       oracle=lambda x, c, s, p: R.f64(x) * c[p][:, None] + R.rotate_half(x) * s[p][:, None])
def rope_tables_indexed_by_position_ids(x, cos, sin, position_ids):  # cos[position_ids].unsqueeze(1)
    c = cos[position_ids].unsqueeze(1)
    s = sin[position_ids].unsqueeze(1)
    return x * c + rotate_half(x) * s


@idiom(randn(B, H, S, D), kernels=1,
       oracle=lambda x: np.concatenate([_rope_np(x[..., :8], *(t.astype(np.float32) for t in R.rope_tables(S, 8))),
                                        x[..., 8:]], -1))
def partial_rotary_neox(x):  # rotary_pct = 0.5: rotate the first half of each head, pass the rest
    rot, keep = x[..., :8], x[..., 8:]
    inv = 1.0 / (10000 ** (braze.arange(0, 8, 2).float() / 8))
    freqs = braze.outer(braze.arange(S).float(), inv)
    emb = braze.cat((freqs, freqs), dim=-1)
    rot = rot * emb.cos() + rotate_half(rot) * emb.sin()
    return braze.cat((rot, keep), dim=-1)


@idiom(randn(B, H, 1, D), value(COS), value(SIN), 5, kernels=1,
       oracle=lambda x, c, s, p: _rope_np(x, c[p:p + 1], s[p:p + 1]))
def rope_one_decoding_position_sliced(x, cos, sin, pos):  # tables sliced at the position
    return x * cos[pos:pos + 1] + rotate_half(x) * sin[pos:pos + 1]


@idiom(randn(B, H, S, D, dtype=np.float16), value(COS), value(SIN), kernels=1,
       oracle=lambda x, c, s: _rope_np(x.astype(np.float32), c, s).astype(np.float16), rtol=2e-3, atol=2e-3)
def rope_half_precision_tables_cast(x, cos, sin):  # cos.to(dtype) as HF does before applying
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


@idiom(randn(B, S, H, D), value(COS), value(SIN), kernels=1,
       oracle=lambda x, c, s: _rope_np(x.transpose(0, 2, 1, 3), c, s))
def rope_after_head_transpose(x, cos, sin):  # (B, S, H, D) -> (B, H, S, D), then rotate
    x = x.transpose(1, 2)
    return x * cos + rotate_half(x) * sin
