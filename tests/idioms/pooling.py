"""Sentence-transformers pooling and similarity: mean/max/CLS/last-token pooling over a
padding mask, normalisation, cosine and dot scores."""

from __future__ import annotations

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, padding_mask, randn

B, S, D = 3, 10, 32
TOK = randn(B, S, D)
MASK = padding_mask(B, S)


def _mean_np(x, m):
    m = m[:, :, None].astype(np.float64)
    return (R.f64(x) * m).sum(1) / np.maximum(m.sum(1), 1e-9)


@idiom(TOK, MASK, kernels=1, oracle=_mean_np)
def mean_pooling(token_embeddings, attention_mask):
    input_mask_expanded = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).float()
    sum_embeddings = braze.sum(token_embeddings * input_mask_expanded, 1)
    sum_mask = braze.clamp(input_mask_expanded.sum(1), min=1e-9)
    return sum_embeddings / sum_mask


@idiom(TOK, MASK, kernels=1, oracle=_mean_np)
def mean_pooling_with_lengths(token_embeddings, attention_mask):
    m = attention_mask[..., None].to(token_embeddings.dtype)
    return (token_embeddings * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


@idiom(TOK, MASK, kernels=2, oracle=lambda x, m: R.l2_normalize(_mean_np(x, m), -1))
def mean_pooling_then_normalize(token_embeddings, attention_mask):
    m = attention_mask.unsqueeze(-1).float()
    emb = (token_embeddings * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(emb, p=2, dim=1)


@idiom(TOK, MASK, kernels=1, oracle=lambda x, m: np.where(m[:, :, None] == 0, -1e9, x).max(1).astype(np.float32))
def max_pooling_masked_fill(token_embeddings, attention_mask):
    m = attention_mask.unsqueeze(-1).expand(token_embeddings.size())
    return braze.max(token_embeddings.masked_fill(m == 0, -1e9), 1)[0]


@idiom(TOK, MASK, kernels=1, oracle=lambda x, m: np.where(m[:, :, None] == 0, -1e9, x).max(1).astype(np.float32))
def max_pooling_in_place_sentence_transformers(token_embeddings, attention_mask):
    input_mask_expanded = attention_mask.unsqueeze(-1).expand(token_embeddings.size())
    token_embeddings[input_mask_expanded == 0] = -1e9
    return braze.max(token_embeddings, 1)[0]


@idiom(TOK, kernels=0, oracle=lambda x: x[:, 0])
def cls_pooling(token_embeddings):
    return token_embeddings[:, 0]


@idiom(TOK, kernels=0, oracle=lambda x: x[:, -1])
def last_token_pooling_left_padded(token_embeddings):
    return token_embeddings[:, -1]


@idiom(TOK, MASK, kernels=2,
       oracle=lambda x, m: x[np.arange(B), m.sum(1) - 1])
def last_token_pooling_right_padded(token_embeddings, attention_mask):
    sequence_lengths = attention_mask.sum(dim=1) - 1
    idx = sequence_lengths[:, None, None].expand(-1, 1, D)
    return token_embeddings.gather(1, idx).squeeze(1)


@idiom(TOK, MASK, kernels=1,
       oracle=lambda x, m: (R.f64(x) * (m * np.arange(1, S + 1))[:, :, None]).sum(1) / (m * np.arange(1, S + 1)).sum(1)[:, None])
def weighted_mean_pooling_by_position(token_embeddings, attention_mask):  # SGPT
    weights = braze.arange(1, S + 1).float()[None, :, None].expand(token_embeddings.shape)
    m = attention_mask.unsqueeze(-1).expand(token_embeddings.shape).float()
    w = weights * m
    return (token_embeddings * w).sum(1) / w.sum(1)


@idiom(TOK, MASK, kernels=1, oracle=lambda x, m: (R.f64(x) * m[:, :, None]).sum(1) / np.sqrt(m.sum(1))[:, None])
def mean_sqrt_len_pooling(token_embeddings, attention_mask):
    m = attention_mask.unsqueeze(-1).float()
    return (token_embeddings * m).sum(1) / braze.sqrt(m.sum(1))


@idiom(randn(5, D), kernels=2, oracle=lambda a: R.l2_normalize(a) @ R.l2_normalize(a).T)
def cosine_similarity_matrix(a):  # util.cos_sim(a, a)
    a_norm = F.normalize(a, p=2, dim=1)
    return braze.mm(a_norm, a_norm.transpose(0, 1))


@idiom(randn(5, D), randn(7, D), kernels=3, oracle=lambda a, b: R.l2_normalize(a) @ R.l2_normalize(b).T)
def cosine_similarity_two_sets(a, b):
    a_norm = a / a.norm(dim=1)[:, None]
    b_norm = b / b.norm(dim=1)[:, None]
    return a_norm @ b_norm.T


@idiom(randn(5, D), randn(7, D), kernels=1, oracle=lambda a, b: R.f64(a) @ R.f64(b).T)
def dot_score(a, b):
    return a @ b.T


@idiom(randn(6, D), randn(6, D), kernels=1,
       oracle=lambda a, b: (R.f64(a) * b).sum(1) / (np.linalg.norm(R.f64(a), axis=1) * np.linalg.norm(R.f64(b), axis=1)))
def pairwise_cosine_similarity(a, b):
    return F.cosine_similarity(a, b, dim=1)


@idiom(randn(5, D), randn(7, D), kernels=1,
       oracle=lambda a, b: np.sqrt(((R.f64(a)[:, None] - R.f64(b)[None]) ** 2).sum(-1)))
def euclidean_distance_matrix(a, b):
    return (a[:, None, :] - b[None, :, :]).pow(2).sum(-1).sqrt()


@idiom(randn(5, D), kernels=1, oracle=lambda a: R.l2_normalize(a[:, :16]))
def matryoshka_truncate_and_normalize(emb):
    return F.normalize(emb[:, :16], p=2, dim=-1)


@idiom(randn(5, D), kernels=1, oracle=lambda a: a > 0)
def binary_quantization(emb):
    return emb > 0
