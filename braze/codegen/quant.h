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
 * kept as two int8 halves or as int16, the mode codegen/quant.py picks) and its sums per
 * chunk taken from the float values. The integer dot is AVX-512 VNNI's vpdpbusd (or
 * AVX-VNNI's) where -march=native has it, AVX2's vpmaddwd for int16 x, else a plain
 * loop gcc vectorises.
 *
 * One x row (decoding): x as int16 (quant_blocks.h) dotted block by block
 * with four W rows widened in registers (matrix-vector, reads each weight byte once). More rows in int8x2 (a batched step, a
 * prompt's prefill) take strips of W read once for every x row (with 512-bit VNNI, 16
 * x rows in one register's lanes against a broadcast W row), groups of 16 rows against
 * the same strip while it is in L1; rows of W in parallel. The other modes' many rows
 * (past BRAZE_QFEW), and float weights' (F32, F16, BF16), take the GEMM: a block of NT
 * rows of W is dequantized to float once, stored as the k x NT packed tile braze_mm
 * (tile.h) reads, and multiplied by every x row; float weights' few rows are converted
 * in registers, four W rows at a time, and dotted with float x.
 *
 * Types are entries of one table (braze/codegen/quant.py): an unpack function
 * braze_unpack_<type>(block, q, s, o) per type (quant_blocks.h, with x's quantizing
 * and one block's dots, included before this) and an instantiation of
 * BRAZE_QLINEAR(type, ...). Reading past W, x or y never happens: rows are whole
 * blocks, which the recording checks.
 *
 * The headers, in the order they are compiled (codegen/headers.py's QUANT_HEADERS):
 * quant_blocks.h; this one (the parameters, the float GEMM, the strips); quant_rows.h
 * (one x row in registers); quant_linear.h (the columns, their parallel loop with the
 * epilogue, and BRAZE_QLINEAR / BRAZE_FLINEAR).
 */
/* Rows of W (n0..n1) dequantized to float into the k x nt tile braze_mm reads. */
typedef void (*braze_rowf_fn)(const uint8_t *w, int64_t k, float *out);

#define BRAZE_QNT BRAZE_NB       /* columns of y per GEMM tile: one 6-row block's width */
#define BRAZE_QKC 256            /* k per step of the GEMM: the tile's slice stays in L1 */
#define BRAZE_QFEW 8             /* up to this many x rows: the matrix-vector path (modes 0-2, float types) */
#ifdef BRAZE_QS16
#define BRAZE_QGEMM_MIN 40       /* int8x2 without VNNI: from this many x rows the float GEMM, not the strips */
/* ... and below BRAZE_QSTRIP_MIN_##T rows, the one-row kernel once per x row (a group of
 * four W rows stays in L1 for all of them): the strips unpack their W rows into scratch
 * first, which at 2 rows cost 2-3.5x the one-row kernel twice (bench/RESULTS.md,
 * nineteenth session). Where the one-row kernel works in registers the crossing is
 * 9-16 rows, Q5_0's (its bits built as a byte vector) 5-8, the scratch types' 3-4
 * (measured with AVX2; a plain C build takes the same). */
#define BRAZE_QSTRIP_MIN_q4_0 9
#define BRAZE_QSTRIP_MIN_q4_1 9
#define BRAZE_QSTRIP_MIN_q8_0 9
#define BRAZE_QSTRIP_MIN_q4_k 9
#define BRAZE_QSTRIP_MIN_q6_k 9
#define BRAZE_QSTRIP_MIN_q5_0 5
#define BRAZE_QSTRIP_MIN_q5_1 3
#define BRAZE_QSTRIP_MIN_q2_k 3
#define BRAZE_QSTRIP_MIN_q3_k 3
#define BRAZE_QSTRIP_MIN_q5_k 3
#define BRAZE_QSTRIP_FROM(T) BRAZE_QSTRIP_MIN_##T
#else
#define BRAZE_QGEMM_MIN INT64_MAX
#define BRAZE_QSTRIP_FROM(T) 2  /* with VNNI every type's strips from 2 rows */
#endif
#define BRAZE_QG 16              /* x rows per group of the strips (mode 3): a 512-bit register's int32 lanes */
#define BRAZE_QPASS 64           /* x rows per pass of the strips over a block of columns (their sums' tile) */
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

/* The matrix-vector kernels' software prefetch, into L2 (prefetcht1): the R rows 8
 * groups ahead (8R rows), this step's share of them in address order (at..at+bytes of
 * each row, R rows: the rows are contiguous, so R x bytes from at R on). The kernels
 * read R rows side by side; prefetching each row at the place being read (R streams
 * ldw apart) streamed a 60 MB Q8_0 matrix at 11 GB/s on the AVX2 EPYC, in address
 * order at 16-17 (its DRAM's plain sequential read: 18.7), and a decoding step of the
 * Q8_0 file went from 15 to 10 ms (bench/RESULTS.md, nineteenth session). With none,
 * 6 GB/s; into L1, the L1's few miss buffers fill. */
static inline __attribute__((always_inline)) void braze_qpf(const uint8_t *w, int64_t ldw, const int R, int64_t at,
                                                            const int bytes) {
    const uint8_t *g = w + 8 * R * ldw + at * R;
    for (int l = 0; l < R * bytes; l += 64) __builtin_prefetch(g + l, 0, 2);
}

/* The GEMM path's tile: NT rows of W, already dequantized to float
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

/* the n (or fewer, at the end) of m items from i0: a block of columns, a group or pass of rows */
static inline int64_t braze_q_span(int64_t m, int64_t i0, int64_t n) { return m - i0 < n ? m - i0 : n; }

/* Thread-private scratch, grown as needed and kept (a decoding step allocates nothing
 * after the first). */
static inline void *braze_q_scratch(int slot, size_t bytes) {
    static _Thread_local void *buf[8];
    static _Thread_local size_t have[8];
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

/* The GEMM path (float weights' many rows; the quantized types' in modes 0-2, which
 * only tests build): `rowf` dequantizes one W row to float. Each weight's
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
#elif defined(BRAZE_VNNI) || defined(BRAZE_AVX2)
/* 256 bits: AVX-VNNI's two vpdpbusd a block, or without VNNI (BRAZE_QS16) x as int16
 * and braze_x16_dot's vpmaddwd */
#define BRAZE_QS 32
typedef __m256 braze_qsv;
typedef __m256i braze_qsi;
static inline braze_qsi braze_qs_ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline braze_qsv braze_qs_scale(const float *s, const int CH) {
    return CH == 16 ? _mm256_set_m128(_mm_broadcast_ss(s + 1), _mm_broadcast_ss(s)) : _mm256_broadcast_ss(s);
}
static inline braze_qsv braze_qs_fma(braze_qsv a, braze_qsv b, braze_qsv c) { return _mm256_fmadd_ps(a, b, c); }
static inline float braze_qs_sum(braze_qsv a) { return braze_qacc_sum(a); }
#ifdef BRAZE_QS16
static inline braze_qsv braze_qs_dot(braze_qsi q, braze_qsi xa, braze_qsi xb) {
    return _mm256_cvtepi32_ps(braze_x16_dot(q, xa, xb));
}
/* x row's (int16) 32 values from e, in two registers */
static inline void braze_qs_ldx(const int8_t *row, int64_t kp, int64_t e, braze_qsi *xh, braze_qsi *xl) {
    (void)kp; *xh = braze_qs_ld(row + 2 * e); *xl = braze_qs_ld(row + 2 * e + 32);
}
#define BRAZE_QSTRIP_M 2  /* 16 registers: 4 x 2 sums (4 x 4 spilled) */
#else
static inline braze_qsv braze_qs_dot(braze_qsi q, braze_qsi xh, braze_qsi xl) {
    __m256i p = BRAZE_DPBUSD(_mm256_setzero_si256(), q, xh);
    return _mm256_cvtepi32_ps(BRAZE_DPBUSD(_mm256_slli_epi32(p, 7), q, xl));
}
/* x row's (hi and lo halves kp apart) 32 values from e */
static inline void braze_qs_ldx(const int8_t *row, int64_t kp, int64_t e, braze_qsi *xh, braze_qsi *xl) {
    *xh = braze_qs_ld(row + e); *xl = braze_qs_ld(row + kp + e);
}
#define BRAZE_QSTRIP_M 4  /* x rows per pass over a strip: R x M sums and R rows of q in registers */
#endif
#else
/* plain C: x as int16 (BRAZE_QS16), the two chunks of 16 of a block of 32 */
#define BRAZE_QS 32
typedef float braze_qsv __attribute__((vector_size(8)));
typedef const void *braze_qsi;
static inline braze_qsi braze_qs_ld(const void *p) { return p; }
static inline braze_qsv braze_qs_dot(braze_qsi q, braze_qsi xv, braze_qsi unused) {
    (void)unused;
    braze_qsv r;
    for (int c = 0; c < 2; c++) r[c] = (float)braze_x16_sum16((const uint8_t *)q, (const int16_t *)xv, c);
    return r;
}
static inline void braze_qs_ldx(const int8_t *row, int64_t kp, int64_t e, braze_qsi *xh, braze_qsi *xl) {
    (void)kp; *xh = row + 2 * e; *xl = NULL;
}
#define BRAZE_QSTRIP_M 4
static inline braze_qsv braze_qs_scale(const float *s, const int CH) { return (braze_qsv){s[0], s[CH == 16]}; }
static inline braze_qsv braze_qs_fma(braze_qsv a, braze_qsv b, braze_qsv c) { return a * b + c; }
static inline float braze_qs_sum(braze_qsv a) { return a[0] + a[1]; }
#endif
#define BRAZE_QSTRIP_R 4  /* rows of W per strip */
#ifndef BRAZE_QSTRIP_M
#define BRAZE_QSTRIP_M 4  /* x rows per pass over a strip (512-bit VNNI: its own tile) */
#endif
static inline int64_t braze_qs_pad(int64_t k) { return (k + BRAZE_QS - 1) / BRAZE_QS * BRAZE_QS; }

/* x's row r (at xr) as the dots of MODE read it, once per call: its sums per chunk of CH
 * (for the strips lane r % BRAZE_QG of its group's, xs[(g * nch + c) * BRAZE_QG + ...];
 * else row-major), and its int8, int8x2 (hi then lo, rows padded with zeros to a whole
 * step; one row always as int16, the strips' too where BRAZE_QS16) or int16 blocks
 * of 32 and their scales dx */
static inline __attribute__((always_inline)) void braze_qx_row(const int MODE, const int CH, int strips, int nat,
        int64_t r, const float *xr, int64_t k, float *xs, float *dx, char *xq) {
    const int64_t kx = MODE == 3 ? braze_qs_pad(k) : k, nch = k / CH, xsz = MODE == 1 ? 1 : 2;
    float *sums = strips ? xs + r / BRAZE_QG * BRAZE_QG * nch + r % BRAZE_QG : xs + r * nch;
    braze_chunk_sums(xr, k, CH, sums, strips ? BRAZE_QG : 1);
#ifdef BRAZE_QS16
    const int x16 = 1;
#else
    const int x16 = !strips;  /* the strips' x: int8 halves */
#endif
    if (MODE == 3 && x16) {  /* int16, the same integers */
        int16_t *v = (int16_t *)xq + r * kx;
        braze_quantize_x16(xr, k, v, dx + r * (kx / 32), nat);
        memset(v + k, 0, (size_t)(kx - k) * 2); memset(dx + r * (kx / 32) + k / 32, 0, (size_t)(kx - k) / 32 * 4);
    } else if (MODE == 1 || MODE == 3) {
        int8_t *hi = (int8_t *)xq + r * kx * xsz, *lo = MODE == 3 ? hi + kx : NULL;
        braze_quantize_row(xr, k, hi, lo, dx + r * (kx / 32));
        if (lo) { memset(hi + k, 0, (size_t)(kx - k)); memset(lo + k, 0, (size_t)(kx - k));
                  memset(dx + r * (kx / 32) + k / 32, 0, (size_t)(kx - k) / 32 * 4); }
    }
    if (MODE == 2) braze_quantize_row16(xr, k, (int16_t *)xq + r * k, dx + r * (k / 32));
}

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
/* Past 16 rows, groups of BRAZE_QG = 16 (P = 1, the last one's P by its own rows), each
 * laid out as above, braze_qs_xstep bytes apart (its dx at the same place in floats). */
static inline int64_t braze_qs_xstep(int64_t kp) { return kp / 32 * (1024 + 64); }
static inline int64_t braze_qs_dstep(int64_t kp) { return braze_qs_xstep(kp) / 4; }
/* one group of mg rows (of 16 / P) from src (rows 2 kp apart, their scales sd nb apart)
 * laid out at xg (P a literal: the copies are moves, not calls) */
static inline __attribute__((always_inline)) void braze_qx_lay(const int P, int64_t mg, int64_t kp, const int8_t *src,
        const float *sd, int8_t *restrict xg) {
    const int64_t nb = kp / 32;
    float *dv = (float *)(xg + nb * 1024);
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < 16 / P; i++) {
            for (int h = 0; h < 2; h++)      /* hi, lo */
                for (int j = 0; j < 8 / P; j++) {
                    int8_t *dst = xg + b * (1024 / P) + (h * (8 / P) + j) * 64 + 4 * P * i;
                    if (i < mg) memcpy(dst, src + i * 2 * kp + h * kp + 32 * b + 4 * P * j, (size_t)(4 * P));
                    else memset(dst, 0, (size_t)(4 * P));
                }
            for (int l = 0; l < P; l++) dv[b * 16 + P * i + l] = i < mg ? sd[i * nb + b] : 0.0f;
        }
}
static inline void braze_qs_prepare(int64_t m, int64_t kp, const char **xq, const float **dx) {
    const int64_t nb = kp / 32, groups = (m + BRAZE_QG - 1) / BRAZE_QG;
    int8_t *x0 = (int8_t *)braze_q_scratch(6, (size_t)(groups * braze_qs_xstep(kp)));
    for (int64_t g = 0; g < groups; g++) {
        const int64_t mg = braze_q_span(m, g * BRAZE_QG, BRAZE_QG);
        const int8_t *src = (const int8_t *)*xq + g * BRAZE_QG * 2 * kp;
        const float *sd = *dx + g * BRAZE_QG * nb;
        int8_t *xg = x0 + g * braze_qs_xstep(kp);
        switch (braze_qx_p(mg)) {
        case 8: braze_qx_lay(8, mg, kp, src, sd, xg); break;
        case 4: braze_qx_lay(4, mg, kp, src, sd, xg); break;
        case 2: braze_qx_lay(2, mg, kp, src, sd, xg); break;
        default: braze_qx_lay(1, mg, kp, src, sd, xg);
        }
    }
    *xq = (const char *)x0;
    *dx = (const float *)(x0 + nb * 1024);
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
    for (int64_t r0 = 0; r0 < m; r0 += BRAZE_QG) {  /* a group of x rows at a time, W's rows from L1 after the first */
        const int64_t mg = braze_q_span(m, r0, BRAZE_QG);
        const int8_t *xg = (const int8_t *)xq + r0 / BRAZE_QG * braze_qs_xstep(kp);
        const float *dg = dx + r0 / BRAZE_QG * braze_qs_dstep(kp);
        float *og = out + r0 * BRAZE_QEPN;
        switch (braze_qx_p(mg)) {  /* P a literal: the loops over registers unroll */
        case 8: braze_qx_tile(R, 8, CH, KIND, mg, kp, q, ldq, bstep, s, xg, dg, og); break;
        case 4: braze_qx_tile(R, 4, CH, KIND, mg, kp, q, ldq, bstep, s, xg, dg, og); break;
        case 2: braze_qx_tile(R, 2, CH, KIND, mg, kp, q, ldq, bstep, s, xg, dg, og); break;
        default: braze_qx_tile(R, 1, CH, KIND, mg, kp, q, ldq, bstep, s, xg, dg, og);
        }
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
/* a group of BRAZE_QG rows: its hi and lo bytes, and its scales */
static inline int64_t braze_qs_xstep(int64_t kp) { return BRAZE_QG * 2 * kp; }
static inline int64_t braze_qs_dstep(int64_t kp) { return BRAZE_QG * (kp / 32); }
/* R rows of q (kp bytes apart, scales s kp / CH apart) against MT x rows (hi then lo
 * bytes, or int16, 2 kp bytes apart; dx kp / 32 apart): dot[x * R + r], without the offsets */
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
            braze_qsi xh, xl;
            braze_qs_ldx(xq + 2 * x * kp, kp, e, &xh, &xl);
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
#if BRAZE_QSTRIP_M >= 4
        if (mt == 4) braze_qs_tile(R, 4, CH, kp, q, s, xr, dr, dot);
        else if (mt == 3) braze_qs_tile(R, 3, CH, kp, q, s, xr, dr, dot);
        else
#endif
        if (mt == 2) braze_qs_tile(R, 2, CH, kp, q, s, xr, dr, dot);
        else braze_qs_tile(R, 1, CH, kp, q, s, xr, dr, dot);
        for (int64_t x = 0; x < mt; x++)
            for (int r = 0; r < R; r++) out[(x0 + x) * BRAZE_QEPN + r] = dot[x * R + r];
    }
}
#define BRAZE_QSTRIPS_direct BRAZE_QSTRIPS_unpack  /* no 512-bit VNNI: every type unpacks */
#endif

/* out[x * BRAZE_QEPN + r] += the offsets of R W rows (o, nch chunks each) for m x
 * rows: o times x's chunk sums, stored chunk-major per group of BRAZE_QG rows
 * (xs[(g * nch + c) * BRAZE_QG + x % BRAZE_QG]) so that a chunk's sums are one vector, a
 * lane per x row (a dot over chunks per pair of rows, or a scalar loop over x rows, was
 * a fifth to a quarter of the time). */
typedef float braze_qsx __attribute__((vector_size(4 * BRAZE_QG), aligned(4), may_alias));
static inline __attribute__((always_inline)) void braze_qs_offsets(const int R, int64_t m, int64_t nch,
        const float *restrict o, const float *restrict xs, float *restrict out) {
    for (int64_t r0 = 0; r0 < m; r0 += BRAZE_QG) {
        const float *xg = xs + r0 * nch;
        braze_qsx off[BRAZE_QSTRIP_R];
        for (int r = 0; r < R; r++) off[r] = (braze_qsx){0};
        for (int64_t c = 0; c < nch; c++) {
            braze_qsx v = *(const braze_qsx *)(xg + c * BRAZE_QG);
            for (int r = 0; r < R; r++) off[r] += o[r * nch + c] * v;
        }
        for (int64_t x = r0; x < m && x < r0 + BRAZE_QG; x++)
            for (int r = 0; r < R; r++) out[x * BRAZE_QEPN + r] += off[r][x - r0];
    }
}

/* Columns j0..j0+nj of NW weights for the m x rows from r0 (xq, dx, xs as braze_qlinear
 * and braze_qs_prepare lay them out: r0 starts a group), BRAZE_QSTRIP_R rows of W per
 * strip (braze_qstrip_##T, as the type reads W), into t[i][x * BRAZE_QEPN + j - j0]. */
#define BRAZE_QSTRIPCOLS(T, CH)                                                                               \
static inline __attribute__((always_inline)) void braze_qstrips_##T(const int NW, int64_t m, int64_t r0,     \
        int64_t j0, int64_t nj, int64_t k, const uint8_t *const *w, int64_t ldw, const float *x, int64_t lda,\
        const char *xq, int64_t xsz, const float *dx, const float *xs, float *const *t) {                   \
    (void)x; (void)lda; (void)xsz;                                                                           \
    const int64_t kp = braze_qs_pad(k);                                                                      \
    xq += r0 / BRAZE_QG * braze_qs_xstep(kp); dx += r0 / BRAZE_QG * braze_qs_dstep(kp); xs += r0 * (k / CH); \
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
            /* 8R rows ahead into L2: this walks one row at a time, in address order already */             \
            for (int l = 0; l < TS; l += 64) __builtin_prefetch(w + (r + 8 * R) * ldw + b * TS + l, 0, 2);   \
            braze_unpack_##T(w + r * ldw + b * TS, qr + b * BS, sr + b * (BS / CH), o + r * nch + b * (BS / CH)); \
        }                                                                                                    \
        if (kp > k) { memset(qr + k, 0, (size_t)(kp - k)); memset(sr + nch, 0, (size_t)(kp / CH - nch) * 4); } \
    }                                                                                                        \
    braze_qs_dots(R, CH, 0, m, kp, q, kp, 32, s, xq, dx, out);                                               \
    braze_qs_offsets(R, m, nch, o, xs, out);                                                                 \
}
