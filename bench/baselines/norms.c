/* LayerNorm and RMSNorm over the last dim of a (rows, cols) float32 matrix, with a
 * weight (and bias) of cols floats. One row at a time, kept in cache: memory sees one
 * read of x and one write of y. LayerNorm takes the variance about the mean (two
 * passes over the cached row), as the braze program writes it. */
#include <math.h>
#include <stdint.h>

void layernorm_rows(const float *restrict x, const float *restrict w, const float *restrict b,
                    float *restrict y, int64_t rows, int64_t cols, float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < cols; i++) s += xr[i];
        float mu = s / (float)cols, v = 0.0f;
#pragma omp simd reduction(+:v)
        for (int64_t i = 0; i < cols; i++) { float d = xr[i] - mu; v += d * d; }
        float inv = 1.0f / sqrtf(v / (float)cols + eps);
#pragma omp simd
        for (int64_t i = 0; i < cols; i++) yr[i] = (xr[i] - mu) * inv * w[i] + b[i];
    }
}

void rmsnorm_rows(const float *restrict x, const float *restrict w, float *restrict y,
                  int64_t rows, int64_t cols, float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < cols; i++) s += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(s / (float)cols + eps);
#pragma omp simd
        for (int64_t i = 0; i < cols; i++) yr[i] = xr[i] * inv * w[i];
    }
}
