/* braze's quantized matmul assembled per type, last of the quant headers (quant_blocks.h,
 * quant.h, quant_rows.h, this): the few-rows columns, the parallel column loop with
 * the epilogue, and BRAZE_QLINEAR / BRAZE_FLINEAR, the one instantiation per type that
 * codegen/quant.py's table writes.
 */
/* The few-rows path of every type, over its braze_mv_##T (R rows of W against one x row:
 * x float when MODE is 0, else xq, quantized, with scales dx and chunk sums xs):
 * braze_mvcols_##T takes columns j0..j0+nj of NW weights (NW a literal where inlined),
 * four rows of W at a time, each against every x row, into t[i][r * BRAZE_QEPN + j - j0];
 * BRAZE_QCOLS(NAME, COLS) runs blocks of columns in parallel, by COLS (braze_mvcols_##T,
 * or braze_qstrips_##T), and the epilogue over each. */
#define BRAZE_MVCOLS(T, MODE, CH)                                                                            \
static inline __attribute__((always_inline)) void braze_mvcols_##T(const int NW, int64_t m, int64_t r0,     \
        int64_t j0, int64_t nj, int64_t k, const uint8_t *const *w, int64_t ldw, const float *x, int64_t lda,\
        const char *xq, int64_t xsz, const float *dx, const float *xs, float *const *t) {                   \
    for (int64_t j = j0; j < j0 + nj; j += 4)                                                                \
        for (int i = 0; i < NW; i++)                                                                         \
            for (int64_t r = r0; r < r0 + m; r++) {                                                          \
                const int64_t kx = MODE == 3 ? braze_qs_pad(k) : k;  /* x's rows as braze_qlinear pads them */ \
                const void *xr = MODE == 0 ? (const void *)(x + r * lda) : (const void *)(xq + r * kx * xsz); \
                const float *dr = dx ? dx + r * (kx / 32) : dx, *sr = xs ? xs + r * (k / CH) : xs;           \
                float *out = t[i] + (r - r0) * BRAZE_QEPN + (j - j0);                                        \
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
    _Pragma("omp parallel num_threads(par ? nthreads : 1)")                                                 \
    {   /* each thread's tile of sums, once per call */                                                      \
        float *t = (float *)braze_q_scratch(7, (size_t)nw * BRAZE_QPASS * BRAZE_QEPN * 4), *acc[BRAZE_QMAXW]; \
        for (int i = 0; i < nw; i++) acc[i] = t + i * BRAZE_QPASS * BRAZE_QEPN;                              \
        _Pragma("omp for schedule(static)")                                                                  \
        for (int64_t j0 = 0; j0 < n; j0 += cols) {                                                           \
            const int64_t nj = braze_q_span(n, j0, cols);                                                    \
            /* the x rows a pass at a time (the sums' tile); the columns' W from L2 after the first */      \
            for (int64_t r0 = 0; r0 < m; r0 += BRAZE_QPASS) {                                                \
                const int64_t mp = braze_q_span(m, r0, BRAZE_QPASS);                                         \
                if (nw == 1) COLS(1, mp, r0, j0, nj, k, w, ldw, x, lda, xq, xsz, dx, xs, acc);               \
                else COLS(nw, mp, r0, j0, nj, k, w, ldw, x, lda, xq, xsz, dx, xs, acc);                      \
                ep(args, r0, mp, j0, nj, acc, BRAZE_QEPN);                                                   \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
}

/* A quantized type's kernel: in int8x2 (mode 3) one row by the matrix-vector dot, more by
 * the strips; in the other modes few rows by the matrix-vector dot, many by the GEMM. */
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
        braze_qpf(w, ldw, R, b * TS, TS);                                                                    \
        for (int r = 0; r < R; r++) braze_unpack_##T(w + r * ldw + b * TS, q[r], s[r], o[r]);                \
        for (int r = 0; r < R; r++) {                                                                        \
            const float *d = dx + b * (BS / 32);                                                             \
            braze_offsets(BS / CH, o[r], xs + b * (BS / CH), &offv[r], &off[r]);                             \
            if (MODE == 0) braze_fblock(BS, CH, q[r], s[r], (const float *)x + b * BS, &accf[r]);            \
            else if (MODE == 1) braze_qblock(BS, CH, q[r], s[r], (const int8_t *)x + b * BS, d, &acci[r]);   \
            else if (MODE == 3) braze_qblock16(BS, CH, q[r], s[r], (const int16_t *)x + b * BS, d, &acci[r]); \
            else braze_wblock(BS, CH, q[r], s[r], (const int16_t *)x + b * BS, d, &accf[r]);                 \
        }                                                                                                    \
    }                                                                                                        \
    for (int r = 0; r < R; r++)                                                                              \
        y[r] = (MODE == 1 || MODE == 3 ? braze_qacc_sum(acci[r]) : braze_v8_hsum(braze_vf_add8(accf[r])))    \
               + off[r] + braze_v8_hsum(offv[r]);                                                            \
}                                                                                                            \
BRAZE_MVCOLS(T, MODE, CH)                                                                                    \
BRAZE_QSTRIPS_##WREAD(T, BS, TS, CH)                                                                         \
BRAZE_QSTRIPCOLS(T, CH)                                                                                      \
BRAZE_QCOLS(braze_qcols_##T, braze_mvcols_##T)                                                              \
BRAZE_QCOLS(braze_qscols_##T, braze_qstrips_##T)                                                             \
static void braze_qlinear_##T(int64_t m, int64_t n, int64_t k, const float *x, int64_t lda,                 \
        const uint8_t *const *w, int nw, int64_t ldw, braze_qep_fn ep, braze_qpro_fn pro, void **args,       \
        int64_t nthreads) {                                                                                  \
    if (pro) { x = braze_qprologue(m, k, pro, args); lda = k; }                                              \
    /* many rows: the GEMM on W dequantized to float, but in mode 3, where the strips (below) \
     * take every x row: 1.4-2x the GEMM's speed at 128 rows, 2-5x at 9-16 (bench/RESULTS.md); \
     * without VNNI (int16 dots) only to BRAZE_QGEMM_MIN rows: 1.5-2x the GEMM at 16, 0.6x at 128 */  \
    if ((MODE != 3 || m >= BRAZE_QGEMM_MIN) && m > BRAZE_QFEW) { braze_qlinear_gemm(m, n, k, x, lda, w, nw, ldw, ep, args, nthreads, braze_rowf_##T); return; } \
    /* x, once per call: sums per chunk for the offsets; int8/int16 blocks and their scales */             \
    const int64_t xsz = MODE == 1 ? 1 : 2;  /* bytes of x per element: int8x2 keeps hi then lo per row */    \
    const int64_t kx = MODE == 3 ? braze_qs_pad(k) : k;  /* the strips' rows are padded with zeros */        \
    /* x's chunk sums, per row; for the strips (mode 3, m > 1) chunk-major, BRAZE_QG lanes a chunk */        \
    const int strips = MODE == 3 && m >= BRAZE_QSTRIP_FROM(T); const int64_t nch = k / CH;                                                     \
    const int64_t nxs = strips ? (m + BRAZE_QG - 1) / BRAZE_QG * BRAZE_QG : m;                               \
    float *xs = (float *)braze_q_scratch(0, (size_t)nxs * nch * 4 + (size_t)m * ((kx / 32) * 4 + kx * xsz)); \
    float *dx = xs + nxs * nch;                                                                              \
    if (strips) memset(xs, 0, (size_t)nxs * nch * 4);  /* the lanes past m */                              \
    char *xq = (char *)(dx + m * (kx / 32));                                                                 \
    for (int64_t r = 0; r < m; r++)                                                                          \
        braze_qx_row(MODE, CH, strips, !strips && BRAZE_X16NAT_##T, r, x + r * lda, k, xs, dx, xq);           \
    /* one row: braze_mv, its unpack in registers; more (mode 3): the strips, each in its own parallel loop */ \
    if (strips) {                                                                                            \
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
        if ((i * es) % 64 == 0) braze_qpf(w, ldw, R, i * es, 64);                                            \
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
