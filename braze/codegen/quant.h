/* braze's quantized matmul: y[m, n] = sum_k x[m, k] * W[n, k], W in GGML blocks.
 *
 * Every GGML type is read the same way: a row of W is unpacked into unsigned 8-bit
 * values q (one byte per element) and, per chunk of CH elements (16 or 32), a scale s
 * and an offset o, so that w = s * q + o. Signed types fold their bias into o (Q4_0:
 * q = nibble, o = -8 d; Q8_0: q = byte + 128, o = -128 d), so a dot product is one
 * unsigned-by-signed integer dot per chunk plus o times the chunk's sum of x:
 *
 *     sum_k w x  =  sum_chunks  s * dx * idot(q, xq)  +  o * sum(x)
 *
 * with x quantized once per row in blocks of 32 (xq, scale dx: int8, or int8x2, 15 bits
 * kept as two int8 halves, the mode codegen/quant.py picks) and its sums per chunk
 * taken from the float values. The integer dot is AVX-512 VNNI's vpdpbusd (or
 * AVX-VNNI's) where -march=native has it, else a plain loop gcc vectorises.
 *
 * Few rows (decoding): one x row is dotted block by block with four W rows unpacked
 * in registers (matrix-vector, reads each weight byte once); 2..BRAZE_QFEW rows (a
 * batched step) take strips of W read once for every x row (with 512-bit VNNI, the x
 * rows in one register's lanes against a broadcast W row); rows of W in parallel.
 * Many rows (prefill): a block of NT rows of W is dequantized to float once, stored
 * as the k x NT packed tile braze_mm (tile.h) reads, and multiplied by every x row.
 * Float weights (F32, F16, BF16) take the same GEMM path for many rows; at few rows,
 * four W rows at a time are converted in registers and dotted with float x.
 *
 * Types are entries of one table (braze/codegen/quant.py): an unpack function
 * braze_unpack_<type>(block, q, s, o) per type and an instantiation of
 * BRAZE_QLINEAR(type, ...). Reading past W, x or y never happens: rows are whole
 * blocks, which the recording checks.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define BRAZE_VNNI 1
#endif
#if defined(BRAZE_VNNI) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float braze_q_h2f(uint16_t h) {
    /* float16 -> float32, exact (scales are float16 in every block) */
#ifdef __F16C__
    return _cvtsh_ss(h);
#endif
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, em = h & 0x7fff;
    union { uint32_t u; float f; } v;
    if (em >= 0x7c00) v.u = sign | 0x7f800000u | ((uint32_t)(em & 0x3ff) << 13);
    else if (em >= 0x0400) v.u = sign | ((em + ((127 - 15) << 10)) << 13);
    else { v.f = (float)em * 5.9604644775390625e-08f; v.u |= sign; }
    return v.f;
}
static inline uint16_t braze_q_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline float braze_q_f16(const uint8_t *p) { return braze_q_h2f(braze_q_u16(p)); }

/* ---- unpackers: one block -> q[BS] (0..255), s[BS/CH], o[BS/CH] -------------------
 * In GCC vector types (16 or 32 bytes at a time): byte by byte, gcc left the nibble
 * loops scalar (q may alias the block), and unpacking cost 10x the dot product. */

typedef uint8_t braze_u8x16 __attribute__((vector_size(16), aligned(1), may_alias));
typedef uint8_t braze_u8x32 __attribute__((vector_size(32), aligned(1), may_alias));
#define BRAZE_U16(p) (*(const braze_u8x16 *)(p))
#define BRAZE_U32(p) (*(const braze_u8x32 *)(p))
#define BRAZE_PUT32(p, v) (*(braze_u8x32 *)(p) = (v))

/* 8 bytes (signed or not: `sign` a literal where inlined) as floats; gcc converts them
 * byte by byte through scalar registers otherwise */
static inline __attribute__((always_inline)) braze_v8 braze_bytes_to_v8(const void *p, const int sign) {
#if defined(__AVX2__)
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return (braze_v8)_mm256_cvtepi32_ps(sign ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#else
    braze_v8 r;
    for (int i = 0; i < 8; i++) r[i] = sign ? (float)((const int8_t *)p)[i] : (float)((const uint8_t *)p)[i];
    return r;
#endif
}
/* 16 chunks' scales, d times the signed bytes sc, and offsets, bias times the scales */
static inline void braze_k16_scales(const int8_t *sc, float d, float bias, float *s, float *o) {
    for (int h = 0; h < 16; h += 8) {
        braze_v8 v = d * braze_bytes_to_v8(sc + h, 1);
        braze_v8_store(s + h, v);
        braze_v8_store(o + h, bias * v);
    }
}
static inline void braze_nibbles32(const uint8_t *restrict qs, uint8_t *restrict q) {
    /* one 32-byte store: two 16-byte ones read back as one vector miss store forwarding */
    braze_u8x16 v = BRAZE_U16(qs);
    BRAZE_PUT32(q, __builtin_shufflevector(v & 15, v >> 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                           16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31));
}
/* bit i of the little-endian 32-bit word at qh, as 16 in byte i */
static inline braze_u8x32 braze_bits32(const uint8_t *qh) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    uint32_t h;
    memcpy(&h, qh, 4);
    return (braze_u8x32)_mm256_movm_epi8(h) & 16;  /* one instruction: bit i -> byte i */
#endif
    const braze_u8x32 sel = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                             1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    braze_u8x32 b = {qh[0], qh[0], qh[0], qh[0], qh[0], qh[0], qh[0], qh[0], qh[1], qh[1], qh[1], qh[1], qh[1], qh[1],
                     qh[1], qh[1], qh[2], qh[2], qh[2], qh[2], qh[2], qh[2], qh[2], qh[2], qh[3], qh[3], qh[3], qh[3],
                     qh[3], qh[3], qh[3], qh[3]};
    return (braze_u8x32)((b & sel) != 0) & 16;
}
static inline void braze_unpack_q4_0(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    float d = braze_q_f16(b); braze_nibbles32(b + 2, q); s[0] = d; o[0] = -8.0f * d;
}
static inline void braze_unpack_q4_1(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    braze_nibbles32(b + 4, q); s[0] = braze_q_f16(b); o[0] = braze_q_f16(b + 2);
}
static inline void braze_unpack_q5_0(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    float d = braze_q_f16(b);
    braze_nibbles32(b + 6, q);
    BRAZE_PUT32(q, BRAZE_U32(q) | braze_bits32(b + 2));
    s[0] = d; o[0] = -16.0f * d;
}
static inline void braze_unpack_q5_1(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    braze_nibbles32(b + 8, q);
    BRAZE_PUT32(q, BRAZE_U32(q) | braze_bits32(b + 4));
    s[0] = braze_q_f16(b); o[0] = braze_q_f16(b + 2);
}
static inline void braze_unpack_q8_0(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    float d = braze_q_f16(b);
    BRAZE_PUT32(q, BRAZE_U32(b + 2) ^ 0x80);  /* int8 + 128 */
    s[0] = d; o[0] = -128.0f * d;
}
/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin; 2-bit values,
 * element 128 n + 32 j + l is bits 2j of qs[32 n + l]; chunks of 16 in element order. */
static inline void braze_unpack_q2_k(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = braze_q_f16(b + 80), dmin = braze_q_f16(b + 82);
    for (int n = 0; n < 2; n++) {
        braze_u8x32 v = BRAZE_U32(qs + 32 * n);
        for (int j = 0; j < 4; j++) BRAZE_PUT32(q + 128 * n + 32 * j, (v >> (2 * j)) & 3);
    }
    braze_u8x16 v = BRAZE_U16(sc), lo = v & 15, hi = v >> 4;
    for (int h = 0; h < 16; h += 8) {
        braze_v8_store(s + h, d * braze_bytes_to_v8((const uint8_t *)&lo + h, 0));
        braze_v8_store(o + h, -dmin * braze_bytes_to_v8((const uint8_t *)&hi + h, 0));
    }
}
/* 6-bit signed scales of Q3_K, 16 of them packed in 12 bytes */
static inline void braze_q3k_scales(const uint8_t *p, int8_t *out) {
    uint32_t a[4];
    memcpy(a, p, 12);
    uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
    a[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
    a[0] = (a[0] & 0x0f0f0f0fu) | (((t >> 0) & 0x03030303u) << 4);
    a[1] = (a[1] & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
    memcpy(out, a, 16);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)(out[i] - 32);
}
/* Q3_K: hmask[32], qs[64], scales[12], d; value = 2 low bits + 4 * high bit - 4,
 * the high bit of element 128 n + 32 j + l is bit 4n + j of hmask[l] */
static inline void braze_unpack_q3_k(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    const uint8_t *qs = b + 32;
    braze_u8x32 hm = BRAZE_U32(b);
    int8_t sc[16];
    braze_q3k_scales(b + 96, sc);
    float d = braze_q_f16(b + 108);
    for (int n = 0; n < 2; n++) {
        braze_u8x32 v = BRAZE_U32(qs + 32 * n);
        for (int j = 0; j < 4; j++)
            BRAZE_PUT32(q + 128 * n + 32 * j, ((v >> (2 * j)) & 3) | (((hm >> (4 * n + j)) & 1) << 2));
    }
    braze_k16_scales(sc, d, -4.0f, s, o);
}
/* The 6-bit scales and mins of Q4_K/Q5_K, 8 of each packed in 12 bytes (scale j < 4:
 * the low 6 bits of byte j, min j: of byte j + 4; j >= 4: the nibbles of byte j + 4 and
 * the top 2 bits of bytes j - 4 and j), four at a time in 32-bit words (a scalar loop
 * of byte picks was a third of Q4_K's time), times d and -dmin. */
static inline void braze_k4_scales(const uint8_t *p, float d, float dmin, float *s, float *o) {
    uint32_t a[3], v[4];
    memcpy(a, p, 12);
    v[0] = a[0] & 0x3f3f3f3fu;                                                /* scales 0..3 */
    v[1] = (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4);        /* scales 4..7 */
    v[2] = a[1] & 0x3f3f3f3fu;                                                /* mins 0..3 */
    v[3] = ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4); /* mins 4..7 */
    const uint8_t *b = (const uint8_t *)v;
    braze_v8_store(s, d * braze_bytes_to_v8(b, 0));
    braze_v8_store(o, -dmin * braze_bytes_to_v8(b + 8, 0));
}
static inline void braze_unpack_q4_k(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    float d = braze_q_f16(b), dmin = braze_q_f16(b + 2);
    const uint8_t *qs = b + 16;
    for (int j = 0; j < 4; j++) {
        braze_u8x32 v = BRAZE_U32(qs + 32 * j);
        BRAZE_PUT32(q + 64 * j, v & 15);
        BRAZE_PUT32(q + 64 * j + 32, v >> 4);
    }
    braze_k4_scales(b + 4, d, dmin, s, o);
}
static inline void braze_unpack_q5_k(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    float d = braze_q_f16(b), dmin = braze_q_f16(b + 2);
    braze_u8x32 qh = BRAZE_U32(b + 16);
    const uint8_t *qs = b + 48;
    for (int j = 0; j < 4; j++) {
        braze_u8x32 v = BRAZE_U32(qs + 32 * j);
        BRAZE_PUT32(q + 64 * j, (v & 15) | (((qh >> (2 * j)) & 1) << 4));
        BRAZE_PUT32(q + 64 * j + 32, (v >> 4) | (((qh >> (2 * j + 1)) & 1) << 4));
    }
    braze_k4_scales(b + 4, d, dmin, s, o);
}
/* Q6_K: ql[128], qh[64], scales[16] (int8), d; value = 4 low + 2 high bits - 32 */
static inline void braze_unpack_q6_k(const uint8_t *restrict b, uint8_t *restrict q, float *s, float *o) {
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = braze_q_f16(b + 208);
    for (int n = 0; n < 2; n++) {
        braze_u8x32 l0 = BRAZE_U32(b + 64 * n), l1 = BRAZE_U32(b + 64 * n + 32), h = BRAZE_U32(b + 128 + 32 * n);
        uint8_t *Q = q + 128 * n;
        BRAZE_PUT32(Q, (l0 & 15) | ((h & 3) << 4));
        BRAZE_PUT32(Q + 32, (l1 & 15) | (((h >> 2) & 3) << 4));
        BRAZE_PUT32(Q + 64, (l0 >> 4) | (((h >> 4) & 3) << 4));
        BRAZE_PUT32(Q + 96, (l1 >> 4) | (((h >> 6) & 3) << 4));
    }
    braze_k16_scales(sc, d, -32.0f, s, o);
}

/* ---- float rows: F32, F16, BF16 --------------------------------------------------- */

static inline void braze_row_f32(const uint8_t *w, int64_t k, float *out) { memcpy(out, w, (size_t)k * 4); }
static inline void braze_row_f16(const uint8_t *w, int64_t k, float *out) {
    const uint16_t *h = (const uint16_t *)w;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= k; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#endif
    for (; i < k; i++) out[i] = braze_q_h2f(h[i]);
}
static inline float braze_bf2f(uint16_t h) { union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f; }
static inline void braze_row_bf16(const uint8_t *w, int64_t k, float *out) {
    const uint16_t *h = (const uint16_t *)w;
    for (int64_t i = 0; i < k; i++) out[i] = braze_bf2f(h[i]);
}

/* Element i of a float row, and BRAZE_VL of them from i, as float32: the decoding path
 * converts in registers (through a row buffer, an F16 file decoded at 10 GB/s) */
typedef float braze_es_f32;  /* the element types, for their sizes */
typedef uint16_t braze_es_f16;
typedef uint16_t braze_es_bf16;
static inline float braze_ld1_f32(const uint8_t *w, int64_t i) { return ((const float *)w)[i]; }
static inline float braze_ld1_f16(const uint8_t *w, int64_t i) { return braze_q_h2f(((const uint16_t *)w)[i]); }
static inline float braze_ld1_bf16(const uint8_t *w, int64_t i) { return braze_bf2f(((const uint16_t *)w)[i]); }
static inline braze_vf braze_ldvf_f32(const uint8_t *w, int64_t i) { return braze_vf_load((const float *)w + i); }
static inline braze_vf braze_ldvf_f16(const uint8_t *w, int64_t i) {
    const uint16_t *h = (const uint16_t *)w + i;
#if defined(__AVX512F__)
    return (braze_vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
#elif defined(__F16C__) && defined(__AVX__)
    return (braze_vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
#else
    braze_vf r;
    for (int l = 0; l < BRAZE_VL; l++) r[l] = braze_q_h2f(h[l]);
    return r;
#endif
}
static inline braze_vf braze_ldvf_bf16(const uint8_t *w, int64_t i) {
    const uint16_t *h = (const uint16_t *)w + i;
#if defined(__AVX512F__)
    return (braze_vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)), 16));
#elif defined(__AVX2__)
    return (braze_vf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16));
#else
    braze_vf r;
    for (int l = 0; l < BRAZE_VL; l++) r[l] = braze_bf2f(h[l]);
    return r;
#endif
}

/* ---- activations: x row -> int8 blocks of 32 (scale dx), float sums per 16 -------- */

/* the scale of a block of 32 x values rounded to integers in [-top, top]; its inverse */
static inline float braze_block_scale(const float *xb, float top, float *inv) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) { float a = fabsf(xb[i]); amax = a > amax ? a : amax; }
    float dd = amax / top;
    *inv = dd != 0.0f ? 1.0f / dd : 0.0f;
    return dd;
}

/* x row -> int8 blocks of 32. With lo (the int8x2 dot), x is rounded to 1/16256 of its
 * block's max instead of 1/127 and split as 128 hi + lo, hi in [-127, 127], lo in
 * [-64, 63]: two int8 dots give the precision of a 15-bit one. */
static inline void braze_quantize_row(const float *x, int64_t k, int8_t *q, int8_t *lo, float *d) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    /* the same numbers 16 at a time (the scalar loop was a tenth of an 8-row matmul):
     * max ignores nan as the scalar compare does, and the conversion rounds to nearest
     * even as lrintf does in the default rounding mode */
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + 32 * b;
        __m512 v[2] = {_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)};
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, v[0]), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_andnot_ps(sign, v[1]), m);
        float dd = _mm512_reduce_max_ps(m) / (lo ? 16256.0f : 127.0f), id = dd != 0.0f ? 1.0f / dd : 0.0f;
        d[b] = dd;
        for (int h = 0; h < 2; h++) {
            __m512i t = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], _mm512_set1_ps(id)));
            if (lo) {
                __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(t, _mm512_set1_epi32(64)), 7);
                _mm_storeu_si128((__m128i *)(q + 32 * b + 16 * h), _mm512_cvtepi32_epi8(hi));
                _mm_storeu_si128((__m128i *)(lo + 32 * b + 16 * h),
                                 _mm512_cvtepi32_epi8(_mm512_sub_epi32(t, _mm512_slli_epi32(hi, 7))));
            } else
                _mm_storeu_si128((__m128i *)(q + 32 * b + 16 * h), _mm512_cvtepi32_epi8(t));
        }
    }
    return;
#endif
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + 32 * b;
        float id;
        d[b] = braze_block_scale(xb, lo ? 16256.0f : 127.0f, &id);
        for (int i = 0; i < 32; i++) {
            int32_t v = (int32_t)lrintf(xb[i] * id);
            if (lo) {
                int32_t h = (v + 64) >> 7;  /* arithmetic shift: v / 128 rounded */
                q[32 * b + i] = (int8_t)h;
                lo[32 * b + i] = (int8_t)(v - 128 * h);
            } else
                q[32 * b + i] = (int8_t)v;
        }
    }
}

/* One block of W (unpacked: q, per-chunk s and o) dotted with one x row's block at
 * b0 (BS elements): the integer dots scaled into acc (8 lanes), the offsets into off. */
#ifdef BRAZE_VNNI
typedef __m256 braze_qacc;
#define BRAZE_QACC_ZERO _mm256_setzero_ps()
static inline float braze_qacc_sum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#else
typedef float braze_qacc;
#define BRAZE_QACC_ZERO 0.0f
static inline float braze_qacc_sum(float a) { return a; }
#endif

/* A block's offsets times its chunks' sums of x (xs): the w = s q + o part that is not a
 * dot. Eight chunks at a time into a vector (the K types' 8 or 16 chunks a block: one
 * scalar chain of 16 fused multiply-adds was a third of Q6_K's time), else scalar. */
static inline __attribute__((always_inline)) void braze_offsets(const int nch, const float *o, const float *xs,
                                                                braze_v8 *offv, float *off) {
    if (nch % 8 == 0)
        for (int c = 0; c < nch; c += 8) *offv += braze_v8_load(o + c) * braze_v8_load(xs + c);
    else
        for (int c = 0; c < nch; c++) *off += o[c] * xs[c];
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define BRAZE_DPBUSD _mm256_dpbusd_epi32
#else
#define BRAZE_DPBUSD _mm256_dpbusd_avx_epi32
#endif
/* xl: the low parts of x (int8x2) or NULL (int8), a constant where inlined */
static inline __attribute__((always_inline)) void braze_qblock(const int BS, const int CH,
        const uint8_t *restrict q, const float *restrict s, const int8_t *restrict xq, const int8_t *restrict xl,
        const float *restrict dx, braze_qacc *acc) {
#ifdef BRAZE_VNNI
    for (int u = 0; u < BS / 32; u++) {
        __m256i qv = _mm256_loadu_si256((const __m256i *)(q + 32 * u));
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * u));
        __m256i p = BRAZE_DPBUSD(_mm256_setzero_si256(), qv, xv);
        /* the lo dot in a chain of its own, joined once (the same integers): through the
         * shift it waited on the hi dot's latency */
        if (xl) p = _mm256_add_epi32(_mm256_slli_epi32(p, 7), BRAZE_DPBUSD(_mm256_setzero_si256(), qv,
                                     _mm256_loadu_si256((const __m256i *)(xl + 32 * u))));
        __m256 sv = CH == 32 ? _mm256_set1_ps(s[u] * dx[u])
                             : _mm256_set_m128(_mm_set1_ps(s[2 * u + 1] * dx[u]), _mm_set1_ps(s[2 * u] * dx[u]));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sv, *acc);
    }
#else
    for (int c = 0; c < BS / 16; c++) {
        int32_t t = 0;
        for (int i = 0; i < 16; i++)
            t += (int32_t)q[16 * c + i] * (xl ? 128 * (int32_t)xq[16 * c + i] + xl[16 * c + i] : (int32_t)xq[16 * c + i]);
        *acc += s[c * 16 / CH] * dx[c / 2] * (float)t;
    }
#endif
}

/* The same block dotted with float x (dequantized in registers): per chunk, the
 * products of q (converted to float) and x summed in vector lanes, then scaled once. */
/* BRAZE_VL bytes as floats (gcc scalarises __builtin_convertvector from bytes here) */
static inline braze_vf braze_u8_to_vf(const uint8_t *p) {
#if defined(__AVX512F__)
    return (braze_vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (braze_vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    braze_vf r;
    for (int i = 0; i < BRAZE_VL; i++) r[i] = (float)p[i];
    return r;
#endif
}
static inline __attribute__((always_inline)) void braze_fblock(const int BS, const int CH,
        const uint8_t *restrict q, const float *restrict s, const float *restrict x, braze_vf *acc) {
    for (int c = 0; c < BS / CH; c++) {
        braze_vf t = {0};
        for (int u = 0; u < CH / BRAZE_VL; u++) {
            t += braze_u8_to_vf(q + c * CH + u * BRAZE_VL) * braze_vf_load(x + c * CH + u * BRAZE_VL);
        }
        *acc += s[c] * t;
    }
}

/* sums of x per chunk of CH elements (the offsets' other factor), step floats apart */
static inline void braze_chunk_sums(const float *x, int64_t k, int CH, float *xs, int64_t step) {
    for (int64_t c = 0; c < k / CH; c++) {
        float a = 0.0f;
        for (int i = 0; i < CH; i++) a += x[CH * c + i];
        xs[c * step] = a;
    }
}

/* x row -> int16 in blocks of 32 (scale dx = max|x| / 32767: a 256th of int8's
 * rounding, so the dot is as close to float32's as float32's own summation order) */
static inline void braze_quantize_row16(const float *x, int64_t k, int16_t *q, float *d) {
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + 32 * b;
        float id;
        d[b] = braze_block_scale(xb, 32767.0f, &id);
        for (int i = 0; i < 32; i++) q[32 * b + i] = (int16_t)lrintf(xb[i] * id);
    }
}

/* One block of W against int16 x: q (zero-extended) times x in 16-bit pairs (vpmaddwd),
 * 32 products per instruction with AVX-512BW, then scaled once per chunk. */
static inline __attribute__((always_inline)) void braze_wblock(const int BS, const int CH,
        const uint8_t *restrict q, const float *restrict s, const int16_t *restrict xq, const float *restrict dx,
        braze_vf *acc) {
#if defined(__AVX512BW__)
    for (int u = 0; u < BS / 32; u++) {
        __m512i p = _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * u))),
                                      _mm512_loadu_si512((const void *)(xq + 32 * u)));
        __m512 sv = CH == 32 ? _mm512_set1_ps(s[u] * dx[u])
                             : _mm512_insertf32x8(_mm512_set1_ps(s[2 * u] * dx[u]), _mm256_set1_ps(s[2 * u + 1] * dx[u]), 1);
        *acc = (braze_vf)_mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, (__m512)*acc);
    }
#elif defined(__AVX2__)
    for (int h = 0; h < BS / 16; h++) {  /* 16 elements: 8 lanes of pairs, one chunk of 16 */
        __m256i p = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * h))),
                                      _mm256_loadu_si256((const __m256i *)(xq + 16 * h)));
        __m256 sv = _mm256_set1_ps(s[h * 16 / CH] * dx[h / 2]);
        *acc = (braze_vf)_mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sv, (__m256)*acc);
    }
#else
    for (int c = 0; c < BS / 16; c++) {
        int32_t t = 0;
        for (int i = 0; i < 16; i++) t += (int32_t)q[16 * c + i] * (int32_t)xq[16 * c + i];
        (*acc)[0] += s[c * 16 / CH] * dx[c / 2] * (float)t;
    }
#endif
}

/* Rows of W (n0..n1) dequantized to float into the k x nt tile braze_mm reads. */
typedef void (*braze_rowf_fn)(const uint8_t *w, int64_t k, float *out);

#define BRAZE_QNT BRAZE_NB       /* columns of y per GEMM tile: one 6-row block's width */
#define BRAZE_QKC 256            /* k per step of the GEMM: the tile's slice stays in L1 */
#define BRAZE_QFEW 8             /* up to this many x rows: the integer matrix-vector path */
#define BRAZE_QPAR_MIN (1 << 16) /* weights bytes below which one thread does it all */
#define BRAZE_QMAXW 4            /* weights one kernel takes against the same x */
#define BRAZE_QEPN 64            /* columns per epilogue call at few rows (see braze_qep_cols) */

/* What a kernel does with its sums, rendered per kernel by codegen/c.py (the plain
 * store into y, or fused element-wise work: a bias, a residual, silu(gate) * up): the
 * block of rows r0..r0+nr and columns j0..j0+nj, where acc[i] holds weight i's sums
 * from (r0, j0) on, rows ldc apart. An indirect call, so it is made once per block of
 * columns, never per element. */
typedef void (*braze_qep_fn)(void **args, int64_t r0, int64_t nr, int64_t j0, int64_t nj, float *const *acc,
                             int64_t ldc);
/* Columns per epilogue call at few rows: BRAZE_QEPN (a call costs ~10 ns: one per 4 columns
 * made decoding's matmuls 9% slower), 16 where blocks that wide would leave each thread
 * fewer than 8 to balance. */
static inline int64_t braze_qep_cols(int64_t n, int64_t threads) {
    return n >= 8 * BRAZE_QEPN * threads ? BRAZE_QEPN : 16;
}

/* The GEMM path, shared by every type: NT rows of W, already dequantized to float
 * (rows, nt x k), transposed slice by slice of k into wt (the k x NT tile braze_mm
 * reads), then y[:, n0:n0+nt] (+)= x[:, slice] @ wt. */
static inline void braze_q_gemm_tile(int64_t m, int64_t n0, int64_t nt, int64_t k, const float *x, int64_t lda,
                                     float *y, int64_t ldy, const float *rows, float *wt) {
    for (int64_t kc = 0; kc < k; kc += BRAZE_QKC) {
        int64_t kk = k - kc < BRAZE_QKC ? k - kc : BRAZE_QKC;
        for (int64_t j = 0; j < nt; j++)
            for (int64_t i = 0; i < kk; i++) wt[i * BRAZE_QNT + j] = rows[j * k + kc + i];
        braze_mm(m, nt, kk, x + kc, lda, wt, BRAZE_QNT, y + n0, ldy, kc > 0);
    }
}

/* Thread-private scratch, grown as needed and kept (a decoding step allocates nothing
 * after the first). */
static inline void *braze_q_scratch(int slot, size_t bytes) {
    static _Thread_local void *buf[7];
    static _Thread_local size_t have[7];
    if (have[slot] < bytes) {
        free(buf[slot]);
        buf[slot] = aligned_alloc(64, (bytes + 63) / 64 * 64);
        have[slot] = buf[slot] ? bytes : 0;
    }
    return buf[slot];
}

/* A kernel's prologue, rendered per kernel by codegen/c.py where the group that computed
 * x (an RMSNorm) became part of the matmul: row r of x computed into `row` (k floats)
 * from the group's own inputs, so x is never stored and read back. */
typedef void (*braze_qpro_fn)(void **args, int64_t r, float *row);
/* x's m rows by the prologue, into thread scratch (rows k apart), once per call: the
 * quantizing (or, for float weights, every column block) then reads them as it read x. */
static inline const float *braze_qprologue(int64_t m, int64_t k, braze_qpro_fn pro, void **args) {
    float *rows = (float *)braze_q_scratch(5, (size_t)m * k * 4);
    for (int64_t r = 0; r < m; r++) pro(args, r, rows + r * k);
    return rows;
}

/* The GEMM path for every type: `rowf` dequantizes one W row to float. Each weight's
 * m x nt tile of sums goes to a scratch tile, which the epilogue then reads. */
static void braze_qlinear_gemm(int64_t m, int64_t n, int64_t k, const float *x, int64_t lda,
                               const uint8_t *const *w, int nw, int64_t ldw, braze_qep_fn ep, void **args,
                               int64_t nthreads, braze_rowf_fn rowf) {
    int64_t tiles = (n + BRAZE_QNT - 1) / BRAZE_QNT;
    int par = nthreads > 1 && (double)m * n * k * nw > 4e6;
    #pragma omp parallel num_threads(par ? nthreads : 1)
    {
        float *rows = (float *)braze_q_scratch(2, (size_t)BRAZE_QNT * k * 4);
        float *wt = (float *)braze_q_scratch(3, (size_t)BRAZE_QKC * BRAZE_QNT * 4);
        float *c = (float *)braze_q_scratch(4, (size_t)nw * m * BRAZE_QNT * 4);
        float *acc[BRAZE_QMAXW];
        for (int i = 0; i < nw; i++) acc[i] = c + i * m * BRAZE_QNT;
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            int64_t n0 = t * BRAZE_QNT, nt = n - n0 < BRAZE_QNT ? n - n0 : BRAZE_QNT;
            for (int i = 0; i < nw; i++) {
                for (int64_t j = 0; j < nt; j++) rowf(w[i] + (n0 + j) * ldw, k, rows + j * k);
                braze_q_gemm_tile(m, 0, nt, k, x, lda, acc[i], BRAZE_QNT, rows, wt);
            }
            ep(args, 0, m, n0, nt, acc, BRAZE_QNT);
        }
    }
}

/* Embedding rows at token ids, dequantized; an id outside the table gives nan (the
 * recording and the reference executor check ids; this never reads outside). */
static void braze_qrows(int64_t n, const void *ids, int ids64, const uint8_t *w, int64_t ldw, int64_t rows,
                        int64_t k, float *out, braze_rowf_fn rowf) {
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
        if (id < 0 || id >= rows) { for (int64_t j = 0; j < k; j++) out[i * k + j] = NAN; continue; }
        rowf(w + id * ldw, k, out + i * k);
    }
}

/* ---- few rows, int8x2 (mode 3): W read once for every x row -------------------------
 * braze_mv unpacks a block for each x row it dots: at 8 rows, 8 unpacks of every block
 * and a 256-bit dot per block cost ~5 ms per row of SmolLM2's 60 gate/up matmuls. Here
 * a strip of R rows of W is read once for all x rows: unpacked into thread scratch (q,
 * s, o; L1-sized; `unpack` types) or, with 512-bit VNNI, read from the blocks in the dot
 * loop (`direct` types). The integer dots and the per-block scales s * dx are the ones
 * braze_qblock takes; only the float order of the blocks' sums differs. Rows of q, xq
 * and dx are padded with zeros to a whole step. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* 512-bit VNNI: x rows in the lanes (braze_qx_tile below), not W's blocks */
#define BRAZE_QX 1
#define BRAZE_QS 32
#elif defined(BRAZE_VNNI)
#define BRAZE_QS 32
typedef __m256 braze_qsv;
typedef __m256i braze_qsi;
static inline braze_qsi braze_qs_ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline braze_qsv braze_qs_dot(braze_qsi q, braze_qsi xh, braze_qsi xl) {
    __m256i p = BRAZE_DPBUSD(_mm256_setzero_si256(), q, xh);
    return _mm256_cvtepi32_ps(BRAZE_DPBUSD(_mm256_slli_epi32(p, 7), q, xl));
}
static inline braze_qsv braze_qs_scale(const float *s, const int CH) {
    return CH == 16 ? _mm256_set_m128(_mm_broadcast_ss(s + 1), _mm_broadcast_ss(s)) : _mm256_broadcast_ss(s);
}
static inline braze_qsv braze_qs_fma(braze_qsv a, braze_qsv b, braze_qsv c) { return _mm256_fmadd_ps(a, b, c); }
static inline float braze_qs_sum(braze_qsv a) { return braze_qacc_sum(a); }
#else
/* plain C: the two chunks of 16 of a block of 32, as braze_qblock's loop takes them */
#define BRAZE_QS 32
typedef float braze_qsv __attribute__((vector_size(8)));
typedef const void *braze_qsi;
static inline braze_qsi braze_qs_ld(const void *p) { return p; }
static inline braze_qsv braze_qs_dot(braze_qsi q, braze_qsi xh, braze_qsi xl) {
    braze_qsv r;
    for (int c = 0; c < 2; c++) {
        int32_t t = 0;
        for (int i = 16 * c; i < 16 * c + 16; i++)
            t += (int32_t)((const uint8_t *)q)[i] * (128 * (int32_t)((const int8_t *)xh)[i] + ((const int8_t *)xl)[i]);
        r[c] = (float)t;
    }
    return r;
}
static inline braze_qsv braze_qs_scale(const float *s, const int CH) { return (braze_qsv){s[0], s[CH == 16]}; }
static inline braze_qsv braze_qs_fma(braze_qsv a, braze_qsv b, braze_qsv c) { return a * b + c; }
static inline float braze_qs_sum(braze_qsv a) { return a[0] + a[1]; }
#endif
#define BRAZE_QSTRIP_R 4  /* rows of W per strip */
#define BRAZE_QSTRIP_M 4  /* x rows per pass over a strip: R x M sums and R rows of q in registers */
static inline int64_t braze_qs_pad(int64_t k) { return (k + BRAZE_QS - 1) / BRAZE_QS * BRAZE_QS; }

#ifdef BRAZE_QX
/* x rows in the lanes: the m x rows (padded to RPG = 2, 4, 8 or 16) share each 512-bit
 * register, P = 16 / RPG int32 lanes (4P bytes) per row, and W's 4P bytes at the same
 * place are broadcast to every row's lanes (a load, no shuffle), so one vpdpbusd dots a
 * W row with all x rows and the per-block float work (convert, scale, add) serves them
 * all. W rows in the lanes (llama.cpp's repacked layout) would need W transposed; x is
 * quantized once per call anyway, so it is x that braze_qs_prepare lays out: per block
 * of 32, NR = 8 / P registers of hi bytes then NR of lo bytes (register j: row i's bytes
 * 4P j .. 4P j + 4P at 4P i), and 16 floats of dx (lane l: row l / P's). With W's blocks
 * in the lanes (this kernel's predecessor) every W row x x row pair took its own
 * convert-scale-add per block: at 8 rows, 16 instructions per block and W row where
 * this takes 12 (at 16 rows 40 against 20). */
static inline int braze_qx_p(int64_t m) { return m <= 2 ? 8 : m <= 4 ? 4 : m <= 8 ? 2 : 1; }
static inline void braze_qs_prepare(int64_t m, int64_t kp, const char **xq, const float **dx) {
    const int64_t nb = kp / 32;
    const int P = braze_qx_p(m), rpg = 16 / P;
    int8_t *xg = (int8_t *)braze_q_scratch(6, (size_t)nb * (1024 + 64));
    float *dv = (float *)(xg + nb * 1024);
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < rpg; i++) {
            const int8_t *src = (const int8_t *)*xq + i * 2 * kp + 32 * b;
            for (int h = 0; h < 2; h++)      /* hi, lo */
                for (int j = 0; j < 8 / P; j++) {
                    int8_t *dst = xg + b * (1024 / P) + (h * (8 / P) + j) * 64 + 4 * P * i;
                    if (i < m) memcpy(dst, src + h * kp + 4 * P * j, (size_t)(4 * P));
                    else memset(dst, 0, (size_t)(4 * P));
                }
            for (int l = 0; l < P; l++) dv[b * 16 + P * i + l] = i < m ? (*dx)[i * nb + b] : 0.0f;
        }
    *xq = (const char *)xg;
    *dx = dv;
}
/* W's 4P bytes at p in every row's lanes */
static inline __attribute__((always_inline)) __m512i braze_qx_bcast(const uint8_t *p, const int P) {
    if (P == 8) return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    if (P == 4) return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    int64_t v8; int32_t v4;
    if (P == 2) { memcpy(&v8, p, 8); return _mm512_set1_epi64(v8); }
    memcpy(&v4, p, 4);
    return _mm512_set1_epi32(v4);
}
/* A block's 32 values in the registers the tile dots (register j: values 4P j .. 4P j +
 * 4P - 1 in every row's lanes), read as KIND says: 0 unpacked bytes (the strip's scratch);
 * straight from W's blocks, with no unpacking pass, 1 nibbles (low ones values 0..15,
 * high ones 16..31: Q4_0, Q4_1) and 2 int8 (Q8_0: + 128). */
static inline __attribute__((always_inline)) void braze_qx_w(const int KIND, const int P, const uint8_t *qb, __m512i *wv) {
    const int NR = 8 / P;
    if (KIND == 0 || KIND == 2)
        for (int j = 0; j < NR; j++) {
            wv[j] = braze_qx_bcast(qb + 4 * P * j, P);
            if (KIND == 2) wv[j] = _mm512_xor_si512(wv[j], _mm512_set1_epi8((char)0x80));
        }
    else if (P == 8) {  /* 16 bytes in each 128-bit lane: low nibbles in lanes 0, 2, high in 1, 3 */
        __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qb));
        wv[0] = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4), _mm512_set1_epi8(15));
    } else
        for (int j = 0; j < NR / 2; j++) {
            __m512i v = braze_qx_bcast(qb + 4 * P * j, P);
            wv[j] = _mm512_and_si512(v, _mm512_set1_epi8(15));
            wv[j + NR / 2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
        }
}
/* R rows of W (ldq bytes apart, blocks of 32 bstep apart, read as KIND says; scales s
 * kp / CH apart) against the x rows as braze_qs_prepare lays them out for this P:
 * out[x * BRAZE_QEPN + r], x < m */
static inline __attribute__((always_inline)) void braze_qx_tile(const int R, const int P, const int CH, const int KIND,
        int64_t m, int64_t kp, const uint8_t *restrict q, int64_t ldq, int64_t bstep, const float *restrict s,
        const int8_t *restrict xg, const float *restrict dv, float *restrict out) {
    const int NR = 8 / P;  /* registers of a block's 32 bytes */
    const int64_t nb = kp / 32;
    __m512 acc[BRAZE_QSTRIP_R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *xb = xg + b * (1024 / P);
        const __m512 D = _mm512_loadu_ps(dv + b * 16);
        for (int r = 0; r < R; r++) {
            const uint8_t *qr = q + r * ldq + b * bstep;
            const float *sr = s + r * (kp / CH) + b * (32 / CH);
            if (KIND) __builtin_prefetch(qr + 8 * R * ldq, 0, 2);  /* as the unpacking does */
            __m512i wv[8];
            braze_qx_w(KIND, P, qr, wv);
            /* CH 32: one integer sum and one scale a block; CH 16: one per chunk of 16, or
             * with P 8 (a row's 32 bytes in one register) one sum, a scale per half-row */
            if (CH == 16 && P == 8) {
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_loadu_si512((const void *)xb));
                p = _mm512_dpbusd_epi32(_mm512_slli_epi32(p, 7), wv[0], _mm512_loadu_si512((const void *)(xb + 64)));
                const __m512 sv = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(sr[0]), _mm512_set1_ps(sr[1]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), D * sv, acc[r]);
            } else
                for (int c = 0; c < 32 / CH; c++) {
                    const int j0 = c * (CH / (4 * P)), j1 = j0 + CH / (4 * P);
                    /* hi and lo bytes in two chains, joined once: one chain through the shift
                     * waited on vpdpbusd's latency (8 rows: 10-15% of the matmul) */
                    __m512i ph = _mm512_setzero_si512(), pl = _mm512_setzero_si512();
                    for (int j = j0; j < j1; j++) {
                        ph = _mm512_dpbusd_epi32(ph, wv[j], _mm512_loadu_si512((const void *)(xb + 64 * j)));
                        pl = _mm512_dpbusd_epi32(pl, wv[j], _mm512_loadu_si512((const void *)(xb + 64 * (NR + j))));
                    }
                    __m512i p = _mm512_add_epi32(_mm512_slli_epi32(ph, 7), pl);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), D * _mm512_set1_ps(sr[c]), acc[r]);
                }
        }
    }
    for (int r = 0; r < R; r++) {  /* lanes P i .. P i + P - 1 -> x row i */
        __m512 t = acc[r];
        if (P >= 2) t += _mm512_permute_ps(t, 0xB1);
        if (P >= 4) t += _mm512_permute_ps(t, 0x4E);
        if (P == 8) t += _mm512_shuffle_f32x4(t, t, 0xB1);
        float v[16];
        _mm512_storeu_ps(v, t);
        for (int64_t i = 0; i < m; i++) out[i * BRAZE_QEPN + r] = v[P * i];
    }
}
/* out[x * BRAZE_QEPN + r] = R rows of q against the m x rows, without the offsets */
static inline __attribute__((always_inline)) void braze_qs_dots(const int R, const int CH, const int KIND, int64_t m,
        int64_t kp, const uint8_t *restrict q, int64_t ldq, int64_t bstep, const float *restrict s, const char *xq,
        const float *dx, float *restrict out) {
    const int8_t *xg = (const int8_t *)xq;
    switch (braze_qx_p(m)) {  /* P a literal: the loops over registers unroll */
    case 8: braze_qx_tile(R, 8, CH, KIND, m, kp, q, ldq, bstep, s, xg, dx, out); break;
    case 4: braze_qx_tile(R, 4, CH, KIND, m, kp, q, ldq, bstep, s, xg, dx, out); break;
    case 2: braze_qx_tile(R, 2, CH, KIND, m, kp, q, ldq, bstep, s, xg, dx, out); break;
    default: braze_qx_tile(R, 1, CH, KIND, m, kp, q, ldq, bstep, s, xg, dx, out);
    }
}
/* The two float16 words at the start of each of a row's n blocks (TS bytes apart) as
 * floats, 16 blocks a gather (a scalar conversion per block was a sixth of the time) */
static inline void braze_qx_f16pairs(const uint8_t *w, const int TS, int64_t n, float *lo, float *hi) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(TS));
    int64_t b = 0;
    for (; b + 16 <= n; b += 16) {
        __m512i v = _mm512_i32gather_epi32(idx, (const void *)(w + b * TS), 1);
        _mm512_storeu_ps(lo + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
        _mm512_storeu_ps(hi + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
    }
    for (; b < n; b++) { lo[b] = braze_q_f16(w + b * TS); hi[b] = braze_q_f16(w + b * TS + 2); }
}
/* W's scales s and offsets o per block of a row of the types read straight from their
 * blocks, and where their values start in a block (braze_qx_w's KIND says how they are
 * read); the second word is Q4_1's min, and the first bytes of the others' values */
static inline void braze_qx_scaled(int64_t n, const float *s, float bias, float *o) {
    for (int64_t b = 0; b < n; b++) o[b] = bias * s[b];
}
static inline void braze_qxs_q4_0(const uint8_t *w, int64_t n, float *s, float *o) {
    braze_qx_f16pairs(w, 18, n, s, o); braze_qx_scaled(n, s, -8.0f, o);
}
static inline void braze_qxs_q4_1(const uint8_t *w, int64_t n, float *s, float *o) { braze_qx_f16pairs(w, 20, n, s, o); }
static inline void braze_qxs_q8_0(const uint8_t *w, int64_t n, float *s, float *o) {
    braze_qx_f16pairs(w, 34, n, s, o); braze_qx_scaled(n, s, -128.0f, o);
}
enum { braze_qxk_q4_0 = 1, braze_qxk_q4_1 = 1, braze_qxk_q8_0 = 2, braze_qxo_q4_0 = 2, braze_qxo_q4_1 = 4, braze_qxo_q8_0 = 2 };
/* The strip of a type read straight from its blocks (BS = CH = 32): only the scales
 * and offsets are taken out first, into thread scratch. */
#define BRAZE_QSTRIPS_direct(T, BS, TS, CH)                                                                   \
static inline __attribute__((always_inline)) void braze_qstrip_##T(const int R, int64_t m, int64_t k,        \
        const uint8_t *w, int64_t ldw, const char *xq, const float *dx, const float *xs, float *out) {        \
    const int64_t nch = k / 32;                                                                              \
    float *s = (float *)braze_q_scratch(1, (size_t)BRAZE_QSTRIP_R * nch * 8), *o = s + BRAZE_QSTRIP_R * nch; \
    for (int r = 0; r < R; r++) braze_qxs_##T(w + r * ldw, nch, s + r * nch, o + r * nch);                     \
    braze_qs_dots(R, 32, braze_qxk_##T, m, k, w + braze_qxo_##T, ldw, TS, s, xq, dx, out);                   \
    braze_qs_offsets(R, m, nch, o, xs, out);                                                                 \
}
#else
static inline void braze_qs_prepare(int64_t m, int64_t kp, const char **xq, const float **dx) {
    (void)m; (void)kp; (void)xq; (void)dx;  /* the tiles read x rows as braze_qlinear lays them out */
}
/* R rows of q (kp bytes apart, scales s kp / CH apart) against MT x rows (hi then lo
 * bytes, 2 kp apart; dx kp / 32 apart): dot[x * R + r], without the offsets */
static inline __attribute__((always_inline)) void braze_qs_tile(const int R, const int MT, const int CH,
        int64_t kp, const uint8_t *restrict q, const float *restrict s, const int8_t *restrict xq,
        const float *restrict dx, float *restrict dot) {
    braze_qsv acc[BRAZE_QSTRIP_M][BRAZE_QSTRIP_R];
    for (int x = 0; x < MT; x++)
        for (int r = 0; r < R; r++) acc[x][r] = (braze_qsv){0};
    for (int64_t e = 0; e < kp; e += BRAZE_QS) {
        braze_qsi qv[BRAZE_QSTRIP_R];
        braze_qsv sv[BRAZE_QSTRIP_R];
        for (int r = 0; r < R; r++) {
            qv[r] = braze_qs_ld(q + r * kp + e);
            sv[r] = braze_qs_scale(s + r * (kp / CH) + e / CH, CH);
        }
        for (int x = 0; x < MT; x++) {
            const int8_t *xr = xq + 2 * x * kp + e;
            braze_qsi xh = braze_qs_ld(xr), xl = braze_qs_ld(xr + kp);
            braze_qsv dv = braze_qs_scale(dx + x * (kp / 32) + e / 32, 32);
            for (int r = 0; r < R; r++) acc[x][r] = braze_qs_fma(braze_qs_dot(qv[r], xh, xl), sv[r] * dv, acc[x][r]);
        }
    }
    for (int x = 0; x < MT; x++)
        for (int r = 0; r < R; r++) dot[x * R + r] = braze_qs_sum(acc[x][r]);
}
/* out[x * BRAZE_QEPN + r] = R rows of q against the m x rows, MT at a time, without the offsets */
static inline __attribute__((always_inline)) void braze_qs_dots(const int R, const int CH, const int KIND, int64_t m,
        int64_t kp, const uint8_t *restrict q, int64_t ldq, int64_t bstep, const float *restrict s, const char *xq,
        const float *dx, float *restrict out) {
    (void)KIND; (void)ldq; (void)bstep;  /* the strip's unpacked q only: rows kp apart */
    float dot[BRAZE_QSTRIP_M * BRAZE_QSTRIP_R];
    for (int64_t x0 = 0; x0 < m; x0 += BRAZE_QSTRIP_M) {
        const int64_t mt = m - x0 < BRAZE_QSTRIP_M ? m - x0 : BRAZE_QSTRIP_M;
        const int8_t *xr = (const int8_t *)xq + x0 * 2 * kp;
        const float *dr = dx + x0 * (kp / 32);
        /* MT a literal: the sums stay in registers */
        if (mt == 4) braze_qs_tile(R, 4, CH, kp, q, s, xr, dr, dot);
        else if (mt == 3) braze_qs_tile(R, 3, CH, kp, q, s, xr, dr, dot);
        else if (mt == 2) braze_qs_tile(R, 2, CH, kp, q, s, xr, dr, dot);
        else braze_qs_tile(R, 1, CH, kp, q, s, xr, dr, dot);
        for (int64_t x = 0; x < mt; x++)
            for (int r = 0; r < R; r++) out[(x0 + x) * BRAZE_QEPN + r] = dot[x * R + r];
    }
}
#define BRAZE_QSTRIPS_direct BRAZE_QSTRIPS_unpack  /* no 512-bit VNNI: every type unpacks */
#endif

/* ---- one x row, int8x2 (mode 3), the types of blocks of 32 ---------------------------
 * braze_mv unpacks each block of R rows of W into scratch and dots it from there. Q4_0,
 * Q4_1, Q5_0 and Q8_0 (32 values under one scale) unpack it in registers instead
 * (braze_qr_##T), their scale and offset as braze_unpack_##T has them (Q4_1's two
 * float16 words in one conversion: one at a time it was 7-9% slower than the scratch):
 * the same integers, products and sums, bit for bit, 5-13% faster at one row on the AMD
 * EPYC; Q5_1 measured the same and keeps braze_mv's (bench/RESULTS.md, eleventh
 * session). BRAZE_MV1_##T says which. */
#if defined(BRAZE_VNNI) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* braze_nibbles32's values in a register: spelled in intrinsics, as its shufflevector
 * compiled here they were 3-5% slower (Q4_0, Q4_1 at one row) */
static inline __m256i braze_qr_nibbles(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p), f = _mm_set1_epi8(15);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, f)), _mm_and_si128(_mm_srli_epi16(v, 4), f), 1);
}
static inline __m256i braze_qr_q4_0(const uint8_t *b, float *s, float *o) {
    *s = braze_q_f16(b); *o = -8.0f * *s; return braze_qr_nibbles(b + 2);
}
static inline void braze_qr_f16x2(const uint8_t *b, float *s, float *o) {  /* two float16 words, one conversion */
    uint32_t u;
    memcpy(&u, b, 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
    *s = _mm_cvtss_f32(f); *o = _mm_cvtss_f32(_mm_movehdup_ps(f));
}
static inline __m256i braze_qr_q4_1(const uint8_t *b, float *s, float *o) {
    braze_qr_f16x2(b, s, o); return braze_qr_nibbles(b + 4);
}
static inline __m256i braze_qr_q5_0(const uint8_t *b, float *s, float *o) {
    *s = braze_q_f16(b); *o = -16.0f * *s; return _mm256_or_si256(braze_qr_nibbles(b + 6), (__m256i)braze_bits32(b + 2));
}
static inline __m256i braze_qr_q8_0(const uint8_t *b, float *s, float *o) {
    *s = braze_q_f16(b); *o = -128.0f * *s;
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
}
#define BRAZE_MV1_REGS(T, TS)                                                                                 \
static inline __attribute__((always_inline)) int braze_mv1_##T(const int R, int64_t k, const uint8_t *w,     \
        int64_t ldw, const void *x, const float *dx, const float *xs, float *y) {                            \
    const int8_t *xh = (const int8_t *)x, *xl = xh + braze_qs_pad(k);                                        \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};    \
    float off[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                                 \
    for (int64_t b = 0; b < k / 32; b++) {                                                                   \
        for (int r = 0; r < R; r++)  /* as braze_mv: 8R rows ahead into L2 */                                \
            for (int l = 0; l < TS; l += 64) __builtin_prefetch(w + (r + 8 * R) * ldw + b * TS + l, 0, 2);  \
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xh + 32 * b));                               \
        const __m256i xw = _mm256_loadu_si256((const __m256i *)(xl + 32 * b));                               \
        for (int r = 0; r < R; r++) {                                                                        \
            float s, o;                                                                                      \
            const __m256i qv = braze_qr_##T(w + r * ldw + b * TS, &s, &o);                                   \
            off[r] += o * xs[b];                                                                             \
            __m256i p = BRAZE_DPBUSD(_mm256_setzero_si256(), qv, xv);                                        \
            p = _mm256_add_epi32(_mm256_slli_epi32(p, 7), BRAZE_DPBUSD(_mm256_setzero_si256(), qv, xw));     \
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s * dx[b]), acc[r]);              \
        }                                                                                                    \
    }                                                                                                        \
    for (int r = 0; r < R; r++) y[r] = braze_qacc_sum(acc[r]) + off[r];                                      \
    return 1;                                                                                                \
}
#else
#define BRAZE_MV1_REGS BRAZE_MV1_NONE
#endif
/* the other types (and without AVX-512): none, braze_mv unpacks */
#define BRAZE_MV1_NONE(T, TS)                                                                                 \
static inline int braze_mv1_##T(const int R, int64_t k, const uint8_t *w, int64_t ldw, const void *x,         \
        const float *dx, const float *xs, float *y) {                                                        \
    (void)R; (void)k; (void)w; (void)ldw; (void)x; (void)dx; (void)xs; (void)y;                             \
    return 0;                                                                                                \
}
#define BRAZE_MV1_q4_0 BRAZE_MV1_REGS
#define BRAZE_MV1_q4_1 BRAZE_MV1_REGS
#define BRAZE_MV1_q5_0 BRAZE_MV1_REGS
#define BRAZE_MV1_q5_1 BRAZE_MV1_NONE
#define BRAZE_MV1_q8_0 BRAZE_MV1_REGS
#define BRAZE_MV1_q2_k BRAZE_MV1_NONE
#define BRAZE_MV1_q3_k BRAZE_MV1_NONE
#define BRAZE_MV1_q4_k BRAZE_MV1_NONE
#define BRAZE_MV1_q5_k BRAZE_MV1_NONE
#define BRAZE_MV1_q6_k BRAZE_MV1_NONE
/* out[x * BRAZE_QEPN + r] += the offsets of R W rows (o, nch chunks each) for m x
 * rows: o times x's chunk sums, stored chunk-major (xs[c * BRAZE_QFEW + x]) so that a
 * chunk's sums are one vector, a lane per x row (a dot over chunks per pair of rows,
 * or a scalar loop over x rows, was a fifth to a quarter of the time). */
typedef float braze_qsx __attribute__((vector_size(4 * BRAZE_QFEW), aligned(4), may_alias));
static inline __attribute__((always_inline)) void braze_qs_offsets(const int R, int64_t m, int64_t nch,
        const float *restrict o, const float *restrict xs, float *restrict out) {
    braze_qsx off[BRAZE_QSTRIP_R];
    for (int r = 0; r < R; r++) off[r] = (braze_qsx){0};
    for (int64_t c = 0; c < nch; c++) {
        braze_qsx v = *(const braze_qsx *)(xs + c * BRAZE_QFEW);
        for (int r = 0; r < R; r++) off[r] += o[r * nch + c] * v;
    }
    for (int64_t x = 0; x < m; x++)
        for (int r = 0; r < R; r++) out[x * BRAZE_QEPN + r] += off[r][x];
}

/* Columns j0..j0+nj of NW weights for m x rows (xq, dx, xs as braze_qlinear lays them
 * out in mode 3), R rows of W per strip, into t[i][r * BRAZE_QEPN + j - j0]. */
/* Columns j0..j0+nj of NW weights for m x rows, BRAZE_QSTRIP_R rows of W per strip
 * (braze_qstrip_##T, as the type reads W), into t[i][r * BRAZE_QEPN + j - j0]. */
#define BRAZE_QSTRIPCOLS(T)                                                                                  \
static inline __attribute__((always_inline)) void braze_qstrips_##T(const int NW, int64_t m, int64_t j0,     \
        int64_t nj, int64_t k, const uint8_t *const *w, int64_t ldw, const float *x, int64_t lda,            \
        const char *xq, int64_t xsz, const float *dx, const float *xs, float (*t)[BRAZE_QFEW * BRAZE_QEPN]) { \
    (void)x; (void)lda; (void)xsz;                                                                           \
    for (int64_t j = j0; j < j0 + nj; j += BRAZE_QSTRIP_R)                                                   \
        for (int i = 0; i < NW; i++) {                                                                       \
            if (j + BRAZE_QSTRIP_R <= j0 + nj)                                                               \
                braze_qstrip_##T(BRAZE_QSTRIP_R, m, k, w[i] + j * ldw, ldw, xq, dx, xs, t[i] + (j - j0));     \
            else                                                                                             \
                for (int64_t jj = 0; j + jj < j0 + nj; jj++)                                                 \
                    braze_qstrip_##T(1, m, k, w[i] + (j + jj) * ldw, ldw, xq, dx, xs, t[i] + (j + jj - j0)); \
        }                                                                                                    \
}

#define BRAZE_QSTRIPS_unpack(T, BS, TS, CH)                                                                          \
static inline __attribute__((always_inline)) void braze_qstrip_##T(const int R, int64_t m, int64_t k,        \
        const uint8_t *w, int64_t ldw, const char *xq, const float *dx, const float *xs, float *out) {        \
    const int64_t kp = braze_qs_pad(k), nch = k / CH;                                                        \
    uint8_t *q = (uint8_t *)braze_q_scratch(1, (size_t)BRAZE_QSTRIP_R * (kp + 8 * (kp / 16 + 4)));            \
    float *s = (float *)(q + BRAZE_QSTRIP_R * kp), *o = s + BRAZE_QSTRIP_R * (kp / 16 + 4);                   \
    for (int r = 0; r < R; r++) {                                                                            \
        uint8_t *qr = q + r * kp; float *sr = s + r * (kp / CH);                                             \
        for (int64_t b = 0; b < k / BS; b++) {                                                               \
            /* 8R rows ahead into L2, as braze_mv does */                                                    \
            for (int l = 0; l < TS; l += 64) __builtin_prefetch(w + (r + 8 * R) * ldw + b * TS + l, 0, 2);   \
            braze_unpack_##T(w + r * ldw + b * TS, qr + b * BS, sr + b * (BS / CH), o + r * nch + b * (BS / CH)); \
        }                                                                                                    \
        if (kp > k) { memset(qr + k, 0, (size_t)(kp - k)); memset(sr + nch, 0, (size_t)(kp / CH - nch) * 4); } \
    }                                                                                                        \
    braze_qs_dots(R, CH, 0, m, kp, q, kp, 32, s, xq, dx, out);                                               \
    braze_qs_offsets(R, m, nch, o, xs, out);                                                                 \
}

/* The few-rows path of every type, over its braze_mv_##T (R rows of W against one x row:
 * x float when MODE is 0, else xq, quantized, with scales dx and chunk sums xs):
 * braze_mvcols_##T takes columns j0..j0+nj of NW weights (NW a literal where inlined),
 * four rows of W at a time, each against every x row, into t[i][r * BRAZE_QEPN + j - j0];
 * BRAZE_QCOLS(NAME, COLS) runs blocks of columns in parallel, by COLS (braze_mvcols_##T,
 * or braze_qstrips_##T), and the epilogue over each. */
#define BRAZE_MVCOLS(T, MODE, CH)                                                                            \
static inline __attribute__((always_inline)) void braze_mvcols_##T(const int NW, int64_t m, int64_t j0,     \
        int64_t nj, int64_t k, const uint8_t *const *w, int64_t ldw, const float *x, int64_t lda,            \
        const char *xq, int64_t xsz, const float *dx, const float *xs, float (*t)[BRAZE_QFEW * BRAZE_QEPN]) { \
    for (int64_t j = j0; j < j0 + nj; j += 4)                                                                \
        for (int i = 0; i < NW; i++)                                                                         \
            for (int64_t r = 0; r < m; r++) {                                                                \
                const int64_t kx = MODE == 3 ? braze_qs_pad(k) : k;  /* x's rows as braze_qlinear pads them */ \
                const void *xr = MODE == 0 ? (const void *)(x + r * lda) : (const void *)(xq + r * kx * xsz); \
                const float *dr = dx ? dx + r * (kx / 32) : dx, *sr = xs ? xs + r * (k / CH) : xs;           \
                float *out = t[i] + r * BRAZE_QEPN + (j - j0);                                               \
                if (j + 4 <= j0 + nj) braze_mv_##T(4, k, w[i] + j * ldw, ldw, xr, dr, sr, out);              \
                else                                                                                         \
                    for (int64_t jj = 0; j + jj < j0 + nj; jj++)                                             \
                        braze_mv_##T(1, k, w[i] + (j + jj) * ldw, ldw, xr, dr, sr, out + jj);                \
            }                                                                                                \
}
#define BRAZE_QCOLS(NAME, COLS)                                                                              \
static inline void NAME(int64_t m, int64_t n, int64_t k, const float *x, int64_t lda,             \
        const uint8_t *const *w, int nw, int64_t ldw, braze_qep_fn ep, void **args, int64_t nthreads,        \
        const char *xq, int64_t xsz, const float *dx, const float *xs) {                                     \
    int par = nthreads > 1 && nw * n * ldw >= BRAZE_QPAR_MIN;                                                \
    /* one weight, the common case, is taken with NW a literal (a loop over a variable nw cost 2.5%) */      \
    const int64_t cols = braze_qep_cols(n, par ? nthreads : 1);                                              \
    _Pragma("omp parallel for schedule(static) num_threads(par ? nthreads : 1)")                            \
    for (int64_t j0 = 0; j0 < n; j0 += cols) {                                                               \
        float t[BRAZE_QMAXW][BRAZE_QFEW * BRAZE_QEPN], *acc[BRAZE_QMAXW];                                    \
        int64_t nj = n - j0 < cols ? n - j0 : cols;                                                          \
        for (int i = 0; i < nw; i++) acc[i] = t[i];                                                          \
        if (nw == 1) COLS(1, m, j0, nj, k, w, ldw, x, lda, xq, xsz, dx, xs, t);                              \
        else COLS(nw, m, j0, nj, k, w, ldw, x, lda, xq, xsz, dx, xs, t);                                    \
        ep(args, 0, m, j0, nj, acc, BRAZE_QEPN);                                                             \
    }                                                                                                        \
}

/* A quantized type's kernel: integer matrix-vector for few rows, GEMM for many. */
#define BRAZE_QLINEAR(T, BS, TS, CH, MODE, WREAD)                                                                      \
static void braze_rowf_##T(const uint8_t *w, int64_t k, float *out) {                                        \
    uint8_t q[BS]; float s[BS / CH], o[BS / CH];                                                             \
    for (int64_t b = 0; b < k / BS; b++) {                                                                   \
        braze_unpack_##T(w + b * TS, q, s, o);                                                               \
        for (int i = 0; i < BS; i++) out[b * BS + i] = s[i / CH] * (float)q[i] + o[i / CH];                  \
    }                                                                                                        \
}                                                                                                            \
/* R rows of W (R a literal) against one x row, as MODE says: x float (0), int8 (1),   \
 * int16 (2) or int8x2 (3) in blocks of 32 with scales dx; y[0..R) */                                                      \
BRAZE_MV1_##T(T, TS)                                                                                         \
static inline __attribute__((always_inline)) void braze_mv_##T(const int R, int64_t k, const uint8_t *w,      \
        int64_t ldw, const void *x, const float *dx, const float *xs, float *y) {                             \
    if (MODE == 3 && braze_mv1_##T(R, k, w, ldw, x, dx, xs, y)) return;                                      \
    braze_vf accf[4] = {{0}, {0}, {0}, {0}};                                                                 \
    braze_qacc acci[4] = {BRAZE_QACC_ZERO, BRAZE_QACC_ZERO, BRAZE_QACC_ZERO, BRAZE_QACC_ZERO};               \
    float off[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                                 \
    braze_v8 offv[4] = {{0}, {0}, {0}, {0}};                                                                 \
    for (int64_t b = 0; b < k / BS; b++) {                                                                   \
        uint8_t q[4][BS] __attribute__((aligned(32))); float s[4][BS / CH], o[4][BS / CH];                   \
        /* 8R rows ahead, into L2 (prefetcht1), every line of the block: the hardware prefetcher    \
         * alone streamed a 30 MB Q8_0 matrix at 6 GB/s, prefetches into L1 at 8.8 (the L1's few     \
         * miss buffers), into L2 25 */                                                              \
        for (int r = 0; r < R; r++)                                                                  \
            for (int l = 0; l < TS; l += 64) __builtin_prefetch(w + (r + 8 * R) * ldw + b * TS + l, 0, 2); \
        for (int r = 0; r < R; r++) braze_unpack_##T(w + r * ldw + b * TS, q[r], s[r], o[r]);                \
        for (int r = 0; r < R; r++) {                                                                        \
            const float *d = dx + b * (BS / 32);                                                             \
            braze_offsets(BS / CH, o[r], xs + b * (BS / CH), &offv[r], &off[r]);                             \
            if (MODE == 0) braze_fblock(BS, CH, q[r], s[r], (const float *)x + b * BS, &accf[r]);            \
            else if (MODE == 1) braze_qblock(BS, CH, q[r], s[r], (const int8_t *)x + b * BS, NULL, d, &acci[r]); \
            else if (MODE == 3)                                                                              \
                braze_qblock(BS, CH, q[r], s[r], (const int8_t *)x + b * BS, (const int8_t *)x + braze_qs_pad(k) + b * BS, d, &acci[r]); \
            else braze_wblock(BS, CH, q[r], s[r], (const int16_t *)x + b * BS, d, &accf[r]);                 \
        }                                                                                                    \
    }                                                                                                        \
    for (int r = 0; r < R; r++)                                                                              \
        y[r] = (MODE == 1 || MODE == 3 ? braze_qacc_sum(acci[r]) : braze_v8_hsum(braze_vf_add8(accf[r])))    \
               + off[r] + braze_v8_hsum(offv[r]);                                                            \
}                                                                                                            \
BRAZE_MVCOLS(T, MODE, CH)                                                                                    \
BRAZE_QSTRIPS_##WREAD(T, BS, TS, CH)                                                                         \
BRAZE_QSTRIPCOLS(T)                                                                                          \
BRAZE_QCOLS(braze_qcols_##T, braze_mvcols_##T)                                                              \
BRAZE_QCOLS(braze_qscols_##T, braze_qstrips_##T)                                                             \
static void braze_qlinear_##T(int64_t m, int64_t n, int64_t k, const float *x, int64_t lda,                 \
        const uint8_t *const *w, int nw, int64_t ldw, braze_qep_fn ep, braze_qpro_fn pro, void **args,       \
        int64_t nthreads) {                                                                                  \
    if (pro) { x = braze_qprologue(m, k, pro, args); lda = k; }                                              \
    if (m > BRAZE_QFEW) { braze_qlinear_gemm(m, n, k, x, lda, w, nw, ldw, ep, args, nthreads, braze_rowf_##T); return; } \
    /* x, once per call: sums per chunk for the offsets; int8/int16 blocks and their scales */             \
    const int64_t xsz = MODE == 1 ? 1 : 2;  /* bytes of x per element: int8x2 keeps hi then lo per row */    \
    const int64_t kx = MODE == 3 ? braze_qs_pad(k) : k;  /* the strips' rows are padded with zeros */        \
    /* x's chunk sums, per row; for the strips (mode 3, m > 1) chunk-major, BRAZE_QFEW lanes a chunk */      \
    const int64_t xstep = MODE == 3 && m > 1 ? BRAZE_QFEW : 1, nxs = xstep > 1 ? BRAZE_QFEW : m;              \
    float *xs = (float *)braze_q_scratch(0, (size_t)nxs * (k / CH) * 4 + (size_t)m * ((kx / 32) * 4 + kx * xsz)); \
    float *dx = xs + nxs * (k / CH);                                                                         \
    if (xstep > 1) memset(xs, 0, (size_t)nxs * (k / CH) * 4);  /* the lanes past m */                       \
    char *xq = (char *)(dx + m * (kx / 32));                                                                 \
    for (int64_t r = 0; r < m; r++) {                                                                        \
        braze_chunk_sums(x + r * lda, k, CH, xstep > 1 ? xs + r : xs + r * (k / CH), xstep);                 \
        if (MODE == 1 || MODE == 3) {                                                                        \
            int8_t *hi = (int8_t *)xq + r * kx * xsz, *lo = MODE == 3 ? hi + kx : NULL;                       \
            braze_quantize_row(x + r * lda, k, hi, lo, dx + r * (kx / 32));                                  \
            if (lo) { memset(hi + k, 0, (size_t)(kx - k)); memset(lo + k, 0, (size_t)(kx - k));              \
                      memset(dx + r * (kx / 32) + k / 32, 0, (size_t)(kx - k) / 32 * 4); }                    \
        }                                                                                                    \
        if (MODE == 2) braze_quantize_row16(x + r * lda, k, (int16_t *)xq + r * k, dx + r * (k / 32));       \
    }                                                                                                        \
    /* one row: braze_mv, its unpack in registers; more (mode 3): the strips, each in its own parallel loop */ \
    if (MODE == 3 && m > 1) {                                                                                \
        const char *xl = xq; const float *dl = dx;                                                          \
        braze_qs_prepare(m, kx, &xl, &dl);  /* the strips' own layout of x, if they have one */              \
        braze_qscols_##T(m, n, k, x, lda, w, nw, ldw, ep, args, nthreads, xl, xsz, dl, xs);                  \
    }                                                                                                        \
    else braze_qcols_##T(m, n, k, x, lda, w, nw, ldw, ep, args, nthreads, xq, xsz, dx, xs);                  \
}

/* A float type's kernel: dot products for few rows, the GEMM for many. Few rows: R rows
 * of W at a time converted in registers against one x row, software-prefetched into L2
 * as the quantized kernel's rows are (dx and xs, the quantized x's, are unused). */
#define BRAZE_FLINEAR(T)                                                                                     \
static inline __attribute__((always_inline)) void braze_mv_##T(const int R, int64_t k, const uint8_t *w,      \
        int64_t ldw, const void *xv_, const float *dx, const float *xs, float *y) {                          \
    (void)dx; (void)xs;                                                                                      \
    const float *x = (const float *)xv_;                                                                     \
    braze_vf acc[4] = {{0}, {0}, {0}, {0}};                                                                 \
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                                \
    const int64_t es = (int64_t)sizeof(braze_es_##T); /* bytes per element */                                \
    int64_t i = 0;                                                                                           \
    for (; i + BRAZE_VL <= k; i += BRAZE_VL) {                                                               \
        if ((i * es) % 64 == 0)                                                                              \
            for (int r = 0; r < R; r++) __builtin_prefetch(w + (r + 8 * R) * ldw + i * es, 0, 2);            \
        braze_vf xv = braze_vf_load(x + i);                                                                  \
        for (int r = 0; r < R; r++) acc[r] += braze_ldvf_##T(w + r * ldw, i) * xv;                           \
    }                                                                                                        \
    for (; i < k; i++)                                                                                       \
        for (int r = 0; r < R; r++) tail[r] += braze_ld1_##T(w + r * ldw, i) * x[i];                         \
    for (int r = 0; r < R; r++) y[r] = braze_v8_hsum(braze_vf_add8(acc[r])) + tail[r];                       \
}                                                                                                            \
BRAZE_MVCOLS(T, 0, 32)                                                                                       \
BRAZE_QCOLS(braze_qcols_##T, braze_mvcols_##T)                                                              \
static void braze_qlinear_##T(int64_t m, int64_t n, int64_t k, const float *x, int64_t lda,                 \
        const uint8_t *const *w, int nw, int64_t ldw, braze_qep_fn ep, braze_qpro_fn pro, void **args,       \
        int64_t nthreads) {                                                                                  \
    if (pro) { x = braze_qprologue(m, k, pro, args); lda = k; }                                              \
    if (m > BRAZE_QFEW) { braze_qlinear_gemm(m, n, k, x, lda, w, nw, ldw, ep, args, nthreads, braze_row_##T); return; } \
    braze_qcols_##T(m, n, k, x, lda, w, nw, ldw, ep, args, nthreads, NULL, 0, NULL, NULL);                   \
}
