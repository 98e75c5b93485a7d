/* GGML blocks as braze's quantized matmul (quant.h, which comes after this) reads them:
 * a block unpacked into bytes q, chunk scales s and offsets o; float rows (F32, F16,
 * BF16) converted; x rows quantized to int8, int8x2 or int16 blocks of 32; and one
 * block's dot with one x row in each of the decoding modes (codegen/quant.py's MODE).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define BRAZE_VNNI 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define BRAZE_AVX2 1
#endif
/* int8x2's x (mode 3, codegen/quant.py) kept as its 15-bit integers themselves, int16,
 * instead of two int8 halves: the same integers (v = 128 hi + lo), so the same dots,
 * taken by AVX2's vpmaddwd 16 products an instruction (vpmaddubsw on the halves would
 * saturate: W's bytes reach 255, and 2 x 255 x 127 passes int16). A block of 32 is
 * stored in the order 0-7, 16-23, 8-15, 24-31, which W's 32 bytes widen to with
 * unpacklo/unpackhi, no lane crossing (braze_x16_dot).
 * One x row (decoding, braze_mv) is always kept so. With 512-bit VNNI too: one-row
 * kernels dotting int8 halves (two vpdpbusd, a shift and an add a block) measured
 * 1.0-1.4x slower than these on the AMD EPYC (Zen 4; bench/RESULTS.md, twentieth
 * session), and were removed.
 * BRAZE_QS16: the strips' x rows (2 and more) too, where VNNI is not; with VNNI the
 * strips dot int8 halves, one W byte against many x rows. */
#ifndef BRAZE_VNNI
#define BRAZE_QS16 1
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
#elif defined(__AVX2__)
    /* byte i of the word to byte i / 8 of a lane (each lane holds the 4 bytes), then its
     * bit i % 8 tested: the vector initializer below compiled to 32 byte inserts, and
     * made Q5_0 4x slower than Q4_1 at one row */
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i idx = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), idx), bit);
    return (braze_u8x32)_mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
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
/* Q4_K's / Q5_K's 12 bytes of 6-bit scales and mins as 16 bytes: scales 0-7, mins 0-7 */
static inline void braze_k4_words(const uint8_t *p, uint32_t v[4]) {
    uint32_t a[3];
    memcpy(a, p, 12);
    v[0] = a[0] & 0x3f3f3f3fu;                                                /* scales 0..3 */
    v[1] = (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4);        /* scales 4..7 */
    v[2] = a[1] & 0x3f3f3f3fu;                                                /* mins 0..3 */
    v[3] = ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4); /* mins 4..7 */
}
static inline void braze_k4_scales(const uint8_t *p, float d, float dmin, float *s, float *o) {
    uint32_t v[4];
    braze_k4_words(p, v);
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

/* x row -> int8x2's integers as int16, per block of 32 in braze_x16_dot's
 * order or, with nat, in element order: the same scale and rounding as
 * braze_quantize_row's, 128 hi + lo */
static inline int braze_x16_pos(int i) { return (i & 7) | ((i & 8) << 1) | ((i & 16) >> 1); }
static inline void braze_quantize_x16(const float *x, int64_t k, int16_t *v, float *d, int nat) {
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + 32 * b;
        int16_t *vb = v + 32 * b;
#ifdef BRAZE_AVX2
        /* max ignores nan as the scalar compare does; the conversion rounds as lrintf */
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 t[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) { t[j] = _mm256_loadu_ps(xb + 8 * j); m = _mm256_max_ps(_mm256_andnot_ps(sign, t[j]), m); }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float dd = _mm_cvtss_f32(h) / 16256.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(t[j], _mm256_set1_ps(id)));
        d[b] = dd;  /* packs interleaves 128-bit lanes; the permute puts 0-7 before 8-15 (or 16-23) */
        const int j1 = nat ? 1 : 2, j2 = 3 - j1;
        _mm256_storeu_si256((__m256i *)vb, _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[j1]), 0xD8));
        _mm256_storeu_si256((__m256i *)(vb + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(q[j2], q[3]), 0xD8));
#else
        float id;
        d[b] = braze_block_scale(xb, 16256.0f, &id);
        for (int i = 0; i < 32; i++) vb[nat ? i : braze_x16_pos(i)] = (int16_t)lrintf(xb[i] * id);
#endif
    }
}

/* One block of W (unpacked: q, per-chunk s and o) dotted with one x row's block at
 * b0 (BS elements): the integer dots scaled into acc (8 lanes), the offsets into off. */
#if defined(BRAZE_VNNI) || defined(BRAZE_AVX2)
typedef __m256 braze_qacc;
#define BRAZE_QACC_ZERO _mm256_setzero_ps()
static inline void braze_qacc_add(__m256 *a, float v) { (*a)[0] += v; }  /* v into the first lane */
static inline float braze_qacc_sum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#else
typedef float braze_qacc;
#define BRAZE_QACC_ZERO 0.0f
static inline void braze_qacc_add(float *a, float v) { *a += v; }
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
#if defined(BRAZE_VNNI) || defined(BRAZE_AVX2)
/* a block of 32's scales s dx in one dot's lanes (CH 16: lanes 0-3 the first chunk's) */
static inline __m256 braze_qscale8(const int CH, const float *s, int u, float dx) {
    return CH == 32 ? _mm256_set1_ps(s[u] * dx) : _mm256_set_m128(_mm_set1_ps(s[2 * u + 1] * dx), _mm_set1_ps(s[2 * u] * dx));
}
#endif
#ifdef BRAZE_AVX2
/* two int16 dots' pair sums added (a xa + b xb per int32 lane): with VNNI the second
 * vpmaddwd and the add are one vpdpwssd */
static inline __m256i braze_madd2(__m256i a, __m256i xa, __m256i b, __m256i xb) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(a, xa), b, xb);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(a, xa), b, xb);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(a, xa), _mm256_madd_epi16(b, xb));
#endif
}
/* W's 32 bytes (element order) dotted with x's 32 int16 (xa, xb: braze_quantize_x16's
 * order): int32 lanes 0-3 sum elements 0-15, lanes 4-7 elements 16-31, as vpdpbusd's */
static inline __m256i braze_x16_dot(__m256i q, __m256i xa, __m256i xb) {
    const __m256i z = _mm256_setzero_si256();
    return braze_madd2(_mm256_unpacklo_epi8(q, z), xa, _mm256_unpackhi_epi8(q, z), xb);
}
#endif
/* int8 x (mode 1, which only tests build) */
static inline __attribute__((always_inline)) void braze_qblock(const int BS, const int CH,
        const uint8_t *restrict q, const float *restrict s, const int8_t *restrict xq, const float *restrict dx,
        braze_qacc *acc) {
#ifdef BRAZE_VNNI
    for (int u = 0; u < BS / 32; u++) {
        const __m256i p = BRAZE_DPBUSD(_mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(q + 32 * u)),
                                       _mm256_loadu_si256((const __m256i *)(xq + 32 * u)));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), braze_qscale8(CH, s, u, dx[u]), *acc);
    }
#else
    for (int c = 0; c < BS / 16; c++) {
        int32_t t = 0;
        for (int i = 0; i < 16; i++) t += (int32_t)q[16 * c + i] * xq[16 * c + i];
        braze_qacc_add(acc, s[c * 16 / CH] * dx[c / 2] * (float)t);
    }
#endif
}
/* plain C: chunk c (of 16) of a block's bytes q dotted with its int16 x (braze_x16_dot's order) */
static inline int32_t braze_x16_sum16(const uint8_t *q, const int16_t *xv, int c) {
    int32_t t = 0;
    for (int i = 16 * c; i < 16 * c + 16; i++) t += (int32_t)q[i] * xv[braze_x16_pos(i)];
    return t;
}
/* int8x2's x (as int16: one row's) against a block, x at the block's first element */
static inline __attribute__((always_inline)) void braze_qblock16(const int BS, const int CH,
        const uint8_t *restrict q, const float *restrict s, const int16_t *restrict xv, const float *restrict dx,
        braze_qacc *acc) {
    for (int u = 0; u < BS / 32; u++) {
#ifdef BRAZE_AVX2
        const __m256i p = braze_x16_dot(_mm256_loadu_si256((const __m256i *)(q + 32 * u)),
                                        _mm256_loadu_si256((const __m256i *)(xv + 32 * u)),
                                        _mm256_loadu_si256((const __m256i *)(xv + 32 * u + 16)));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), braze_qscale8(CH, s, u, dx[u]), *acc);
#else
        for (int c = 0; c < 2; c++)
            braze_qacc_add(acc, s[(32 * u + 16 * c) / CH] * dx[u] * (float)braze_x16_sum16(q + 32 * u, xv + 32 * u, c));
#endif
    }
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
