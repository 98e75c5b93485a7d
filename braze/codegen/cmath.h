/* braze/codegen/cmath.h -- braze's branch-free float32 math for generated CPU kernels.
 *
 * Why: gcc only vectorises libm's expf & co. under -ffast-math, which braze cannot use
 * (masking relies on -inf scores, softmax and friends on inf/nan semantics).  These
 * functions are plain `static inline` C with no libm calls, no data-indexed tables and
 * no branches (selects on computed masks only), so gcc -O3 -march=native auto-vectorises
 * them inside `#pragma omp simd` loops while keeping IEEE semantics.  They are correct
 * with or without FMA contraction (-ffp-contract=fast|off) and do not need any
 * particular MXCSR state beyond round-to-nearest (denormals are handled, not flushed;
 * under FTZ/DAZ denormal inputs/outputs simply behave as zero).
 *
 * Accuracy: bound asserted by tests/test_cmath.py and (in parentheses) the largest error
 * measured over ~7M inputs per function (dense bit-pattern sweeps of the main domain,
 * every 4099th float32, edge regions, denormals), with and without FMA contraction;
 * float32 ulps of the exact result, reference numpy/math float64, 0.5 = correctly rounded:
 *
 *   function        bound(meas)  where it holds (all float32 inputs of the range)
 *   --------------  -----------  -------------------------------------------------
 *   braze_expf       1.0 (0.99)  all x; overflow to +inf for x > 88.7228, denormal
 *                                results down to 2^-149 (x > -103.97), 0 below
 *   braze_expm1f     1.5 (1.35)  all x; -1 below -17.4, +inf above 88.7228
 *   braze_logf       1.0 (0.83)  all x >= 0 incl. denormals; log(0) = -inf
 *   braze_log1pf     1.5 (1.44)  all x >= -1; log1p(-1) = -inf
 *   braze_erff       1.5 (1.12)  all x (odd; exactly +-1 for |x| >= 3.9375)
 *   braze_tanhf      2.5 (2.29)  all x (odd; tanh(x) = x for |x| < 2^-12,
 *                                exactly +-1 for |x| >= 10)
 *   braze_sigmoidf   1.5 (1.32)  all x (denormal results for x < -87.3, 0 below
 *                                -103.97, exactly 1 for x > 16.7)
 *   braze_sinf       1.5 (1.21)  |x| < 2^33 (~8.6e9); larger |x|: see note below
 *   braze_cosf       1.5 (1.22)  |x| < 2^33 (~8.6e9); larger |x|: see note below
 *
 * Special values: exp(-inf)=0, exp(+inf)=+inf, log(0)=-inf, log(x<0)=nan,
 * log(+inf)=+inf, erf/tanh(+-inf)=+-1, sigmoid(-inf)=0, sigmoid(+inf)=1,
 * sin/cos(+-inf)=nan; every function maps nan to nan; signed zeros are preserved by the
 * odd functions (erf, tanh, sin, expm1, log1p).
 *
 * sin/cos range reduction is Cody-Waite in double precision with pi/2 split into three
 * 20-bit parts plus a 53-bit tail (113 bits): k*part is exact for |k| < 2^33, so the
 * reduction is essentially exact for |x| < 2^33.  Above that the products k*part lose
 * bits (absolute error of the reduced argument ~ |x| * 2^-53, growing to garbage by
 * |x| ~ 2^50): results for |x| >= 2^33 are finite and within [-1, 1] but NOT accurate.
 * (Float spacing there is >= 1024, hundreds of periods; no model feeds such angles.
 * A Payne-Hanek reduction would fix it at several times the cost for every lane.)
 * `pytest -s tests/test_cmath.py` prints the measured maxima.
 *
 * Coefficients: own minimax fits, scripts/fit_cmath.py.
 */
#ifndef BRAZE_CMATH_H
#define BRAZE_CMATH_H

#include <stdint.h>
#include <string.h>

/* ---- bit casts ------------------------------------------------------------------ */

static inline uint32_t braze__f2u(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
static inline float braze__u2f(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

#define BRAZE__INF braze__u2f(0x7f800000u)
#define BRAZE__NAN braze__u2f(0x7fc00000u)

static inline float braze__copysign(float mag, float sgn) {
    return braze__u2f((braze__f2u(mag) & 0x7fffffffu) | (braze__f2u(sgn) & 0x80000000u));
}
/* Branch-free select: c ? a : b with both operands already computed.  Written as bit
   operations because, without -ffast-math (-ftrapping-math), gcc will not if-convert a
   `?:` whose operand is a float computation that could trap; it keeps a branch and the
   loop is not vectorised.  Even clamps against constants (`x < c ? c : x`) must use it:
   gcc's jump threading otherwise specialises the code after the clamp for the constant
   and leaves unconvertible control flow.  (Integer ?: is fine: it becomes min/max.) */
static inline float braze__sel(int c, float a, float b) {
    uint32_t m = (uint32_t)0 - (uint32_t)(c != 0);
    return braze__u2f((braze__f2u(a) & m) | (braze__f2u(b) & ~m));
}
static inline double braze__seld(int c, double a, double b) {
    uint64_t m = (uint64_t)0 - (uint64_t)(c != 0), ua, ub, r;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    r = (ua & m) | (ub & ~m);
    double d;
    memcpy(&d, &r, sizeof d);
    return d;
}
static inline float braze__fabs(float x) { return braze__u2f(braze__f2u(x) & 0x7fffffffu); }

/* ---- exp --------------------------------------------------------------------------- */

/* ln2 = LN2_HI + LN2_LO; LN2_HI has 15 significant bits, so k*LN2_HI is exact |k|<=512. */
#define BRAZE__LN2_HI 0x1.62e4p-1f
#define BRAZE__LN2_LO 0x1.7f7d1cp-20f
#define BRAZE__LOG2E 0x1.715476p+0f
#define BRAZE__SHIFT 0x1.8p23f /* adding it rounds to an integer held in the low bits */

/* e^r ~= 1 + r + r^2 * P(r), |r| <= ln2/2 (relative error 3.1e-9). */
#define BRAZE__EXP_C0 0x1.fffffcp-2f
#define BRAZE__EXP_C1 0x1.555492p-3f
#define BRAZE__EXP_C2 0x1.5558acp-5f
#define BRAZE__EXP_C3 0x1.123976p-7f
#define BRAZE__EXP_C4 0x1.6a5052p-10f

/* Reduction x = k*ln2 + r; returns r, stores k (as float and as int bits). */
static inline float braze__exp_reduce(float x, float *kf, int32_t *ki) {
    float s = x * BRAZE__LOG2E + BRAZE__SHIFT;
    float k = s - BRAZE__SHIFT;
    *ki = (int32_t)(braze__f2u(s) - braze__f2u(BRAZE__SHIFT));
    *kf = k;
    float r = x - k * BRAZE__LN2_HI;
    return r - k * BRAZE__LN2_LO;
}

static inline float braze__exp_poly(float r) {
    float p = BRAZE__EXP_C4;
    p = p * r + BRAZE__EXP_C3;
    p = p * r + BRAZE__EXP_C2;
    p = p * r + BRAZE__EXP_C1;
    p = p * r + BRAZE__EXP_C0;
    return 1.0f + (r + (r * r) * p);
}

/* 2^k for -126 <= k <= 127. */
static inline float braze__pow2i(int32_t k) { return braze__u2f((uint32_t)(k + 127) << 23); }

/* e^x for x in [-87, 88] (normal results), nan -> nan; no other special cases. */
static inline float braze__exp_core(float x) {
    float kf; int32_t ki;
    float r = braze__exp_reduce(x, &kf, &ki);
    ki = ki < -126 ? -126 : ki; /* only reached for garbage (nan) lanes */
    ki = ki > 127 ? 127 : ki;
    return braze__exp_poly(r) * braze__pow2i(ki);
}

/* e^x by braze_expf's reduction and polynomial with one scaling by 2^k: bit for bit
   braze_expf wherever -126 <= k <= 127 (k = braze__exp_k(x); for k = -126 the one
   product rounds to a subnormal exactly as braze_expf's second product does), garbage
   elsewhere. For a loop that runs it first, folds the min and max of k, and is redone
   with braze_expf in the rare case that left [-126, 127]: softmax's weights exp(x -
   max) are in range unless masked or tiny. No clamps and one scaling instead of two. */
static inline float braze__exp_normal(float x) {
    float kf; int32_t ki;
    float r = braze__exp_reduce(x, &kf, &ki);
    return braze__exp_poly(r) * braze__pow2i(ki);
}
/* braze__exp_reduce's k, computed the same way (so gcc computes it once beside
   braze__exp_normal(x)); a nan or infinite x gives a k far outside [-126, 127]. */
static inline int32_t braze__exp_k(float x) {
    return (int32_t)(braze__f2u(x * BRAZE__LOG2E + BRAZE__SHIFT) - braze__f2u(BRAZE__SHIFT));
}

static inline float braze_expf(float x) {
    /* Clamp (nan passes through: comparisons with nan are false). */
    x = braze__sel(x < -104.0f, -104.0f, x);
    x = braze__sel(x > 89.0f, 89.0f, x);
    float kf; int32_t ki;
    float r = braze__exp_reduce(x, &kf, &ki); /* ki in [-150, 129] */
    ki = ki < -150 ? -150 : ki;              /* (garbage for nan lanes) */
    ki = ki > 129 ? 129 : ki;
    /* 2^k = 2^k1 * 2^k2 with both factors normal: p*2^k1 is exact, the second product
       rounds once, giving correct overflow to inf and correctly rounded denormals. */
    int32_t k1 = ki >> 1;
    int32_t k2 = ki - k1;
    return (braze__exp_poly(r) * braze__pow2i(k1)) * braze__pow2i(k2);
}

/* ---- expm1 ------------------------------------------------------------------------- */

/* expm1(r) ~= r + r^2/2 + r^3 * Q(r), |r| <= ln2/2 (relative error 4.3e-10). */
#define BRAZE__EXPM1_C0 0x1.555554p-3f
#define BRAZE__EXPM1_C1 0x1.5554f8p-5f
#define BRAZE__EXPM1_C2 0x1.1112dap-7f
#define BRAZE__EXPM1_C3 0x1.6d3a3ap-10f
#define BRAZE__EXPM1_C4 0x1.9e6f26p-13f

/* expm1(x) for x in [-18, 89] or nan. */
static inline float braze__expm1_core(float x) {
    float kf; int32_t ki;
    float r = braze__exp_reduce(x, &kf, &ki); /* ki in [-26, 129] */
    ki = ki < -26 ? -26 : ki;
    ki = ki > 129 ? 129 : ki;
    float q = BRAZE__EXPM1_C4;
    q = q * r + BRAZE__EXPM1_C3;
    q = q * r + BRAZE__EXPM1_C2;
    q = q * r + BRAZE__EXPM1_C1;
    q = q * r + BRAZE__EXPM1_C0;
    float r2 = r * r;
    float p = r + (0.5f * r2 + r2 * r * q); /* expm1(r) */
    /* expm1(x) = 2 * (t*p + (t - 1/2)) with t = 2^(k-1); t - 1/2 is exact for
       -24 <= k <= 25 and the final doubling overflows to inf correctly. */
    float t = braze__pow2i(ki - 1);
    return 2.0f * (t * p + (t - 0.5f));
}

static inline float braze_expm1f(float x) {
    float xc = braze__sel(x < -18.0f, -18.0f, x);
    xc = braze__sel(xc > 89.0f, 89.0f, xc);
    float y = braze__expm1_core(xc);
    return braze__sel(braze__fabs(x) < 0x1p-25f, x, y); /* tiny x (and +-0): expm1(x) = x */
}

/* ---- log --------------------------------------------------------------------------- */

/* log1p(f) ~= f - f^2/2 + f^3 * Q(f), f in [sqrt(1/2)-1, sqrt(2)-1] (rel. err 7.7e-10). */
#define BRAZE__LOG_C0 0x1.555548p-2f
#define BRAZE__LOG_C1 -0x1.000006p-2f
#define BRAZE__LOG_C2 0x1.99a478p-3f
#define BRAZE__LOG_C3 -0x1.555c48p-3f
#define BRAZE__LOG_C4 0x1.233b62p-3f
#define BRAZE__LOG_C5 -0x1.fc278ap-4f
#define BRAZE__LOG_C6 0x1.e6c372p-4f
#define BRAZE__LOG_C7 -0x1.de0d26p-4f
#define BRAZE__LOG_C8 0x1.147962p-4f

/* log(x) for finite x > 0 (denormals included); garbage for other inputs. */
static inline float braze__log_core(float x) {
    uint32_t ux = braze__f2u(x);
    int den = ux < 0x00800000u;
    float xs = x * braze__sel(den, 0x1p23f, 1.0f); /* exact */
    uint32_t u = braze__f2u(xs);
    /* x = 2^e * m with m in [sqrt(1/2), sqrt(2)) */
    uint32_t d = u - 0x3f3504f3u;
    int32_t e = (int32_t)d >> 23;
    float m = braze__u2f(u - ((uint32_t)e << 23));
    float ef = (float)(e - (den ? 23 : 0));
    float f = m - 1.0f; /* exact */
    float q = BRAZE__LOG_C8;
    q = q * f + BRAZE__LOG_C7;
    q = q * f + BRAZE__LOG_C6;
    q = q * f + BRAZE__LOG_C5;
    q = q * f + BRAZE__LOG_C4;
    q = q * f + BRAZE__LOG_C3;
    q = q * f + BRAZE__LOG_C2;
    q = q * f + BRAZE__LOG_C1;
    q = q * f + BRAZE__LOG_C0;
    float f2 = f * f;
    float lo = ef * BRAZE__LN2_LO + (f2 * f * q - 0.5f * f2);
    return ef * BRAZE__LN2_HI + (f + lo); /* ef*LN2_HI exact */
}

static inline float braze_logf(float x) {
    float y = braze__log_core(x);
    y = braze__sel(x == BRAZE__INF, x, y);
    y = braze__sel(x == 0.0f, -BRAZE__INF, y);
    y = braze__sel(x < 0.0f, BRAZE__NAN, y);
    return braze__sel(x != x, x, y);
}

static inline float braze_log1pf(float x) {
    float u = 1.0f + x;
    float corr = (x - (u - 1.0f)) / u; /* rounding error of 1+x, to first order */
    float y = braze__log_core(u) + corr;
    y = braze__sel(braze__fabs(x) < 0x1p-24f, x, y); /* tiny x and +-0: log1p(x) = x */
    y = braze__sel(x == BRAZE__INF, x, y);
    y = braze__sel(x == -1.0f, -BRAZE__INF, y);
    y = braze__sel(x < -1.0f, BRAZE__NAN, y);
    return braze__sel(x != x, x, y);
}

/* ---- erf --------------------------------------------------------------------------- */

#define BRAZE__ERF_SPLIT 0.921875f
#define BRAZE__ERF_ONE 3.9375f /* erf(x) rounds to 1 for x >= 3.9375 */

/* erf(x) ~= x + x * Q(x^2), 0 <= x <= 0.921875 (relative error 1.6e-8). */
#define BRAZE__ERF_S0 0x1.06eba6p-3f
#define BRAZE__ERF_S1 -0x1.8126e8p-2f
#define BRAZE__ERF_S2 0x1.ce1aa8p-4f
#define BRAZE__ERF_S3 -0x1.b68d48p-6f
#define BRAZE__ERF_S4 0x1.4741c6p-8f
#define BRAZE__ERF_S5 -0x1.3a221p-11f

/* log(erfc(t)) ~= P(t - 0.921875), 0.921875 <= t <= 3.9375 (error weighted by erfc(t):
   1.1e-8, i.e. the resulting erf error is below 0.2 ulp). */
#define BRAZE__ERFC_L0 -0x1.a60826p+0f
#define BRAZE__ERFC_L1 -0x1.41068cp+1f
#define BRAZE__ERFC_L2 -0x1.aa888cp-1f
#define BRAZE__ERFC_L3 -0x1.658a42p-5f
#define BRAZE__ERFC_L4 0x1.1df538p-8f
#define BRAZE__ERFC_L5 0x1.06984cp-6f
#define BRAZE__ERFC_L6 -0x1.d05a28p-6f
#define BRAZE__ERFC_L7 0x1.aec668p-6f
#define BRAZE__ERFC_L8 -0x1.c7836p-7f
#define BRAZE__ERFC_L9 0x1.fe55bp-9f
#define BRAZE__ERFC_L10 -0x1.d37b0ep-12f

static inline float braze_erff(float x) {
    float t = braze__fabs(x);
    /* small |x| */
    float z = t * t;
    float q = BRAZE__ERF_S5;
    q = q * z + BRAZE__ERF_S4;
    q = q * z + BRAZE__ERF_S3;
    q = q * z + BRAZE__ERF_S2;
    q = q * z + BRAZE__ERF_S1;
    q = q * z + BRAZE__ERF_S0;
    float small = t + t * q;
    /* large |x|: 1 - exp(P(t)) */
    float tc = braze__sel(t < BRAZE__ERF_SPLIT, BRAZE__ERF_SPLIT, t);
    tc = braze__sel(tc > BRAZE__ERF_ONE, BRAZE__ERF_ONE, tc);
    float u = tc - BRAZE__ERF_SPLIT;
    float p = BRAZE__ERFC_L10;
    p = p * u + BRAZE__ERFC_L9;
    p = p * u + BRAZE__ERFC_L8;
    p = p * u + BRAZE__ERFC_L7;
    p = p * u + BRAZE__ERFC_L6;
    p = p * u + BRAZE__ERFC_L5;
    p = p * u + BRAZE__ERFC_L4;
    p = p * u + BRAZE__ERFC_L3;
    p = p * u + BRAZE__ERFC_L2;
    p = p * u + BRAZE__ERFC_L1;
    p = p * u + BRAZE__ERFC_L0;
    float large = 1.0f - braze__exp_core(p);
    float y = braze__sel(t < BRAZE__ERF_SPLIT, small, large);
    y = braze__sel(t >= BRAZE__ERF_ONE, 1.0f, y);
    return braze__copysign(y, x); /* nan stays nan via `large` */
}

/* ---- tanh, sigmoid ----------------------------------------------------------------- */

static inline float braze_tanhf(float x) {
    float t = braze__fabs(x);
    float y2 = 2.0f * t;
    y2 = braze__sel(y2 > 20.0f, 20.0f, y2); /* tanh = 1 in float32 beyond |x| ~ 9.01 */
    float e = braze__expm1_core(y2); /* accurate near 0: no cancellation */
    float r = e / (e + 2.0f);
    r = braze__sel(t < 0x1p-12f, t, r); /* tanh(x) = x (to < 0.5 ulp) for tiny x */
    return braze__copysign(r, x);
}

static inline float braze_sigmoidf(float x) {
    /* e = exp(-|x|) in (0, 1] (no overflow), kept as e_hi + e_lo so that the rounding of
       e and of 1 + e does not add to the error: sigmoid = num / (1 + e) with
       num = e (x < 0) or 1 (x >= 0), computed as q + (num_lo - q * d_lo) / d. */
    float t = -braze__fabs(x);
    t = braze__sel(t < -104.0f, -104.0f, t); /* nan passes */
    float kf; int32_t ki;
    float r = braze__exp_reduce(t, &kf, &ki); /* ki in [-150, 0] */
    ki = ki < -150 ? -150 : ki;
    ki = ki > 0 ? 0 : ki;
    float P = BRAZE__EXP_C4;
    P = P * r + BRAZE__EXP_C3;
    P = P * r + BRAZE__EXP_C2;
    P = P * r + BRAZE__EXP_C1;
    P = P * r + BRAZE__EXP_C0;
    float sm = r + (r * r) * P;      /* e^r - 1 */
    float p_hi = 1.0f + sm;
    float p_lo = sm - (p_hi - 1.0f); /* exact (Fast2Sum) */
    float sc = braze__pow2i(ki < -126 ? -126 : ki);
    float e_hi = p_hi * sc, e_lo = p_lo * sc;
    float d = 1.0f + e_hi;
    float d_lo = ((1.0f - d) + e_hi) + e_lo;
    int neg = x < 0.0f;
    float num = braze__sel(neg, e_hi, 1.0f);
    float num_lo = braze__sel(neg, e_lo, 0.0f);
    float q = num / d;
    float y = q + (num_lo - q * d_lo) / d;
    /* x < -87: sigmoid(x) = e^x (denormal range), scaled in two exact steps */
    int32_t k1 = ki >> 1;
    float e_den = (p_hi * braze__pow2i(k1)) * braze__pow2i(ki - k1);
    return braze__sel(x < -87.0f, e_den, y);
}

/* ---- sin, cos ---------------------------------------------------------------------- */

#define BRAZE__TWO_OVER_PI 0x1.45f306dc9c883p-1
#define BRAZE__PIO2_1 0x1.921fap+0
#define BRAZE__PIO2_2 0x1.54442p-20
#define BRAZE__PIO2_3 0x1.a308cp-41
#define BRAZE__PIO2_4 0x1.313198a2e037p-61

/* sin(r) ~= r + r^3 * S(r^2), cos(r) ~= 1 - r^2/2 + r^4 * C(r^2), |r| <= pi/4. */
#define BRAZE__SIN_C0 -0x1.555556p-3f
#define BRAZE__SIN_C1 0x1.111174p-7f
#define BRAZE__SIN_C2 -0x1.a05962p-13f
#define BRAZE__SIN_C3 0x1.7c338p-19f
#define BRAZE__COS_C0 0x1.555556p-5f
#define BRAZE__COS_C1 -0x1.6c175ep-10f
#define BRAZE__COS_C2 0x1.a071bp-16f
#define BRAZE__COS_C3 -0x1.3611b2p-22f

/* sin(x) (quadrant offset 0) or cos(x) (offset 1) for finite x. */
static inline float braze__sincos(float x, int offset) {
    double xd = (double)x;
    double k = __builtin_rint(xd * BRAZE__TWO_OVER_PI);
    double r = xd - k * BRAZE__PIO2_1;
    r = r - k * BRAZE__PIO2_2;
    r = r - k * BRAZE__PIO2_3;
    r = r - k * BRAZE__PIO2_4;
    /* k mod 4 (exact; rint rather than floor: gcc does not vectorise double floor in an
       omp simd loop); k4 in [-2, 2] and & 3 maps it to 0..3 in two's complement. */
    double k4 = k - 4.0 * __builtin_rint(k * 0.25);
    int32_t quad = ((int32_t)k4 + offset) & 3;
    /* |r| <= pi/4 (+ rounding) for |x| < 2^33; beyond, the reduction degrades and r
       is clamped so that results stay within [-1, 1]. */
    r = braze__seld(r < -0.7854, -0.7854, r);
    r = braze__seld(r > 0.7854, 0.7854, r);
    float rf = (float)r;
    float dr = (float)(r - (double)rf); /* r = rf + dr, |dr| <= ulp(rf)/2 */
    float z = rf * rf;
    float sp = BRAZE__SIN_C3;
    sp = sp * z + BRAZE__SIN_C2;
    sp = sp * z + BRAZE__SIN_C1;
    sp = sp * z + BRAZE__SIN_C0;
    float s = rf + (dr + (rf * z) * sp);
    float cp = BRAZE__COS_C3;
    cp = cp * z + BRAZE__COS_C2;
    cp = cp * z + BRAZE__COS_C1;
    cp = cp * z + BRAZE__COS_C0;
    float c = 1.0f + ((z * z) * cp - (0.5f * z + rf * dr));
    float y = braze__sel(quad & 1, c, s);
    return braze__u2f(braze__f2u(y) ^ ((uint32_t)(quad & 2) << 30));
}

static inline float braze_sinf(float x) {
    float t = braze__fabs(x);
    float y = braze__sincos(braze__sel(t < BRAZE__INF, x, 0.0f), 0);
    y = braze__sel(t < 0x1p-12f, x, y); /* sin(x) = x (to < 0.5 ulp); keeps -0 and denormals */
    return braze__sel(t < BRAZE__INF, y, x - x); /* inf, nan -> nan */
}

static inline float braze_cosf(float x) {
    float t = braze__fabs(x);
    float y = braze__sincos(braze__sel(t < BRAZE__INF, x, 0.0f), 1);
    return braze__sel(t < BRAZE__INF, y, x - x);
}

#endif /* BRAZE_CMATH_H */
