/* How steady this machine is for a program with no allocation, no garbage collector and
 * no Python: a fixed workload the size of a decoding step, timed 256 times a round,
 * P99/P50 per round as bench/llm.py reports braze's step. Two workloads: "memory"
 * streams 100 MB with one 512-bit VNNI dot per 64 bytes (bound by DRAM, as a decoding
 * step's weight reads are), "compute" does four dependent dots per 64 bytes (bound by
 * the core: the same bytes come 4x slower than DRAM gives them).
 *
 *   gcc -O2 -march=native bench/baselines/steady.c -o /tmp/steady   (AVX-512 VNNI)
 *   /tmp/steady memory|compute [ROUNDS=3]
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct(const double *sorted, int n, double q) {  /* linear between ranks, as numpy's */
    const double k = q * (n - 1);
    const int f = (int)k;
    return f + 1 < n ? sorted[f] * (1 - (k - f)) + sorted[f + 1] * (k - f) : sorted[f];
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "memory") && strcmp(argv[1], "compute"))) {
        fprintf(stderr, "usage: %s memory|compute [ROUNDS]\n", argv[0]);
        return 2;
    }
    const int compute = !strcmp(argv[1], "compute"), rounds = argc > 2 ? atoi(argv[2]) : 3;
    const size_t n = (size_t)100 << 20;
    uint8_t *p = aligned_alloc(64, n);
    if (!p) return 1;
    memset(p, 1, n);
    const __m512i x = _mm512_set1_epi8(3);
    for (int r = 0; r < rounds; r++) {
        double ms[256];
        __m512i acc = _mm512_setzero_si512();
        for (int s = 0; s < 256; s++) {
            const double t = now_ms();
            for (size_t i = 0; i < n; i += 64) {
                const __m512i w = _mm512_load_si512(p + i);
                acc = _mm512_dpbusd_epi32(acc, w, x);
                if (compute) {
                    acc = _mm512_dpbusd_epi32(acc, w, x);
                    acc = _mm512_dpbusd_epi32(acc, w, x);
                    acc = _mm512_dpbusd_epi32(acc, w, x);
                }
            }
            ms[s] = now_ms() - t;
        }
        qsort(ms, 256, sizeof ms[0], cmp);
        printf("%s round %d: P50 %.3f ms P99 %.3f P99/P50 %.3f max %.3f (sum %d)\n", argv[1], r, pct(ms, 256, .5),
               pct(ms, 256, .99), pct(ms, 256, .99) / pct(ms, 256, .5), ms[255], _mm512_reduce_add_epi32(acc));
    }
    free(p);
    return 0;
}
