/* Softmax over the last dim of a (rows, cols) float32 matrix: per row, max, then
 * exp(x - max) written to y while summing, then y *= 1/sum. The row stays in cache,
 * so memory sees one read of x and one write of y. */
#include <math.h>
#include <stdint.h>

void softmax_rows(const float *restrict x, float *restrict y, int64_t rows, int64_t cols, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
#pragma omp simd reduction(max:m)
        for (int64_t i = 0; i < cols; i++) m = xr[i] > m ? xr[i] : m;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < cols; i++) { float e = expf(xr[i] - m); yr[i] = e; s += e; }
        float inv = 1.0f / s;
#pragma omp simd
        for (int64_t i = 0; i < cols; i++) yr[i] *= inv;
    }
}
