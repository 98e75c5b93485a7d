"""Hugging Face modeling files, piece by piece: Llama's RMSNorm, MLP and eager
attention, the 4-d causal mask with cache_position, BERT's output and pooler, GPT-2's
Conv1D, Gemma's scaled embeddings, T5's relative position buckets, Mixtral's router,
CLIP's logit scale, BART's inverted mask."""

from __future__ import annotations

import math

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, padding_mask, randint, randn, value

B, H, S, D = 2, 4, 8, 16
HID = H * D
MIN = float(np.finfo(np.float32).min)
Q = randn(B, H, S, D)


@idiom(randn(B, S, HID, dtype=np.float16), randn(HID, dtype=np.float16), kernels=1,
       oracle=lambda x, w: (w * R.rms_norm(x.astype(np.float32)).astype(np.float32).astype(np.float16)),
       rtol=2e-3, atol=2e-3)
def llama_rms_norm(hidden_states, weight):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(braze.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * braze.rsqrt(variance + 1e-6)
    return weight * hidden_states.to(input_dtype)


@idiom(randn(B, S, HID), randn(96, HID), randn(96, HID), randn(HID, 96), kernels=4,
       oracle=lambda x, g, u, d: (R.silu(R.f64(x) @ g.T) * (R.f64(x) @ u.T)) @ d.T, rtol=1e-4, atol=1e-4)
def llama_mlp(x, gate_w, up_w, down_w):
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def _hf_mask_np(m, cache_start=0):
    q, k = S, S
    cm = np.full((q, k), MIN, np.float32)
    cm = np.triu(cm, 1)
    cm = cm * (np.arange(k) > (np.arange(q) + cache_start)[:, None])
    cm = np.broadcast_to(cm[None, None], (B, 1, q, k)).copy()
    pad = cm + m[:, None, None, :]
    cm[pad == 0] = MIN
    return cm


@idiom(Q, randn(B, H, S, D), randn(B, H, S, D), value(_hf_mask_np(np.ones((B, S)))), kernels=2,
       oracle=lambda q, k, v, m: R.attention(q, k, v, bias=m).transpose(0, 2, 1, 3))
def llama_eager_attention_forward(query, key_states, value_states, attention_mask):
    attn_weights = braze.matmul(query, key_states.transpose(2, 3)) * D ** -0.5
    causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=braze.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=0.0, training=False)
    attn_output = braze.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous()


@idiom(padding_mask(B, S, dtype=np.int64, left=True), value(np.arange(S)), kernels=2,
       oracle=lambda m, cp: _hf_mask_np(m))
def prepare_4d_causal_mask_with_cache_position(attention_mask, cache_position):
    min_dtype = braze.finfo(braze.float32).min
    causal_mask = braze.full((S, S), fill_value=min_dtype, dtype=braze.float32)
    causal_mask = braze.triu(causal_mask, diagonal=1)
    causal_mask *= braze.arange(S) > cache_position.reshape(-1, 1)
    causal_mask = causal_mask[None, None, :, :].expand(B, 1, -1, -1)
    causal_mask = causal_mask.clone()
    mask_length = attention_mask.shape[-1]
    padding_mask = causal_mask[:, :, :, :mask_length] + attention_mask[:, None, None, :]
    padding_mask = padding_mask == 0
    causal_mask[:, :, :, :mask_length] = causal_mask[:, :, :, :mask_length].masked_fill(padding_mask, min_dtype)
    return causal_mask


@idiom(randn(B, S, HID), randn(B, S, HID), randn(HID, HID), randn(HID), randn(HID), randn(HID), kernels=2,
       oracle=lambda h, inp, w, b, g, beta: R.layer_norm(R.f64(h) @ w.T + b + inp, g, beta, 1e-12), rtol=1e-4, atol=1e-4)
def bert_self_output(hidden_states, input_tensor, dense_w, dense_b, ln_w, ln_b):
    hidden_states = F.linear(hidden_states, dense_w, dense_b)
    hidden_states = F.dropout(hidden_states, 0.1, training=False)
    return F.layer_norm(hidden_states + input_tensor, (HID,), ln_w, ln_b, 1e-12)


@idiom(randn(B, S, HID), randn(HID, HID), randn(HID), kernels=2,
       oracle=lambda h, w, b: np.tanh(R.f64(h[:, 0]) @ w.T + b))
def bert_pooler(hidden_states, w, b):
    first_token_tensor = hidden_states[:, 0]
    return braze.tanh(F.linear(first_token_tensor, w, b))


@idiom(randint(0, 30, B, S), randn(30, HID), randn(S, HID), randn(2, HID), randn(HID), randn(HID), kernels=1,
       oracle=lambda ids, we, pe, te, g, b: R.layer_norm(R.f64(we[ids]) + pe[None] + te[0], g, b, 1e-12))
def bert_embeddings(input_ids, word, position, token_type, ln_w, ln_b):  # ids from zeros and arange: read through
    position_ids = braze.arange(S)[None, :]
    token_type_ids = braze.zeros(B, S, dtype=braze.long)
    emb = F.embedding(input_ids, word) + F.embedding(token_type_ids, token_type) + F.embedding(position_ids, position)
    return F.layer_norm(emb, (HID,), ln_w, ln_b, 1e-12)


@idiom(randn(B, S, HID), randn(HID, 3 * HID), randn(3 * HID), kernels=2,
       oracle=lambda x, w, b: R.f64(x) @ w + b, rtol=1e-4, atol=1e-4)
def gpt2_conv1d_addmm(x, weight, bias):
    size_out = x.size()[:-1] + (3 * HID,)
    x = braze.addmm(bias, x.view(-1, x.size(-1)), weight)
    return x.view(size_out)


@idiom(Q, randn(B, H, S, D), randn(B, H, S, D), kernels=1,
       oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)))
def gpt2_attn_where_with_mask_value(query, key, value):
    attn_weights = braze.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / braze.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype)
    causal_mask = braze.tril(braze.ones((S, S), dtype=braze.bool)).view(1, 1, S, S)
    mask_value = braze.full([], braze.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype)
    attn_weights = braze.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
    attn_weights = F.softmax(attn_weights, dim=-1)
    return braze.matmul(attn_weights, value)


@idiom(randn(B, S, HID), kernels=1, oracle=lambda h: R.f64(h) * np.float32(HID ** 0.5))
def gemma_scaled_embeddings(hidden_states):
    normalizer = braze.tensor(HID ** 0.5, dtype=hidden_states.dtype)
    return hidden_states * normalizer


def _t5_buckets_np(q, k, num_buckets=32, max_distance=128):
    rel = np.arange(k)[None, :] - np.arange(q)[:, None]
    nb = num_buckets // 2
    buckets = (rel > 0).astype(np.int64) * nb
    rel = np.abs(rel)
    max_exact = nb // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(rel / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact))
    large = np.minimum(np.where(rel < max_exact, 0, large).astype(np.int64), nb - 1)
    return buckets + np.where(rel < max_exact, rel, large)


@idiom(S, 40, kernels=1, oracle=_t5_buckets_np)
def t5_relative_position_bucket(query_length, key_length):
    context_position = braze.arange(query_length, dtype=braze.long)[:, None]
    memory_position = braze.arange(key_length, dtype=braze.long)[None, :]
    relative_position = memory_position - context_position
    num_buckets, max_distance = 32 // 2, 128
    relative_buckets = (relative_position > 0).to(braze.long) * num_buckets
    relative_position = braze.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (
        braze.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(braze.long)
    large = braze.min(large, braze.full_like(large, num_buckets - 1))
    return relative_buckets + braze.where(is_small, relative_position, large)


def _router_np(x, k=2):
    p = R.softmax(x)
    top = -np.sort(-p, -1)[:, :k]
    return top / top.sum(-1, keepdims=True)


@idiom(randn(6, 8), kernels=3, oracle=_router_np)
def mixtral_router_top2_renormalised(router_logits):
    routing_weights = F.softmax(router_logits, dim=1, dtype=braze.float)
    routing_weights, selected_experts = braze.topk(routing_weights, 2, dim=-1)
    routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
    return routing_weights


@idiom(randn(6, 8), kernels=2, oracle=_router_np)
def router_topk_of_logits_then_softmax(router_logits):  # softmax over the top-k logits only
    top, _ = braze.topk(router_logits, 2, dim=-1)
    return top.softmax(-1)


@idiom(randn(4, HID), randn(5, HID), value(np.float32(math.log(1 / 0.07))), kernels=4,
       oracle=lambda t, i, s: R.l2_normalize(t) @ R.l2_normalize(i).T * np.exp(s))
def clip_logits_per_text(text_embeds, image_embeds, logit_scale):
    image_embeds = image_embeds / image_embeds.norm(p=2, dim=-1, keepdim=True)
    text_embeds = text_embeds / text_embeds.norm(p=2, dim=-1, keepdim=True)
    return braze.matmul(text_embeds, image_embeds.t()) * logit_scale.exp()


@idiom(padding_mask(B, S), kernels=1,
       oracle=lambda m: np.where(np.broadcast_to(m[:, None, None, :], (B, 1, S, S)) == 0, MIN, 0.0).astype(np.float32))
def bart_expand_and_invert_mask(mask):
    expanded_mask = mask[:, None, None, :].expand(B, 1, S, S).to(braze.float32)
    inverted_mask = 1.0 - expanded_mask
    return inverted_mask.masked_fill(inverted_mask.to(braze.bool), braze.finfo(braze.float32).min)


@idiom(randn(B, S, 40), kernels=0, oracle=lambda x: x[:, -1:, :])
def logits_to_keep_slice(hidden):  # hidden_states[:, -logits_to_keep:, :]
    return hidden[:, -1:, :]


@idiom(randn(B, S, 40, dtype=np.float16), kernels=1, oracle=lambda x: x.astype(np.float32))
def logits_upcast_to_float(logits):
    return logits.float()


@idiom(randn(B, H, S, D), randn(D), kernels=1, oracle=lambda x, w: R.rms_norm(x, w, 1e-6))
def qwen3_q_norm_per_head(q, w):
    variance = q.pow(2).mean(-1, keepdim=True)
    return w * (q * braze.rsqrt(variance + 1e-6))


@idiom(randn(B, S, HID), kernels=0, oracle=lambda x: x.reshape(B, S, H, D).transpose(0, 2, 1, 3))
def split_heads_view_transpose(x):  # hidden_shape = (*input_shape, -1, head_dim)
    hidden_shape = (*x.shape[:-1], -1, D)
    return x.view(hidden_shape).transpose(1, 2)


@idiom(randn(B, S, 2 * HID), kernels=1, oracle=lambda x: R.f64(x[..., :HID]) * R.sigmoid(x[..., HID:]))
def gated_output_chunk_sigmoid(x):  # Qwen3-Next style gate: out, gate = chunk(2)
    out, gate = braze.chunk(x, 2, dim=-1)
    return out * braze.sigmoid(gate)
