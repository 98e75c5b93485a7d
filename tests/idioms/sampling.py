"""Logit processors and sampling helpers as generation loops write them: temperature,
top-k, top-p, min-p, repetition and presence penalties, banned tokens, greedy picks."""

from __future__ import annotations

import math

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randint, randn

B, V = 4, 64
LOGITS = randn(B, V, scale=3.0)
IDS = randint(0, V, B, 10)


@idiom(LOGITS, kernels=1, oracle=lambda x: R.softmax(R.f64(x) / 0.8))
def temperature_then_softmax(logits):
    return F.softmax(logits / 0.8, dim=-1)


@idiom(randn(B, 7, V), kernels=1, oracle=lambda x: R.softmax(R.f64(x[:, -1, :]) / 0.7))
def last_position_temperature_softmax_nanogpt(logits):
    logits = logits[:, -1, :] / 0.7
    return F.softmax(logits, dim=-1)


@idiom(LOGITS, kernels=1, oracle=lambda x: x.argmax(-1))
def greedy_argmax(logits):
    return braze.argmax(logits, dim=-1)


@idiom(LOGITS, kernels=1, oracle=lambda x: x.argmax(-1))
def greedy_argmax_of_probs(logits):
    return (logits / 0.7).softmax(-1).argmax(-1)


@idiom(LOGITS, kernels=2, oracle=lambda x: np.where(x < np.sort(x, -1)[:, -5:-4], -np.inf, x).astype(np.float32))
def top_k_filter_hf(scores):  # TopKLogitsWarper
    indices_to_remove = scores < braze.topk(scores, 5)[0][..., -1, None]
    return scores.masked_fill(indices_to_remove, -float("inf"))


@idiom(LOGITS, kernels=2, oracle=lambda x: np.where(x < np.sort(x, -1)[:, -5:-4], -np.inf, x).astype(np.float32))
def top_k_filter_by_sort(scores):
    sorted_logits, _ = braze.sort(scores, descending=True)
    kth = sorted_logits[:, 4:5]
    return scores.masked_fill(scores < kth, float("-inf"))


def _top_p_np(x, p=0.9):
    probs = R.softmax(x)
    s = -np.sort(-probs, -1)
    c = np.cumsum(s, -1)
    s = np.where(c - s > p, 0.0, s)
    return s / s.sum(-1, keepdims=True)


@idiom(LOGITS, kernels=3, oracle=_top_p_np)
def top_p_renormalised_llama_reference(logits):  # sample_top_p, before the multinomial draw
    probs = braze.softmax(logits, dim=-1)
    probs_sort, probs_idx = braze.sort(probs, dim=-1, descending=True)
    probs_sum = braze.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > 0.9
    probs_sort = probs_sort.masked_fill(mask, 0.0)
    return probs_sort / probs_sort.sum(dim=-1, keepdim=True)


@idiom(LOGITS, kernels=1, oracle=lambda x: np.where(R.softmax(x) < 0.1 * R.softmax(x).max(-1, keepdims=True), -np.inf, x).astype(np.float32))
def min_p_filter(scores):
    probs = scores.softmax(-1)
    top = probs.amax(dim=-1, keepdim=True)
    return scores.masked_fill(probs < 0.1 * top, -float("inf"))


def _seen_np(ids):
    seen = np.zeros((B, V), bool)
    for b in range(B):
        seen[b, ids[b]] = True
    return seen


@idiom(LOGITS, IDS, kernels=1,
       oracle=lambda x, ids: np.where(_seen_np(ids), np.where(x < 0, x * 1.3, x / 1.3), x).astype(np.float32))
def repetition_penalty_from_presence_mask(scores, input_ids):
    seen = (input_ids[:, :, None] == braze.arange(V)).any(dim=1)
    penalised = braze.where(scores < 0, scores * 1.3, scores / 1.3)
    return braze.where(seen, penalised, scores)


def _counts_np(ids):
    c = np.zeros((B, V), np.float64)
    for b in range(B):
        np.add.at(c[b], ids[b], 1)
    return c


@idiom(LOGITS, IDS, kernels=1,
       oracle=lambda x, ids: (x - _counts_np(ids) * 0.5 - (_counts_np(ids) > 0) * 0.25).astype(np.float32))
def frequency_and_presence_penalty(logits, input_ids):
    counts = (input_ids[:, :, None] == braze.arange(V)).sum(1).float()
    return logits - counts * 0.5 - (counts > 0).float() * 0.25


@idiom(LOGITS, kernels=1, oracle=lambda x: np.where(np.arange(V) == 3, -np.inf, x).astype(np.float32))
def suppress_eos_before_min_length(scores):
    return scores.masked_fill(braze.arange(V) == 3, float("-inf"))


@idiom(LOGITS, kernels=2, oracle=lambda x: np.where(np.arange(V) == 3, -np.inf, x).astype(np.float32))
def suppress_eos_by_slice_assignment(scores):
    scores = scores.clone()
    scores[:, 3] = -float("inf")
    return scores


@idiom(LOGITS, randn(V), kernels=1, oracle=lambda x, b: R.f64(x) + b)
def logit_bias(scores, bias):
    return scores + bias


@idiom(LOGITS, kernels=2, oracle=lambda x: np.take_along_axis(R.log_softmax(x), np.array([[1], [5], [7], [9]]), -1))
def chosen_token_logprobs(logits):
    ids = braze.tensor([[1], [5], [7], [9]])
    return F.log_softmax(logits, dim=-1).gather(-1, ids)


@idiom(LOGITS, randn(B), kernels=2,
       oracle=lambda x, s: np.sort((R.log_softmax(x) + s[:, None]).reshape(-1))[::-1][:8])
def beam_search_candidates(logits, beam_scores):
    scores = F.log_softmax(logits, dim=-1) + beam_scores[:, None]
    return scores.view(-1).topk(8).values


@idiom(LOGITS, kernels=1, oracle=lambda x: (np.tanh(R.f64(x) / 30.0) * 30.0))
def final_logit_softcapping(logits):
    logits = logits / 30.0
    logits = braze.tanh(logits)
    return logits * 30.0


@idiom(LOGITS, kernels=1, oracle=lambda x: R.softmax(x) * (R.softmax(x) >= 0.01))
def drop_tiny_probabilities(logits):  # epsilon sampling's mask, applied to probabilities
    p = logits.softmax(-1)
    return braze.where(p >= 0.01, p, 0.0)


@idiom(LOGITS, kernels=1,
       oracle=lambda x: -(R.softmax(x) * R.log_softmax(x)).sum(-1, keepdims=True) / math.log(V))
def normalised_entropy_for_typical_decoding(scores):
    normalized = F.log_softmax(scores, dim=-1)
    p = normalized.exp()
    return -(normalized * p).sum(-1, keepdim=True) / math.log(V)
