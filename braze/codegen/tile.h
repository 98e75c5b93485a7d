/* braze's small matrix-multiply tile, for chain kernels (a matmul, row work, a matmul:
 * attention written as user code). Included in every generated translation unit.
 *
 * braze_mm: C = A * B (acc = 0) or C += A * B (acc = 1), float32, A m x k (row stride lda), B k x n (row stride
 * ldb), C m x n (row stride ldc), every row contiguous. Register-blocked: 6 rows of C
 * times two vectors of columns live in twelve accumulators while k runs, so each vector
 * of B loaded is used 6 times and each element of A broadcast is used twice. GCC
 * vector types as wide as the target's registers: 16 floats where -march=native has
 * AVX-512 (twice the FMA work per instruction where the core has 512-bit FMA units: on
 * the AMD EPYC braze is developed on, 260 against 130 GFLOP/s per core, twelve
 * independent FMA chains, while numpy's OpenBLAS picks its Haswell kernels there and
 * reaches 100-127), 8 with AVX2; -ffp-contract=fast turns each c += a * b into one FMA. Rows
 * past a multiple of 6 and columns past a block take narrower blocks. The tiles are
 * small (a few tens of KiB) and stay in L1/L2; what BLAS adds beyond this (packing for
 * L3, many-core blocking) does not pay at these sizes.
 */
#include <stdint.h>
#include <stdlib.h>

typedef float braze_v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t braze_i8 __attribute__((vector_size(32), aligned(4), may_alias));

static inline braze_v8 braze_v8_load(const float *p) { return *(const braze_v8 *)p; }
static inline void braze_v8_store(float *p, braze_v8 v) { *(braze_v8 *)p = v; }

/* The GEMM's vector: as wide as the machine's (16 floats with AVX-512, else 8). */
#if defined(__AVX512F__)
#define BRAZE_VL 16
#else
#define BRAZE_VL 8
#endif
typedef float braze_vf __attribute__((vector_size(4 * BRAZE_VL), aligned(4), may_alias));
typedef int32_t braze_vi __attribute__((vector_size(4 * BRAZE_VL), aligned(4), may_alias));
static inline braze_vf braze_vf_load(const float *p) { return *(const braze_vf *)p; }
static inline void braze_vf_store(float *p, braze_vf v) { *(braze_vf *)p = v; }
static inline braze_vf braze_vf_init(const float *p, int acc) {
    if (acc) return braze_vf_load(p);
    const braze_vf z = {0};
    return z;
}

/* x[r][l] += row r of A times columns [l, l + 1) * BRAZE_VL of B, for r < R, l < V:
 * R x V accumulators, each vector of B loaded once per step and used by R rows, each
 * element of A broadcast once and used by V vectors. R and V are literals wherever it
 * is called, so gcc unrolls both loops and keeps x in registers. */
static inline __attribute__((always_inline)) void braze_mm_block(const int R, const int V, int64_t k,
                                                                 const float *restrict A, int64_t lda,
                                                                 const float *restrict B, int64_t ldb,
                                                                 braze_vf x[6][8]) {
    for (int64_t p = 0; p < k; p++) {
        braze_vf b[8];
        for (int l = 0; l < V; l++) b[l] = braze_vf_load(B + p * ldb + l * BRAZE_VL);
        for (int r = 0; r < R; r++) {
            const float s = A[r * lda + p];
            for (int l = 0; l < V; l++) x[r][l] += s * b[l];
        }
    }
}

/* C's block of R rows x V vectors of columns = (acc = 0) or += that block of A * B. */
static inline __attribute__((always_inline)) void braze_mm_tile(const int R, const int V, int64_t k,
                                                                const float *restrict A, int64_t lda,
                                                                const float *restrict B, int64_t ldb,
                                                                float *restrict C, int64_t ldc, int acc) {
    braze_vf x[6][8];
    for (int r = 0; r < R; r++)
        for (int l = 0; l < V; l++) x[r][l] = braze_vf_init(C + r * ldc + l * BRAZE_VL, acc);
    braze_mm_block(R, V, k, A, lda, B, ldb, x);
    for (int r = 0; r < R; r++)
        for (int l = 0; l < V; l++) braze_vf_store(C + r * ldc + l * BRAZE_VL, x[r][l]);
}

/* R rows of C (R a literal): blocks of V vectors of columns, then one vector, then
 * (16-float vectors) one 8-float vector, then single columns. */
static inline __attribute__((always_inline)) void braze_mm_rows(const int R, const int V, int64_t n, int64_t k,
                                                                const float *restrict A, int64_t lda,
                                                                const float *restrict B, int64_t ldb,
                                                                float *restrict C, int64_t ldc, int acc) {
    int64_t j = 0;
    for (; j + V * BRAZE_VL <= n; j += V * BRAZE_VL) braze_mm_tile(R, V, k, A, lda, B + j, ldb, C + j, ldc, acc);
    for (; j + BRAZE_VL <= n; j += BRAZE_VL) braze_mm_tile(R, 1, k, A, lda, B + j, ldb, C + j, ldc, acc);
#if BRAZE_VL == 16
    if (j + 8 <= n) {  /* a head dim of 8 mod 16: its last 8 columns as one 8-float vector */
        braze_v8 x[6];
        for (int r = 0; r < R; r++) x[r] = acc ? braze_v8_load(C + r * ldc + j) : (braze_v8){0};
        for (int64_t p = 0; p < k; p++) {
            const braze_v8 b = braze_v8_load(B + p * ldb + j);
            for (int r = 0; r < R; r++) x[r] += A[r * lda + p] * b;
        }
        for (int r = 0; r < R; r++) braze_v8_store(C + r * ldc + j, x[r]);
        j += 8;
    }
#endif
    for (int r = 0; r < R; r++)
        for (int64_t jj = j; jj < n; jj++) {
            float y = acc ? C[r * ldc + jj] : 0.0f;
            for (int64_t p = 0; p < k; p++) y += A[r * lda + p] * B[p * ldb + jj];
            C[r * ldc + jj] = y;
        }
}

/* braze_mm: blocks of 6 rows x 2 vectors (twelve accumulators hide the FMA latency:
 * with 8-float vectors a 4-row block, eight of them, is latency-bound: 43 against 73
 * GFLOP/s on a 32 x 64 x 64 tile, znver3 at 2.45 GHz, whose peak is 78). Rows past a
 * multiple of 6 (a decoding chain kernel's few query rows): with 32 vector registers
 * (AVX-512), blocks of 4 rows x 4 vectors (sixteen accumulators); then one row at a
 * time, 4 vectors of columns at a time with 16 floats, 8 with 8 (one row's eight
 * accumulators beat a 4-row block of eight, latency-bound, by a third). */
#define BRAZE_NB (2 * BRAZE_VL)  /* braze_mm's columns per 6-row block */
static inline void braze_mm(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,
                            const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc, int acc) {
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) braze_mm_rows(6, 2, n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, acc);
#if BRAZE_VL == 16
    for (; i + 4 <= m; i += 4) braze_mm_rows(4, 4, n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, acc);
    for (; i < m; i++) braze_mm_rows(1, 4, n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, acc);
#else
    for (; i < m; i++) braze_mm_rows(1, 8, n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, acc);
#endif
}

/* dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 block: eight row loads, three
 * rounds of shuffles, eight row stores (a chain kernel's key tile is stored transposed;
 * element by element that is 4.5x slower: 2.5 against 0.55 us per 96 x 64 tile). */
#if defined(__clang__)
#define BRAZE_SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define BRAZE_SHUFFLE8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
    __builtin_shuffle(a, b, (braze_i8){i0, i1, i2, i3, i4, i5, i6, i7})
#endif
static inline void braze_transpose8(const float *restrict src, int64_t lds, float *restrict dst, int64_t ldd) {
    braze_v8 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = braze_v8_load(src + i * lds);
    for (int i = 0; i < 8; i += 2) {  /* interleave row pairs */
        t[i] = BRAZE_SHUFFLE8(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = BRAZE_SHUFFLE8(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)  /* then pairs of pairs */
        for (int h = 0; h < 2; h++) {
            u[i + 2 * h] = BRAZE_SHUFFLE8(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] = BRAZE_SHUFFLE8(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int i = 0; i < 4; i++) {  /* then the 128-bit halves */
        braze_v8_store(dst + i * ldd, BRAZE_SHUFFLE8(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11));
        braze_v8_store(dst + (i + 4) * ldd, BRAZE_SHUFFLE8(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15));
    }
}

/* The larger of a and b as a running max folds it (a if a > b, else b: a nan a is
 * passed over), lane by lane. */
static inline braze_v8 braze_v8_max(braze_v8 a, braze_v8 b) {
    const braze_i8 m = a > b;
    return (braze_v8)(((braze_i8)a & m) | ((braze_i8)b & ~m));
}
static inline braze_vf braze_vf_max(braze_vf a, braze_vf b) {
    const braze_vi m = a > b;
    return (braze_vf)(((braze_vi)a & m) | ((braze_vi)b & ~m));
}

/* A vector's lanes folded to eight by +, max or |: the vector itself with 8 floats, its
 * halves combined with 16, taken by a shuffle, in registers (through memory, as gcc
 * compiles a memcpy of a half, every fold stalls on store forwarding; immintrin.h's
 * extracts would add 0.1 s to every kernel's compile). */
#if BRAZE_VL == 16
#if defined(__clang__) || __GNUC__ >= 12
#define BRAZE_HALF(x, h) __builtin_shufflevector(x, x, 8 * h, 8 * h + 1, 8 * h + 2, 8 * h + 3, 8 * h + 4, \
                                                 8 * h + 5, 8 * h + 6, 8 * h + 7)
#else
#define BRAZE_HALF(x, h) ({ braze_v8 half_; __builtin_memcpy(&half_, (const char *)&(x) + 32 * h, 32); half_; })
#endif
static inline braze_v8 braze_vf_lo(braze_vf x) { return BRAZE_HALF(x, 0); }
static inline braze_v8 braze_vf_hi(braze_vf x) { return BRAZE_HALF(x, 1); }
static inline braze_v8 braze_vf_add8(braze_vf x) { return braze_vf_lo(x) + braze_vf_hi(x); }
static inline braze_v8 braze_vf_max8(braze_vf x) { return braze_v8_max(braze_vf_lo(x), braze_vf_hi(x)); }
static inline braze_i8 braze_vi_or8(braze_vi x) {
    return (braze_i8)braze_vf_lo((braze_vf)x) | (braze_i8)braze_vf_hi((braze_vf)x);
}
#else
static inline braze_v8 braze_vf_add8(braze_vf x) { return x; }
static inline braze_v8 braze_vf_max8(braze_vf x) { return x; }
static inline braze_i8 braze_vi_or8(braze_vi x) { return x; }
#endif

/* The sum, the largest (no lane nan) or whether any is nonzero of eight lanes: three
 * rounds of shuffles, a tree, where a loop over the lanes is eight dependent steps (gcc
 * adds an omp simd reduction's lanes that way: 16 dependent adds per reduced row). */
#define BRAZE_SWAP4(h) BRAZE_SHUFFLE8(h, h, 4, 5, 6, 7, 0, 1, 2, 3)
#define BRAZE_SWAP2(h) BRAZE_SHUFFLE8(h, h, 2, 3, 0, 1, 6, 7, 4, 5)
#define BRAZE_SWAP1(h) BRAZE_SHUFFLE8(h, h, 1, 0, 3, 2, 5, 4, 7, 6)
static inline float braze_v8_hsum(braze_v8 h) {
    h += BRAZE_SWAP4(h);
    h += BRAZE_SWAP2(h);
    h += BRAZE_SWAP1(h);
    return h[0];
}
static inline float braze_v8_hmax(braze_v8 h) {
    h = braze_v8_max(h, BRAZE_SWAP4(h));
    h = braze_v8_max(h, BRAZE_SWAP2(h));
    h = braze_v8_max(h, BRAZE_SWAP1(h));
    return h[0];
}
static inline int braze_i8_any(braze_i8 h) {
    h |= BRAZE_SWAP4(h);
    h |= BRAZE_SWAP2(h);
    h |= BRAZE_SWAP1(h);
    return h[0] != 0;
}

/* The sum of x[0, n): vector partial sums, then a tree over the lanes. A chain
 * kernel's sum of the weights it has just stored in a tile row. */
static inline float braze_row_sum(const float *restrict x, int64_t n) {
    braze_vf a = {0};
    int64_t j = 0;
    for (; j + BRAZE_VL <= n; j += BRAZE_VL) a += braze_vf_load(x + j);
    float y = braze_v8_hsum(braze_vf_add8(a));
    for (; j < n; j++) y += x[j];
    return y;
}

/* The part of braze_mm_scaled_max past its 6-row blocks: rows below ``done`` have
 * their first nb columns scaled and their first ``covered`` folded into mx and nanf
 * already; the other rows have nothing. Scale, add the bias and fold the rest, eight
 * columns at a time where there are eight. */
static inline void braze_scaled_max_rest(int64_t m, int64_t n, float *restrict C, int64_t ldc,
                                         const float *restrict s, const float *const *bias, int64_t nv,
                                         float *restrict mx, int *restrict nanf, int64_t done, int64_t nb,
                                         int64_t covered) {
    for (int64_t r = 0; r < m; r++) {
        float *c = C + r * ldc;
        const int64_t scaled = r < done ? nb : 0, folded = r < done ? covered : 0;
        if (s)
            for (int64_t j = scaled; j < n; j++) c[j] *= s[r];
        if (bias)
            for (int64_t j = folded; j < nv; j++) c[j] += bias[r][j];
        braze_v8 vm = (braze_v8){0, 0, 0, 0, 0, 0, 0, 0} - __builtin_inff();
        braze_i8 vn = (braze_i8){0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = folded;
        for (; j + 8 <= nv; j += 8) {
            const braze_v8 y = braze_v8_load(c + j);
            vm = braze_v8_max(y, vm);
            vn |= y != y;
        }
        const float hv = braze_v8_hmax(vm);
        float v = r < done ? mx[r] : -__builtin_inff();
        v = hv > v ? hv : v;
        int any = (r < done ? nanf[r] : 0) | braze_i8_any(vn);
        for (; j < nv; j++) {
            v = c[j] > v ? c[j] : v;
            any |= c[j] != c[j];
        }
        mx[r] = v;
        nanf[r] = any;
    }
}

/* braze_mm_scaled_max: C = A * B with row r multiplied by s[r] (s may be 0: no
 * scaling) plus, when bias is not 0, bias[r][j] (an additive mask or bias; read only
 * for j < nv), and over the first nv columns of each row r, mx[r] = the largest value
 * (nan values passed over; -inf if there is none) and nanf[r] = whether any is nan. A
 * chain kernel's scores tile and its row max in one pass: the max folds each 6-row
 * block while it is still in registers, instead of a second walk over the tile per
 * row (the row work, not the GEMM, is what a chain kernel loses time on). C, the max
 * and the flag are what braze_mm, then y = x * s[r] (+ bias[r][j]) and a fold over the
 * row give: bit for bit without a bias (with one, FMA contraction may round x * s +
 * bias once). The kernels call it with a literal 0 for what they do not use, so once
 * inlined the unused parts compile away.
 */
static inline void braze_mm_scaled_max(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,
                                       const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc,
                                       const float *restrict s, const float *const *bias, int64_t nv,
                                       float *restrict mx, int *restrict nanf) {
    const int64_t nb = n - n % BRAZE_NB, covered = nv - nv % BRAZE_NB < nb ? nv - nv % BRAZE_NB : nb;
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) {
        braze_vf vm[6];
        braze_vi vn[6];
        for (int r = 0; r < 6; r++) {
            vm[r] = (braze_vf){0} - __builtin_inff();
            vn[r] = (braze_vi){0};
        }
        for (int64_t j = 0; j < nb; j += BRAZE_NB) {
            braze_vf x[6][8] = {{{0}}};
            braze_mm_block(6, 2, k, A + i * lda, lda, B + j, ldb, x);
            for (int r = 0; r < 6; r++) {
                const float sr = s ? s[i + r] : 1.0f;
                braze_vf y0 = x[r][0] * sr, y1 = x[r][1] * sr;  /* x * 1 is x, nan included */
                if (j < covered) {
                    if (bias) {
                        y0 += braze_vf_load(bias[i + r] + j);
                        y1 += braze_vf_load(bias[i + r] + j + BRAZE_VL);
                    }
                    vm[r] = braze_vf_max(y1, braze_vf_max(y0, vm[r]));
                    vn[r] |= (y0 != y0) | (y1 != y1);
                }
                braze_vf_store(C + (i + r) * ldc + j, y0);
                braze_vf_store(C + (i + r) * ldc + j + BRAZE_VL, y1);
            }
        }
        for (int r = 0; r < 6; r++) {
            mx[i + r] = braze_v8_hmax(braze_vf_max8(vm[r]));
            nanf[i + r] = braze_i8_any(braze_vi_or8(vn[r]));
        }
    }
    /* rows past a multiple of 6, columns past a multiple of BRAZE_NB: braze_mm, then
     * scale, add the bias and fold what the blocks above did not */
    if (i < m) braze_mm(m - i, n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, 0);
    if (nb < n && i > 0) braze_mm(i, n - nb, k, A, lda, B + nb, ldb, C + nb, ldc, 0);
    braze_scaled_max_rest(m, n, C, ldc, s, bias, nv, mx, nanf, i, nb, covered);
}

/* 8 vectors to one: lane l is the sum of x[l]'s eight lanes (three rounds of shuffles
 * and adds, as braze_transpose8 moves them). */
static inline braze_v8 braze_v8_sum8(const braze_v8 x[8]) {
    braze_v8 t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = BRAZE_SHUFFLE8(x[2 * i], x[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14)
             + BRAZE_SHUFFLE8(x[2 * i], x[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; i++)
        u[i] = BRAZE_SHUFFLE8(t[2 * i], t[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13)
             + BRAZE_SHUFFLE8(t[2 * i], t[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return BRAZE_SHUFFLE8(u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11) + BRAZE_SHUFFLE8(u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/* Lane l of the result is the sum of x[l]'s lanes, l < 8 (16-float vectors: their
 * halves added first). */
static inline braze_v8 braze_vf_sum8(const braze_vf x[8]) {
    braze_v8 h[8];
    for (int l = 0; l < 8; l++) h[l] = braze_vf_add8(x[l]);
    return braze_v8_sum8(h);
}

/* Eight dot products along contiguous rows of k floats (k a multiple of 8): lane
 * r * (8 / R) + l is row r of A (r < R, R = 1, 2 or 4, a literal) times row l of Bt, in
 * eight accumulators reduced by braze_vf_sum8; with 16-float vectors an odd last 8 of
 * k is added by 8-float ones. Each row of Bt loaded serves the R rows of A. */
static inline __attribute__((always_inline)) braze_v8 braze_dots8(const int R, int64_t k, const float *restrict A,
                                                                  int64_t lda, const float *restrict Bt, int64_t ldbt) {
    const int C = 8 / R;
    braze_vf x[8] = {{0}};
    int64_t p = 0;
    for (; p + BRAZE_VL <= k; p += BRAZE_VL)
        for (int l = 0; l < C; l++) {
            const braze_vf b = braze_vf_load(Bt + l * ldbt + p);
            for (int r = 0; r < R; r++) x[r * C + l] += braze_vf_load(A + r * lda + p) * b;
        }
    braze_v8 y = braze_vf_sum8(x);
#if BRAZE_VL == 16
    if (p < k) {
        braze_v8 t[8] = {{0}};
        for (int l = 0; l < C; l++)
            for (int r = 0; r < R; r++) t[r * C + l] = braze_v8_load(A + r * lda + p) * braze_v8_load(Bt + l * ldbt + p);
        y += braze_v8_sum8(t);
    }
#endif
    return y;
}

/* One dot product of two contiguous rows of k floats, k a multiple of 8. */
static inline float braze_dot(int64_t k, const float *restrict a, const float *restrict b) {
    braze_vf x = {0};
    int64_t p = 0;
    for (; p + BRAZE_VL <= k; p += BRAZE_VL) x += braze_vf_load(a + p) * braze_vf_load(b + p);
    float y = braze_v8_hsum(braze_vf_add8(x));
    for (; p < k; p++) y += a[p] * b[p];
    return y;
}

/* R rows (R = 1, 2 or 4, a literal) of braze_mm_nt: 8 / R columns at a time, then the
 * columns left over one by one. */
static inline __attribute__((always_inline)) void braze_mm_nt_rows(const int R, int64_t n, int64_t k,
                                                                   const float *restrict A, int64_t lda,
                                                                   const float *restrict Bt, int64_t ldbt,
                                                                   float *restrict C, int64_t ldc) {
    const int cols = 8 / R;
    int64_t j = 0;
    for (; j + cols <= n; j += cols) {
        const braze_v8 y = braze_dots8(R, k, A, lda, Bt + j * ldbt, ldbt);
        for (int r = 0; r < R; r++)
            for (int l = 0; l < cols; l++) C[r * ldc + j + l] = y[r * cols + l];
    }
    for (; j < n; j++)
        for (int r = 0; r < R; r++) C[r * ldc + j] = braze_dot(k, A + r * lda, Bt + j * ldbt);
}

/* braze_mm_nt: C = A * Bt^T for B given by its rows' transposes, Bt n x k (row stride
 * ldbt), k a multiple of 8: C[r][j] is a dot product along the contiguous rows of A
 * and Bt (braze_dots8): four rows times two columns at a time, then two rows times
 * four, then one row times eight. A chain kernel with few rows
 * (decoding: one query, or a GQA group, per KV head) reads its keys in place this way:
 * packing a key tile transposed for braze_mm costs as much as the GEMM itself when only
 * a few rows use it (decoding at N_kv = 4096, 4 rows per KV head: 320 against 207 us,
 * harness). */
static inline void braze_mm_nt(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,
                               const float *restrict Bt, int64_t ldbt, float *restrict C, int64_t ldc) {
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) braze_mm_nt_rows(4, n, k, A + r * lda, lda, Bt, ldbt, C + r * ldc, ldc);
    for (; r + 2 <= m; r += 2) braze_mm_nt_rows(2, n, k, A + r * lda, lda, Bt, ldbt, C + r * ldc, ldc);
    for (; r < m; r++) braze_mm_nt_rows(1, n, k, A + r * lda, lda, Bt, ldbt, C + r * ldc, ldc);
}

/* braze_mm_scaled_max with B given as Bt (braze_mm_nt), computing only the first n
 * columns of C. */
static inline void braze_mm_nt_scaled_max(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,
                                          const float *restrict Bt, int64_t ldbt, float *restrict C, int64_t ldc,
                                          const float *restrict s, const float *const *bias, int64_t nv,
                                          float *restrict mx, int *restrict nanf) {
    braze_mm_nt(m, n, k, A, lda, Bt, ldbt, C, ldc);
    braze_scaled_max_rest(m, n, C, ldc, s, bias, nv, mx, nanf, 0, 0, 0);
}
