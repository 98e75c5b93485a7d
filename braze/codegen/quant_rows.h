/* braze's quantized matmul, one x row (decoding) in registers: after quant.h (whose
 * braze_qpf it uses), before quant_linear.h, whose braze_mv_##T calls
 * BRAZE_MV1_##T first and falls back to unpacking into scratch where it returns 0.
 * One macro per kind of kernel, one table at the end naming which each type takes.
 */
/* ---- one x row, int8x2 (mode 3), the types of blocks of 32 ---------------------------
 * braze_mv unpacks each block of R rows of W into scratch and dots it from there. Q4_0,
 * Q4_1, Q5_0 and Q8_0 (32 values under one scale) are dotted from the block in registers
 * instead (braze_qd_##T), their scale and offset as braze_unpack_##T has them: the same
 * integers and products (bench/RESULTS.md, eleventh and eighteenth sessions). Q5_1
 * measured the same and keeps braze_mv's. BRAZE_MV1_##T says which.
 * x is int16, with VNNI too: the kernels dotting its int8 halves (two
 * vpdpbusd, a shift and an add a block; two blocks an iteration in 512 bits) measured
 * 1.0-1.4x slower than these on the AMD EPYC with AVX-512 VNNI (twentieth session). */
#if defined(BRAZE_AVX2) && defined(__F16C__)
/* x's block b of one row in two registers: elements 0-15 and 16-31, in element order
 * where BRAZE_X16NAT_##T (braze_qx_row lays it out so), else in braze_x16_dot's */
static inline __attribute__((always_inline)) void braze_mv1_x(const void *x, int64_t b, __m256i *xa, __m256i *xb) {
    *xa = _mm256_loadu_si256((const __m256i *)((const int16_t *)x + 32 * b));
    *xb = _mm256_loadu_si256((const __m256i *)((const int16_t *)x + 32 * b + 16));
}
/* A block's integer dot with x's block (xa, xb), its scale and offset. W's values are
 * widened to int16 straight from the block, x in element order: the nibbles' 16 bytes
 * zero-extended once, low nibbles by a mask and high ones by a shift; Q8_0's bytes
 * sign-extended, its offset 0 (the same sums: -128 d times x's sum is what xor 0x80
 * added). No byte vector to build and widen again: 20-25% fewer instructions a block. */
static inline __m256i braze_qd_nibbles(const uint8_t *p, __m256i xa, __m256i xb) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return braze_madd2(_mm256_and_si256(v, _mm256_set1_epi16(15)), xa, _mm256_srli_epi16(v, 4), xb);
}
static inline __m256i braze_qd_q4_0(const uint8_t *b, float *s, float *o, __m256i xa, __m256i xb) {
    *s = braze_q_f16(b); *o = -8.0f * *s; return braze_qd_nibbles(b + 2, xa, xb);
}
static inline __m256i braze_qd_q4_1(const uint8_t *b, float *s, float *o, __m256i xa, __m256i xb) {
    uint32_t u;  /* d and m: two float16 words, one conversion */
    memcpy(&u, b, 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
    *s = _mm_cvtss_f32(f); *o = _mm_cvtss_f32(_mm_movehdup_ps(f));
    return braze_qd_nibbles(b + 4, xa, xb);
}
static inline __m256i braze_qd_q8_0(const uint8_t *b, float *s, float *o, __m256i xa, __m256i xb) {
    *s = braze_q_f16(b); *o = 0.0f;
    return braze_madd2(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 2))), xa,
                       _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 18))), xb);
}
#define BRAZE_X16NAT_q4_0 1
#define BRAZE_X16NAT_q4_1 1
#define BRAZE_X16NAT_q8_0 1
#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* Q5_0's fifth bits (one per element, 0-15 then 16-31) as two masked adds of 16 (3-12%
 * faster than building its bytes first, below) */
static inline __m256i braze_qd_q5_0(const uint8_t *b, float *s, float *o, __m256i xa, __m256i xb) {
    uint32_t h;
    memcpy(&h, b + 2, 4);
    *s = braze_q_f16(b); *o = -16.0f * *s;
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 6))), c = _mm256_set1_epi16(16);
    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi16(15)), hi = _mm256_srli_epi16(v, 4);
    return braze_madd2(_mm256_mask_add_epi16(lo, (__mmask16)h, lo, c), xa,
                       _mm256_mask_add_epi16(hi, (__mmask16)(h >> 16), hi, c), xb);
}
#define BRAZE_X16NAT_q5_0 1
#else
/* its bytes built (nibbles or'd with the fifth bits, spelled in intrinsics: as
 * braze_nibbles32's shufflevector they were 3-5% slower), then widened by braze_x16_dot */
static inline __m256i braze_qd_q5_0(const uint8_t *b, float *s, float *o, __m256i xa, __m256i xb) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + 6)), f = _mm_set1_epi8(15);
    const __m256i n = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, f)),
                                              _mm_and_si128(_mm_srli_epi16(v, 4), f), 1);
    *s = braze_q_f16(b); *o = -16.0f * *s;
    return braze_x16_dot(_mm256_or_si256(n, (__m256i)braze_bits32(b + 2)), xa, xb);
}
#endif
#if BRAZE_WIDE512 && defined(__AVX512BW__)
/* Two blocks an iteration in 512 bits (block b in the low half, b + 1 in the high), where
 * the machine runs 512-bit integer operations at the rate of 256-bit ones (BRAZE_WIDE512:
 * runtime/simd.py measures it): the same dots, half the instructions a block. */
static inline __m512i braze_madd2_z(__m512i a, __m512i xa, __m512i b, __m512i xb) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(_mm512_madd_epi16(a, xa), b, xb);
#else
    return _mm512_add_epi32(_mm512_madd_epi16(a, xa), _mm512_madd_epi16(b, xb));
#endif
}
static inline __m256i braze_ld2x128(const uint8_t *p, const uint8_t *q) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                   _mm_loadu_si128((const __m128i *)q), 1);
}
static inline __m512i braze_qd2_nibbles(const uint8_t *p, const uint8_t *q, __m512i xa, __m512i xb) {
    const __m512i v = _mm512_cvtepu8_epi16(braze_ld2x128(p, q));
    return braze_madd2_z(_mm512_and_si512(v, _mm512_set1_epi16(15)), xa, _mm512_srli_epi16(v, 4), xb);
}
static inline __m512i braze_qd2_q4_0(const uint8_t *b, const int TS, __m512i xa, __m512i xb) {
    return braze_qd2_nibbles(b + 2, b + TS + 2, xa, xb);
}
static inline __m512i braze_qd2_q4_1(const uint8_t *b, const int TS, __m512i xa, __m512i xb) {
    return braze_qd2_nibbles(b + 4, b + TS + 4, xa, xb);
}
static inline __m512i braze_qd2_q8_0(const uint8_t *b, const int TS, __m512i xa, __m512i xb) {
    return braze_madd2_z(_mm512_cvtepi8_epi16(braze_ld2x128(b + 2, b + TS + 2)), xa,
                         _mm512_cvtepi8_epi16(braze_ld2x128(b + 18, b + TS + 18)), xb);
}
static inline __m512i braze_qd2_q5_0(const uint8_t *b, const int TS, __m512i xa, __m512i xb) {
    uint32_t h0, h1;
    memcpy(&h0, b + 2, 4);
    memcpy(&h1, b + TS + 2, 4);
    const __m512i v = _mm512_cvtepu8_epi16(braze_ld2x128(b + 6, b + TS + 6)), c = _mm512_set1_epi16(16);
    const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi16(15)), hi = _mm512_srli_epi16(v, 4);
    return braze_madd2_z(_mm512_mask_add_epi16(lo, (__mmask32)((h0 & 0xffffu) | (h1 << 16)), lo, c), xa,
                         _mm512_mask_add_epi16(hi, (__mmask32)((h0 >> 16) | (h1 & 0xffff0000u)), hi, c), xb);
}
#define BRAZE_MV4_PAIRS(T, TS)                                                                                \
    __m512 accz = _mm512_setzero_ps();                                                                       \
    for (; b + 1 < k / 32; b += 2) {                                                                         \
        braze_qpf(w, ldw, 4, b * TS, 2 * TS);                                                                \
        const __m512i z0 = _mm512_loadu_si512((const int16_t *)x + 32 * b);                                  \
        const __m512i z1 = _mm512_loadu_si512((const int16_t *)x + 32 * b + 32);                             \
        const __m512i xa = _mm512_shuffle_i64x2(z0, z1, 0x44), xb = _mm512_shuffle_i64x2(z0, z1, 0xEE);      \
        __m512i p[4];                                                                                        \
        for (int r = 0; r < 4; r++) p[r] = braze_qd2_##T(w + r * ldw + b * TS, TS, xa, xb);                  \
        __m128 s4, o4, s4b, o4b;                                                                             \
        braze_q4s_##T(w + b * TS, ldw, dx[b], xs[b], &s4, &o4);                                              \
        braze_q4s_##T(w + (b + 1) * TS, ldw, dx[b + 1], xs[b + 1], &s4b, &o4b);                              \
        const __m512 s = _mm512_shuffle_f32x4(_mm512_castps128_ps512(s4), _mm512_castps128_ps512(s4b), 0);   \
        accz = _mm512_fmadd_ps(_mm512_cvtepi32_ps(braze_sum4_z(p)), s, accz);                                \
        off = _mm_add_ps(off, _mm_add_ps(o4, o4b));                                                          \
    }                                                                                                        \
    acc = _mm256_add_ps(_mm512_castps512_ps256(accz), _mm512_extractf32x8_ps(accz, 1));
#else
#define BRAZE_MV4_PAIRS(T, TS)
#endif
/* Four rows at once with int16 x: their four blocks' integer dots summed across lanes
 * into one vector (braze_sum4: row r in lanes r and r + 4), then one convert and
 * one FMA by the four rows' scales, converted as one vector (braze_q4s_##T: s4 = d dx,
 * o4 = the offsets times x's sum). One row a block took a convert, a scale's
 * conversion, product and broadcast and an FMA each. */
static inline __m128 braze_q4h(const uint8_t *b, int64_t ldw) {  /* four rows' float16 words at b */
    __m128i v = _mm_cvtsi32_si128(braze_q_u16(b));
    v = _mm_insert_epi16(v, braze_q_u16(b + ldw), 1);
    v = _mm_insert_epi16(v, braze_q_u16(b + 2 * ldw), 2);
    v = _mm_insert_epi16(v, braze_q_u16(b + 3 * ldw), 3);
    return _mm_cvtph_ps(v);
}
#define BRAZE_Q4S_D(T, C)                                                                                     \
static inline void braze_q4s_##T(const uint8_t *b, int64_t ldw, float dx, float xs, __m128 *s4, __m128 *o4) { \
    const __m128 d = braze_q4h(b, ldw);                                                                      \
    *s4 = _mm_mul_ps(d, _mm_set1_ps(dx)); *o4 = _mm_mul_ps(d, _mm_set1_ps(C * xs));                          \
}
BRAZE_Q4S_D(q4_0, -8.0f)
BRAZE_Q4S_D(q5_0, -16.0f)
BRAZE_Q4S_D(q8_0, 0.0f)
static inline void braze_q4s_q4_1(const uint8_t *b, int64_t ldw, float dx, float xs, __m128 *s4, __m128 *o4) {
    *s4 = _mm_mul_ps(braze_q4h(b, ldw), _mm_set1_ps(dx));  /* (four words a conversion, then split: 5% slower) */
    *o4 = _mm_mul_ps(braze_q4h(b + 2, ldw), _mm_set1_ps(xs));
}
/* four vectors' lane sums, row r in lanes r and r + 4 of each 256 bits: by unpacks and
 * adds (vphaddd is four micro-ops on AMD Zen); braze_sum4_z in 512 bits */
#define BRAZE_SUM4(NAME, V, S)                                                                                \
static inline V NAME(const V *p) {                                                                           \
    const V a = _mm##S##_add_epi32(_mm##S##_unpacklo_epi32(p[0], p[1]), _mm##S##_unpackhi_epi32(p[0], p[1])); \
    const V b = _mm##S##_add_epi32(_mm##S##_unpacklo_epi32(p[2], p[3]), _mm##S##_unpackhi_epi32(p[2], p[3])); \
    return _mm##S##_add_epi32(_mm##S##_unpacklo_epi64(a, b), _mm##S##_unpackhi_epi64(a, b));                  \
}
BRAZE_SUM4(braze_sum4, __m256i, 256)
#if BRAZE_WIDE512 && defined(__AVX512BW__)
BRAZE_SUM4(braze_sum4_z, __m512i, 512)
#endif
#define BRAZE_MV4(T, TS)                                                                                      \
static inline __attribute__((always_inline)) void braze_mv4_##T(int64_t k, const uint8_t *w, int64_t ldw,    \
        const void *x, const float *dx, const float *xs, float *y) {                                         \
    __m256 acc = _mm256_setzero_ps();                                                                        \
    __m128 off = _mm_setzero_ps();                                                                           \
    int64_t b = 0;                                                                                           \
    BRAZE_MV4_PAIRS(T, TS)                                                                                   \
    for (; b < k / 32; b++) {                                                                                \
        braze_qpf(w, ldw, 4, b * TS, TS);                                                                    \
        __m256i xv, xw, p[4];                                                                                \
        braze_mv1_x(x, b, &xv, &xw);                                                                         \
        for (int r = 0; r < 4; r++) { float s, o; p[r] = braze_qd_##T(w + r * ldw + b * TS, &s, &o, xv, xw); } \
        const __m256i h = braze_sum4(p);                                                                     \
        __m128 s4, o4;                                                                                       \
        braze_q4s_##T(w + b * TS, ldw, dx[b], xs[b], &s4, &o4);                                              \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_set_m128(s4, s4), acc);                          \
        off = _mm_add_ps(off, o4);                                                                           \
    }                                                                                                        \
    _mm_storeu_ps(y, _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)), off)); \
}
#define BRAZE_MV1_REGS(T, TS)                                                                                 \
BRAZE_MV4(T, TS)                                                                                             \
static inline __attribute__((always_inline)) int braze_mv1_##T(const int R, int64_t k, const uint8_t *w,     \
        int64_t ldw, const void *x, const float *dx, const float *xs, float *y) {                            \
    if (R == 4) { braze_mv4_##T(k, w, ldw, x, dx, xs, y); return 1; }                                        \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};    \
    float off[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                                 \
    for (int64_t b = 0; b < k / 32; b++) {                                                                   \
        braze_qpf(w, ldw, R, b * TS, TS);                                                                    \
        __m256i xv, xw;                                                                                      \
        braze_mv1_x(x, b, &xv, &xw);                                                                         \
        for (int r = 0; r < R; r++) {                                                                        \
            float s, o;                                                                                      \
            const __m256i p = braze_qd_##T(w + r * ldw + b * TS, &s, &o, xv, xw);                            \
            off[r] += o * xs[b];                                                                             \
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s * dx[b]), acc[r]);              \
        }                                                                                                    \
    }                                                                                                        \
    for (int r = 0; r < R; r++) y[r] = braze_qacc_sum(acc[r]) + off[r];                                      \
    return 1;                                                                                                \
}
#else
#define BRAZE_MV1_REGS BRAZE_MV1_NONE
#endif
/* the other types (and without AVX2): none, braze_mv unpacks */
#define BRAZE_MV1_NONE(T, TS)                                                                                 \
static inline int braze_mv1_##T(const int R, int64_t k, const uint8_t *w, int64_t ldw, const void *x,         \
        const float *dx, const float *xs, float *y) {                                                        \
    (void)R; (void)k; (void)w; (void)ldw; (void)x; (void)dx; (void)xs; (void)y;                             \
    return 0;                                                                                                \
}
#ifdef BRAZE_AVX2
/* Q4_K and Q6_K at one row with int16 x: a superblock's 32-element pieces built in
 * registers and dotted by braze_x16_dot (x in its order), their chunk scales times x's
 * block scales as vectors (one per 8 chunks; a dot's scale picked by a permute), the
 * offsets one FMA per 8 chunks: the same values as braze_unpack_##T's, without the
 * scratch's stores and loads and the scalar scale products (braze_mv's path). Two
 * accumulators a row: eight FMAs a superblock in one chain waited on their latency. */
static inline __m256 braze_lane(__m256 v, int i0, int i1) {  /* lanes 0-3 v[i0], 4-7 v[i1] */
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(i0, i0, i0, i0, i1, i1, i1, i1));
}
/* Q4_K's 8 chunk scales times x's block scales, its offsets (-dmin m times x's chunk sums)
 * added into offv */
static inline __attribute__((always_inline)) __m256 braze_q4k_scales(const uint8_t *b, const float *dx, const float *xs,
                                                                    __m256 *offv) {
    uint32_t v[4];
    braze_k4_words(b + 4, v);  /* as braze_k4_scales */
    const __m256 s = _mm256_mul_ps(_mm256_set1_ps(braze_q_f16(b)), (__m256)braze_bytes_to_v8(v, 0));
    const __m256 o = _mm256_mul_ps(_mm256_set1_ps(-braze_q_f16(b + 2)), (__m256)braze_bytes_to_v8(v + 2, 0));
    *offv = _mm256_add_ps(*offv, _mm256_mul_ps(o, _mm256_loadu_ps(xs)));
    return _mm256_mul_ps(s, _mm256_loadu_ps(dx));
}
/* Q6_K's parts both forms share: its 16 chunk scales times x's block scales (chunk c of
 * 16 in lane c % 8 of sd[c / 8], as braze_k16_scales: s = d sc, o = -32 s, chunk c takes
 * dx[c / 2]) with the offsets added into offv; and half n's four pieces of 32 values as
 * bytes (the fifth and sixth bits moved to bits 4-5), values 128n + 32t on in q[t]. */
static inline __attribute__((always_inline)) void braze_q6k_scales(const uint8_t *b, const float *dx, const float *xs,
                                                                   __m256 *offv, __m256 *sd) {
    const __m256 d = _mm256_set1_ps(braze_q_f16(b + 208)), dx8 = _mm256_loadu_ps(dx);
    for (int h = 0; h < 2; h++) {
        const __m256 sv = _mm256_mul_ps(d, (__m256)braze_bytes_to_v8(b + 192 + 8 * h, 1));
        *offv = _mm256_add_ps(*offv, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-32.0f), sv), _mm256_loadu_ps(xs + 8 * h)));
        sd[h] = _mm256_mul_ps(sv, _mm256_permutevar8x32_ps(dx8, _mm256_setr_epi32(4 * h, 4 * h, 4 * h + 1, 4 * h + 1,
                                                                                    4 * h + 2, 4 * h + 2, 4 * h + 3, 4 * h + 3)));
    }
}
static inline __attribute__((always_inline)) void braze_q6k_pieces(const uint8_t *b, int n, __m256i *q) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
}
#if BRAZE_WIDE512 && defined(__AVX512BW__)
/* Two blocks' worth an instruction here too (BRAZE_WIDE512): a piece of 32 values widened
 * to one 512-bit register and dotted with x in element order (BRAZE_X16NAT_##T 1), where
 * the 256-bit form took two unpacks and two multiply-adds. Q4_K's chunks of 32 take one
 * scale a register; Q6_K's of 16 two (lanes 0-7 and 8-15, by a permute). */
typedef __m512 braze_kacc;
static inline float braze_kacc_sum(__m512 a) { return _mm512_reduce_add_ps(a); }
static inline __attribute__((always_inline)) void braze_qk_q4_k(const uint8_t *b, const int16_t *x, const float *dx,
                                                                const float *xs, braze_kacc *acc, __m256 *offv) {
    float sd[8];
    _mm256_storeu_ps(sd, braze_q4k_scales(b, dx, xs, offv));
    for (int j = 0; j < 4; j++) {
        const __m512i v16 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j)));
        const __m512i p0 = _mm512_madd_epi16(_mm512_and_si512(v16, _mm512_set1_epi16(15)),
                                             _mm512_loadu_si512(x + 64 * j));
        const __m512i p1 = _mm512_madd_epi16(_mm512_srli_epi16(v16, 4), _mm512_loadu_si512(x + 64 * j + 32));
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_set1_ps(sd[2 * j]), acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_set1_ps(sd[2 * j + 1]), acc[1]);
    }
}
static inline __attribute__((always_inline)) void braze_qk_q6_k(const uint8_t *b, const int16_t *x, const float *dx,
                                                                const float *xs, braze_kacc *acc, __m256 *offv) {
    __m256 sd[2];
    braze_q6k_scales(b, dx, xs, offv, sd);
    const __m512 sdz = _mm512_insertf32x8(_mm512_castps256_ps512(sd[0]), sd[1], 1);  /* chunk c in lane c */
    for (int n = 0; n < 2; n++) {
        __m256i q[4];
        braze_q6k_pieces(b, n, q);
        for (int t = 0; t < 4; t++) {
            const int c = 8 * n + 2 * t;  /* piece t: chunks c and c + 1 */
            const __m512i p = _mm512_madd_epi16(_mm512_cvtepu8_epi16(q[t]), _mm512_loadu_si512(x + 128 * n + 32 * t));
            const __m512 sc = _mm512_permutexvar_ps(_mm512_inserti32x8(_mm512_set1_epi32(c), _mm256_set1_epi32(c + 1), 1), sdz);
            acc[t & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[t & 1]);
        }
    }
}
#define BRAZE_X16NAT_q4_k 1
#define BRAZE_X16NAT_q6_k 1
#else
typedef __m256 braze_kacc;
static inline float braze_kacc_sum(__m256 a) { return braze_qacc_sum(a); }
static inline __attribute__((always_inline)) void braze_qk_q4_k(const uint8_t *b, const int16_t *x, const float *dx,
                                                                const float *xs, braze_kacc *acc, __m256 *offv) {
    const __m256 sd = braze_q4k_scales(b, dx, xs, offv);
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
        const int16_t *xj = x + 64 * j;
        const __m256i p0 = braze_x16_dot(_mm256_and_si256(v, m4), _mm256_loadu_si256((const __m256i *)xj),
                                         _mm256_loadu_si256((const __m256i *)(xj + 16)));
        const __m256i p1 = braze_x16_dot(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                         _mm256_loadu_si256((const __m256i *)(xj + 32)),
                                         _mm256_loadu_si256((const __m256i *)(xj + 48)));
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), braze_lane(sd, 2 * j, 2 * j), acc[0]);
        acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), braze_lane(sd, 2 * j + 1, 2 * j + 1), acc[1]);
    }
}
static inline __attribute__((always_inline)) void braze_qk_q6_k(const uint8_t *b, const int16_t *x, const float *dx,
                                                                const float *xs, braze_kacc *acc, __m256 *offv) {
    __m256 sd[2];
    braze_q6k_scales(b, dx, xs, offv, sd);
    for (int n = 0; n < 2; n++) {
        __m256i q[4];
        braze_q6k_pieces(b, n, q);
        for (int t = 0; t < 4; t++) {
            const int16_t *xu = x + 128 * n + 32 * t;
            const __m256i p = braze_x16_dot(q[t], _mm256_loadu_si256((const __m256i *)xu),
                                            _mm256_loadu_si256((const __m256i *)(xu + 16)));
            acc[t & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), braze_lane(sd[n], 2 * t, 2 * t + 1), acc[t & 1]);
        }
    }
}
#endif
#define BRAZE_MV1_K(T, TS, CH)                                                                                \
static inline __attribute__((always_inline)) int braze_mv1_##T(const int R, int64_t k, const uint8_t *w,     \
        int64_t ldw, const void *x, const float *dx, const float *xs, float *y) {                            \
    braze_kacc acc[4][2];                                                                                    \
    __m256 offv[4];                                                                                          \
    for (int r = 0; r < R; r++) { acc[r][0] = acc[r][1] = (braze_kacc){0}; offv[r] = _mm256_setzero_ps(); }  \
    for (int64_t b = 0; b < k / 256; b++) {                                                                  \
        braze_qpf(w, ldw, R, b * TS, TS);                                                                    \
        for (int r = 0; r < R; r++)                                                                          \
            braze_qk_##T(w + r * ldw + b * TS, (const int16_t *)x + 256 * b, dx + 8 * b, xs + b * (256 / CH),  \
                         acc[r], &offv[r]);                                                                  \
    }                                                                                                        \
    for (int r = 0; r < R; r++)                                                                              \
        y[r] = braze_kacc_sum(acc[r][0] + acc[r][1]) + braze_v8_hsum((braze_v8)offv[r]);                    \
    return 1;                                                                                                \
}
#define BRAZE_MV1_q4_k(T, TS) BRAZE_MV1_K(T, TS, 32)
#define BRAZE_MV1_q6_k(T, TS) BRAZE_MV1_K(T, TS, 16)
#else
#define BRAZE_MV1_q4_k BRAZE_MV1_NONE
#define BRAZE_MV1_q6_k BRAZE_MV1_NONE
#endif
/* x in element order for one row (int16 x, braze_qd_##T): 0 where braze_x16_dot's order */
#ifndef BRAZE_X16NAT_q4_0
#define BRAZE_X16NAT_q4_0 0
#define BRAZE_X16NAT_q4_1 0
#define BRAZE_X16NAT_q8_0 0
#endif
#ifndef BRAZE_X16NAT_q5_0
#define BRAZE_X16NAT_q5_0 0
#endif
#define BRAZE_X16NAT_q5_1 0
#define BRAZE_X16NAT_q2_k 0
#define BRAZE_X16NAT_q3_k 0
#ifndef BRAZE_X16NAT_q4_k
#define BRAZE_X16NAT_q4_k 0
#endif
#define BRAZE_X16NAT_q5_k 0
#ifndef BRAZE_X16NAT_q6_k
#define BRAZE_X16NAT_q6_k 0
#endif
#define BRAZE_MV1_q4_0 BRAZE_MV1_REGS
#define BRAZE_MV1_q4_1 BRAZE_MV1_REGS
#define BRAZE_MV1_q5_0 BRAZE_MV1_REGS
#define BRAZE_MV1_q5_1 BRAZE_MV1_NONE
#define BRAZE_MV1_q8_0 BRAZE_MV1_REGS
#define BRAZE_MV1_q2_k BRAZE_MV1_NONE
#define BRAZE_MV1_q3_k BRAZE_MV1_NONE
#define BRAZE_MV1_q5_k BRAZE_MV1_NONE
