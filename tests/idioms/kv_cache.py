"""KV-cache updates as model code writes them: slice assignment at the position,
index_copy_ at cache_position (HF StaticCache), cat (DynamicCache), a rolling window,
and reading back the written prefix."""

from __future__ import annotations

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randn, value

B, H, L, D = 2, 2, 12, 8
CACHE = randn(B, H, L, D)


def _written(cache, new, pos):
    out = np.array(cache, copy=True)
    out[:, :, pos:pos + new.shape[2]] = new
    return out


@idiom(CACHE, randn(B, H, 3, D), 4, kernels=1, oracle=_written)
def slice_assignment_at_position(cache, k, pos):
    cache[:, :, pos:pos + k.shape[2]] = k
    return cache


@idiom(randn(B, L, H, D), randn(B, 3, H, D), 4, kernels=1,
       oracle=lambda c, k, p: np.concatenate([c[:, :p], k, c[:, p + 3:]], 1))
def llama_reference_cache_write(cache_k, xk, start_pos):  # self.cache_k[:bsz, start_pos:start_pos+seqlen] = xk
    bsz, seqlen = xk.shape[0], xk.shape[1]
    cache_k[:bsz, start_pos:start_pos + seqlen] = xk
    return cache_k


@idiom(CACHE, randn(B, H, 2, D), value(np.array([5, 6])), kernels=1,
       oracle=lambda c, k, p: _written(c, k, 5))
def index_copy_at_cache_position_static_cache(k_cache, key_states, cache_position):
    k_cache.index_copy_(2, cache_position, key_states)
    return k_cache


@idiom(CACHE, randn(B, H, 2, D), value(np.array([0, 11])), kernels=1,
       oracle=lambda c, k, p: np.concatenate([k[:, :, :1], c[:, :, 1:11], k[:, :, 1:]], 2))
def index_copy_out_of_place_scattered_positions(k_cache, key_states, cache_position):
    return k_cache.index_copy(2, cache_position, key_states)


@idiom(randn(B, H, 5, D), randn(B, H, 1, D), kernels=1, oracle=lambda past, k: np.concatenate([past, k], 2))
def dynamic_cache_cat(past_k, k):
    return braze.cat([past_k, k], dim=-2)


@idiom(CACHE, randn(B, H, 1, D), kernels=2, oracle=lambda c, k: np.concatenate([c[:, :, 1:], k], 2))
def sliding_window_cache_roll_then_write(cache, k):
    cache = cache.roll(-1, dims=2)
    cache[:, :, -1:] = k
    return cache


@idiom(CACHE, randn(B, H, 1, D), kernels=1, oracle=lambda c, k: np.concatenate([c[:, :, 1:], k], 2))
def sliding_window_cache_shift_by_cat(cache, k):
    return braze.cat([cache[:, :, 1:], k], dim=2)


@idiom(CACHE, randn(B, H, 1, D), randn(B, H, 1, D), 6, kernels=2,
       oracle=lambda c, k, q, p: R.attention(q, _written(c, k, p)[:, :, :p + 1], _written(c, k, p)[:, :, :p + 1]))
def write_then_attend_over_prefix(cache, k, q, pos):
    cache[:, :, pos:pos + 1] = k
    keys = cache[:, :, :pos + 1]
    return F.scaled_dot_product_attention(q, keys, keys)


@idiom(CACHE, randn(B, H, 1, D), 6, kernels=1, oracle=lambda c, k, p: _written(c, k, p)[:, :, p])
def copy_into_selected_position(cache, k, pos):
    cache[:, :, pos].copy_(k[:, :, 0])
    return cache[:, :, pos]


@idiom(CACHE, 5, kernels=0, oracle=lambda c, n: c[:, :, :n])
def narrow_the_written_prefix(cache, length):
    return cache.narrow(2, 0, length)


@idiom(randn(B, H, L, D), randn(B, L, H, D), kernels=1, oracle=lambda c, k: k.transpose(0, 2, 1, 3))
def write_transposed_keys(cache, k):  # (B, S, H, D) projections into a (B, H, S, D) cache
    cache.copy_(k.transpose(1, 2))
    return cache


# A paged KV cache (vLLM's PagedAttention): one pool of blocks of BS rows, each sequence
# a row of a block table; the step writes its new rows at their slots and attends
# through the table (tests/test_paged.py has the full story).
BS, BLOCKS, KVH = 4, 6, 2
POOL = randn(BLOCKS * BS, KVH, D)
TABLE = np.array([[4, 0, 2], [1, 4, 5]])  # block 4 shared: a common prefix
POS = np.array([[9], [5]])  # each sequence's last position


def _paged_written(pool, k, slots):
    out = np.array(pool, copy=True)
    out[slots] = k
    return out


@idiom(POOL, randn(3, KVH, D), value(np.array([5, 17, 0])), kernels=1, oracle=_paged_written)
def paged_pool_write_at_slots(pool, k, slots):
    pool[slots] = k
    return pool


@idiom(POOL, randn(2, KVH, D), value(np.array([9, 23])), kernels=2,
       oracle=lambda pool, k, slots: _paged_written(pool, k * 0.5, slots))
def paged_pool_index_copy_of_computed_rows(pool, k, slots):
    pool.index_copy_(0, slots, k * 0.5)
    return pool


def _paged_reference(q, kp, vp, table, pos):
    L = table.shape[1] * BS

    def rows(p):
        return np.swapaxes(p.reshape(BLOCKS, BS, KVH, D)[table].reshape(2, L, KVH, D), 1, 2)

    mask = (np.arange(L)[None, :] <= pos.reshape(2, 1)).reshape(2, 1, 1, L)
    return R.attention(q, R.repeat_kv(rows(kp), 2), R.repeat_kv(rows(vp), 2), mask=mask)


@idiom(randn(2, 2 * KVH, 1, D), POOL, POOL, value(TABLE), value(POS), kernels=1, oracle=_paged_reference)
def paged_decoding_attention_through_a_block_table(q, kp, vp, table, pos):
    L = table.shape[1] * BS
    k = kp.view(BLOCKS, BS, KVH, D)[table].reshape(2, L, KVH, D).transpose(1, 2)
    v = vp.view(BLOCKS, BS, KVH, D)[table].reshape(2, L, KVH, D).transpose(1, 2)
    mask = (braze.arange(L).reshape(1, L) <= pos.reshape(2, 1)).reshape(2, 1, 1, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
