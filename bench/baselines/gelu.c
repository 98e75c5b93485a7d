/* GELU, hand-written single-pass loops: the practical limit for braze's fused kernels.
 * Built by bench/fusion.py with -O3 -march=native -ffast-math -fopenmp.
 * y and x are n contiguous floats; nt is the OpenMP thread count. */
#include <math.h>
#include <stdint.h>

/* erf from Abramowitz-Stegun 7.1.26, as the benchmark's "custom erf" program writes it. */
void gelu_erf_custom(const float *restrict x, float *restrict y, int64_t n, int nt) {
    const float p = 0.3275911f, a1 = 0.254829592f, a2 = -0.284496736f, a3 = 1.421413741f,
                a4 = -1.453152027f, a5 = 1.061405429f;
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float z = v * 0.70710678118654752f;
        float s = z < 0.0f ? -1.0f : 1.0f;
        float a = fabsf(z);
        float t = 1.0f / (1.0f + p * a);
        float e = 1.0f - (((((a5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * expf(-a * a);
        y[i] = v * (s * e + 1.0f) * 0.5f;
    }
}

/* erf from libm (glibc's vector erff under -ffast-math), for the reference GELU. */
void gelu_erf_libm(const float *restrict x, float *restrict y, int64_t n, int nt) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}
