/* braze's small matrix-multiply tile, for chain kernels (a matmul, row work, a matmul:
 * attention written as user code). Included in every generated translation unit.
 *
 * braze_mm: C = A * B (acc = 0) or C += A * B (acc = 1), float32, A m x k (row stride lda), B k x n (row stride
 * ldb), C m x n (row stride ldc), every row contiguous. Register-blocked: 6 rows of C
 * times 16 columns live in twelve 8-float vectors while k runs, so each element of B
 * loaded is used 6 times and each element of A broadcast is used 16 times. GCC vector
 * types, not intrinsics: -march=native picks AVX2 or AVX-512, and -ffp-contract=fast
 * turns each c += a * b into one FMA. Rows past a multiple of 6 and columns past a
 * multiple of 16 take narrower loops. The tiles are small (a few tens of KiB) and stay
 * in L1/L2; what BLAS adds beyond this (packing for L3, many-core blocking) does not
 * pay at these sizes.
 */
#include <stdint.h>
#include <stdlib.h>

typedef float braze_v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t braze_i8 __attribute__((vector_size(32), aligned(4), may_alias));

static inline braze_v8 braze_v8_load(const float *p) { return *(const braze_v8 *)p; }
static inline void braze_v8_store(float *p, braze_v8 v) { *(braze_v8 *)p = v; }

static inline braze_v8 braze_v8_init(const float *p, int acc) {
    if (acc) return braze_v8_load(p);
    braze_v8 z = {0, 0, 0, 0, 0, 0, 0, 0};
    return z;
}

/* One row of C: 64 columns in eight accumulators (as many FMAs in flight as the two
 * FMA pipes times their latency need), then 8-column steps, then single columns.
 * Rows past a multiple of 6 take it: a decoding chain kernel's few query rows, where it
 * beats a 4 x 16 block (eight accumulators fed by four broadcasts and two loads per
 * step, latency-bound) by about a third. */
static inline void braze_mm_row(int64_t n, int64_t k, const float *restrict a, const float *restrict B,
                                int64_t ldb, float *restrict c, int acc) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        braze_v8 x[8];
        for (int l = 0; l < 8; l++) x[l] = braze_v8_init(c + j + 8 * l, acc);
        for (int64_t p = 0; p < k; p++) {
            const float s = a[p];
            for (int l = 0; l < 8; l++) x[l] += s * braze_v8_load(B + p * ldb + j + 8 * l);
        }
        for (int l = 0; l < 8; l++) braze_v8_store(c + j + 8 * l, x[l]);
    }
    for (; j + 8 <= n; j += 8) {
        braze_v8 x = braze_v8_init(c + j, acc);
        for (int64_t p = 0; p < k; p++) x += a[p] * braze_v8_load(B + p * ldb + j);
        braze_v8_store(c + j, x);
    }
    for (; j < n; j++) {
        float y = acc ? c[j] : 0.0f;
        for (int64_t p = 0; p < k; p++) y += a[p] * B[p * ldb + j];
        c[j] = y;
    }
}

/* 6 rows x 16 columns: twelve accumulators hide the FMA latency (4 x 16, eight of
 * them, is latency-bound: 43 against 73 GFLOP/s on a 32 x 64 x 64 tile, znver3 at
 * 2.45 GHz, whose peak is 78). x += the block of A's 6 rows times B's 16 columns. */
static inline __attribute__((always_inline)) void braze_mm_block6(int64_t k, const float *restrict A, int64_t lda,
                                                                  const float *restrict B, int64_t ldb,
                                                                  braze_v8 x[6][2]) {
    for (int64_t p = 0; p < k; p++) {
        const braze_v8 b0 = braze_v8_load(B + p * ldb), b1 = braze_v8_load(B + p * ldb + 8);
        for (int r = 0; r < 6; r++) {
            const float s = A[r * lda + p];
            x[r][0] += s * b0;
            x[r][1] += s * b1;
        }
    }
}

static inline void braze_mm_rows6(int64_t n, int64_t k, const float *restrict A, int64_t lda,
                                  const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc, int acc) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        braze_v8 x[6][2];
        for (int r = 0; r < 6; r++) {
            x[r][0] = braze_v8_init(C + r * ldc + j, acc);
            x[r][1] = braze_v8_init(C + r * ldc + j + 8, acc);
        }
        braze_mm_block6(k, A, lda, B + j, ldb, x);
        for (int r = 0; r < 6; r++) {
            braze_v8_store(C + r * ldc + j, x[r][0]);
            braze_v8_store(C + r * ldc + j + 8, x[r][1]);
        }
    }
    if (j < n)
        for (int r = 0; r < 6; r++) braze_mm_row(n - j, k, A + r * lda, B + j, ldb, C + r * ldc + j, acc);
}

static inline void braze_mm(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,
                            const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc, int acc) {
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) braze_mm_rows6(n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, acc);
    for (; i < m; i++) braze_mm_row(n, k, A + i * lda, B, ldb, C + i * ldc, acc);
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

/* The part of braze_mm_scaled_max past its 6 x 16 blocks: rows below ``done`` have
 * their first n16 columns scaled and their first ``covered`` folded into mx and nanf
 * already; the other rows have nothing. Scale, add the bias and fold the rest, eight
 * columns at a time where there are eight. */
static inline void braze_scaled_max_rest(int64_t m, int64_t n, float *restrict C, int64_t ldc,
                                         const float *restrict s, const float *const *bias, int64_t nv,
                                         float *restrict mx, int *restrict nanf, int64_t done, int64_t n16,
                                         int64_t covered) {
    for (int64_t r = 0; r < m; r++) {
        float *c = C + r * ldc;
        const int64_t scaled = r < done ? n16 : 0, folded = r < done ? covered : 0;
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
        float v = r < done ? mx[r] : -__builtin_inff();
        int any = r < done ? nanf[r] : 0;
        for (int l = 0; l < 8; l++) {
            v = vm[l] > v ? vm[l] : v;
            any |= vn[l] != 0;
        }
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
 * chain kernel's scores tile and its row max in one pass: the max folds each 6 x 16
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
    const int64_t n16 = n - n % 16, covered = nv - nv % 16 < n16 ? nv - nv % 16 : n16;
    int64_t i = 0;
    for (; i + 6 <= m; i += 6) {
        braze_v8 vm[6];
        braze_i8 vn[6];
        for (int r = 0; r < 6; r++) {
            vm[r] = (braze_v8){0, 0, 0, 0, 0, 0, 0, 0} - __builtin_inff();
            vn[r] = (braze_i8){0, 0, 0, 0, 0, 0, 0, 0};
        }
        for (int64_t j = 0; j < n16; j += 16) {
            braze_v8 x[6][2] = {{{0}}};
            braze_mm_block6(k, A + i * lda, lda, B + j, ldb, x);
            for (int r = 0; r < 6; r++) {
                const float sr = s ? s[i + r] : 1.0f;
                braze_v8 y0 = x[r][0] * sr, y1 = x[r][1] * sr;  /* x * 1 is x, nan included */
                if (j < covered) {
                    if (bias) {
                        y0 += braze_v8_load(bias[i + r] + j);
                        y1 += braze_v8_load(bias[i + r] + j + 8);
                    }
                    vm[r] = braze_v8_max(y1, braze_v8_max(y0, vm[r]));
                    vn[r] |= (y0 != y0) | (y1 != y1);
                }
                braze_v8_store(C + (i + r) * ldc + j, y0);
                braze_v8_store(C + (i + r) * ldc + j + 8, y1);
            }
        }
        for (int r = 0; r < 6; r++) {
            float v = -__builtin_inff();
            int any = 0;
            for (int l = 0; l < 8; l++) {
                v = vm[r][l] > v ? vm[r][l] : v;
                any |= vn[r][l] != 0;
            }
            mx[i + r] = v;
            nanf[i + r] = any;
        }
    }
    /* rows past a multiple of 6, columns past a multiple of 16: braze_mm, then scale, add
     * the bias and fold what the blocks above did not */
    if (i < m) braze_mm(m - i, n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, 0);
    if (n16 < n && i > 0) braze_mm(i, n - n16, k, A, lda, B + n16, ldb, C + n16, ldc, 0);
    braze_scaled_max_rest(m, n, C, ldc, s, bias, nv, mx, nanf, i, n16, covered);
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

/* One dot product of two contiguous rows of k floats, k a multiple of 8. */
static inline float braze_dot(int64_t k, const float *restrict a, const float *restrict b) {
    braze_v8 x = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t p = 0; p < k; p += 8) x += braze_v8_load(a + p) * braze_v8_load(b + p);
    float y = 0.0f;
    for (int l = 0; l < 8; l++) y += x[l];
    return y;
}

/* braze_mm_nt: C = A * Bt^T for B given by its rows' transposes, Bt n x k (row stride
 * ldbt), k a multiple of 8: C[r][j] is a dot product along the contiguous rows of A
 * and Bt, in eight accumulators reduced by braze_v8_sum8: two rows times four columns
 * at a time (each row of Bt loaded serves both), an odd last row eight columns at a
 * time, the columns left over one by one. A chain kernel with few rows (decoding: one
 * query, or a GQA group, per KV head) reads its keys in place this way: packing a key
 * tile transposed for braze_mm costs as much as the GEMM itself when only a few rows
 * use it (decoding at N_kv = 4096, 4 rows per KV head: 320 against 207 us, harness). */
static inline void braze_mm_nt(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,
                               const float *restrict Bt, int64_t ldbt, float *restrict C, int64_t ldc) {
    int64_t r = 0;
    for (; r + 2 <= m; r += 2) {
        const float *a = A + r * lda;
        float *c = C + r * ldc;
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            braze_v8 x[8] = {{0}};
            for (int64_t p = 0; p < k; p += 8) {
                const braze_v8 a0 = braze_v8_load(a + p), a1 = braze_v8_load(a + lda + p);
                for (int l = 0; l < 4; l++) {
                    const braze_v8 b = braze_v8_load(Bt + (j + l) * ldbt + p);
                    x[l] += a0 * b;
                    x[4 + l] += a1 * b;
                }
            }
            const braze_v8 y = braze_v8_sum8(x);
            for (int l = 0; l < 4; l++) {
                c[j + l] = y[l];
                c[ldc + j + l] = y[4 + l];
            }
        }
        for (; j < n; j++) {
            c[j] = braze_dot(k, a, Bt + j * ldbt);
            c[ldc + j] = braze_dot(k, a + lda, Bt + j * ldbt);
        }
    }
    for (; r < m; r++) {
        const float *a = A + r * lda;
        float *c = C + r * ldc;
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            braze_v8 x[8] = {{0}};
            for (int64_t p = 0; p < k; p += 8) {
                const braze_v8 av = braze_v8_load(a + p);
                for (int l = 0; l < 8; l++) x[l] += av * braze_v8_load(Bt + (j + l) * ldbt + p);
            }
            braze_v8_store(c + j, braze_v8_sum8(x));
        }
        for (; j < n; j++) c[j] = braze_dot(k, a, Bt + j * ldbt);
    }
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
