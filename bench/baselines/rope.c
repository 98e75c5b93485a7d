/* Rotary embedding, half-split layout, on x of shape (batch*heads, seq, dim) float32
 * with cos and sin of shape (seq, dim/2): y[..., :h] = x1*cos - x2*sin and
 * y[..., h:] = x2*cos + x1*sin, written straight into the two halves of y (the cat
 * costs nothing). */
#include <stdint.h>

void rope_half(const float *restrict x, const float *restrict c, const float *restrict s,
               float *restrict y, int64_t bh, int64_t seq, int64_t dim, int nt) {
    const int64_t h = dim / 2;
#pragma omp parallel for collapse(2) num_threads(nt) schedule(static)
    for (int64_t b = 0; b < bh; b++) {
        for (int64_t t = 0; t < seq; t++) {
            const float *xr = x + (b * seq + t) * dim;
            float *yr = y + (b * seq + t) * dim;
            const float *cr = c + t * h, *sr = s + t * h;
#pragma omp simd
            for (int64_t i = 0; i < h; i++) {
                float x1 = xr[i], x2 = xr[h + i];
                yr[i] = x1 * cr[i] - x2 * sr[i];
                yr[h + i] = x2 * cr[i] + x1 * sr[i];
            }
        }
    }
}
