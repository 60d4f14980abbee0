/* Sigmoid and SiLU (x * sigmoid(x)), float32, in one pass, for rpcsrv's numpy executor (built with
 * dwconv.c by kernels/clib/compiled.py).  numpy computes 1 / (1 + exp(-x)) in four passes over the tensor;
 * EfficientNet's activations made that 25% of its run.  Softmax along contiguous rows, each row while in
 * cache (numpy: five passes over the tensor, 4x onnxruntime's time on an encoder's attention scores).
 * GELU (erf form) in one pass.
 *
 * exp is Cephes' expf in GCC/clang generic vectors (range reduction by ln 2, a degree-6 polynomial, the
 * power of two built in the exponent bits): within 2 ulp of expf for |x| < 87; below -87.3 the sigmoid is
 * 0 (its limit; exp is clamped), above 88.7 it is 1.  Compilers without __builtin_convertvector (GCC < 9)
 * get the scalar expf loop. */
#include <math.h>

#include "armfloat.h"

/* GELU, erf form: y = 0.5 x (1 + erf(x / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, the
 * table kernel's fit: unary.erf_approx; vexp in the vector body), in one pass (numpy: a dozen passes over
 * the tensor; a PyTorch-exported encoder's FFN activations took more than a tenth of its run) */
static inline float gelu1(float x) {
    float v = x * 0.70710678118654752f, a = fabsf(v), t = 1.0f / (1.0f + 0.3275911f * a);
    float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    float e = 1.0f - p * expf(-a * a);
    return 0.5f * x * (1.0f + (v < 0.f ? -e : e));
}

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9)
#if defined(__AVX512F__)
#define SW 16
#elif defined(__AVX__)
#define SW 8
#else
#define SW 4
#endif
typedef float sf __attribute__((vector_size(SW * 4)));
typedef int si __attribute__((vector_size(SW * 4)));
typedef float sfu __attribute__((vector_size(SW * 4), aligned(4), may_alias));

static inline sf select(si mask, sf a, sf b) {  /* mask ? a : b, lane by lane */
    return (sf)(((si)a & mask) | ((si)b & ~mask));
}

static inline sf vexp(sf x) {
    x = select(x > 88.3762626647949f, (sf){0} + 88.3762626647949f, x);
    x = select(x < -87.3365447504f, (sf){0} - 87.3365447504f, x);
    /* n = x / ln 2 rounded to the nearest integer: added to 1.5 * 2^23, the sum's low mantissa bits are n
     * (the same reduced range as Cephes' floor(x / ln 2 + 0.5), without its two conversions and fix-up) */
    const sf magic = (sf){0} + 12582912.0f;
    sf t = x * 1.44269504088896341f + magic;
    sf fn = t - magic;
    si n = (si)t - (si)magic;
    sf r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
    sf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3333452784e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    si bits = (n + 127) << 23;
    return p * (sf)bits;
}

/* y = sigmoid(x + b) (times_x 0) or (x + b) * sigmoid(x + b) (1) over count values; add_b 0: x as it is
 * (no + 0, which would turn -0 into +0) */
static void sigmoid_run(const float *x, float *y, long count, int times_x, int add_b, float b) {
    long k = 0;
    for (; k + SW <= count; k += SW) {
        sf v = *(const sfu *)(x + k);
        if (add_b) v += b;
        sf s = 1.0f / (1.0f + vexp(-v));
        *(sfu *)(y + k) = times_x ? v * s : s;
    }
    for (; k < count; k++) {
        float v = add_b ? x[k] + b : x[k], s = 1.0f / (1.0f + expf(-v));
        y[k] = times_x ? v * s : s;
    }
}

void rpcsrv_sigmoid_f32(const float *x, float *y, long count, int times_x) {
    sigmoid_run(x, y, count, times_x, 0, 0.f);
}

/* y (m rows of q values, rows `pitch` apart), in place: SiLU of y + the row's bias (NULL: none), in one
 * pass (a conv's epilogue with SiLU fused: EfficientNet's expand convs, where a bias pass and then a SiLU
 * pass each read and wrote the expanded tensor) */
void rpcsrv_bias_swish_f32(float *y, const float *bias, long m, long q, long pitch) {
    for (long i = 0; i < m; i++) sigmoid_run(y + i * pitch, y + i * pitch, q, 1, bias != 0, bias ? bias[i] : 0.f);
}

/* y = softmax of each of `rows` contiguous rows of n values: the row's max, exp(x - max) and its sum,
 * then the scale, each row read from cache after its first pass */
void rpcsrv_softmax_f32(const float *x, float *y, long rows, long n) {
    for (long i = 0; i < rows; i++, x += n, y += n) {
        float mx = -INFINITY;
        long k = 0;
        if (n >= SW) {
            sf m = *(const sfu *)x;
            for (k = SW; k + SW <= n; k += SW) {
                sf v = *(const sfu *)(x + k);
                m = select(v > m, v, m);
            }
            for (int l = 0; l < SW; l++) mx = m[l] > mx ? m[l] : mx;
        }
        for (; k < n; k++) mx = x[k] > mx ? x[k] : mx;
        sf acc = (sf){0};
        float sum = 0.f;
        for (k = 0; k + SW <= n; k += SW) {
            sf e = vexp(*(const sfu *)(x + k) - mx);
            *(sfu *)(y + k) = e;
            acc += e;
        }
        for (; k < n; k++) sum += (y[k] = expf(x[k] - mx));
        for (int l = 0; l < SW; l++) sum += acc[l];
        float inv = 1.0f / sum;
        for (k = 0; k + SW <= n; k += SW) *(sfu *)(y + k) = *(sfu *)(y + k) * inv;
        for (; k < n; k++) y[k] *= inv;
    }
}


void rpcsrv_gelu_f32(const float *x, float *y, long count) {
    const si sign = (si){0} + (int)0x80000000u;
    long k = 0;
    for (; k + SW <= count; k += SW) {
        sf x0 = *(const sfu *)(x + k), v = x0 * 0.70710678118654752f;
        sf a = (sf)((si)v & ~sign), t = 1.0f / (1.0f + 0.3275911f * a);
        sf p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
        sf e = 1.0f - p * vexp(-(a * a));
        *(sfu *)(y + k) = 0.5f * x0 * (1.0f + (sf)((si)e | ((si)v & sign)));
    }
    for (; k < count; k++) y[k] = gelu1(x[k]);
}
#else
void rpcsrv_softmax_f32(const float *x, float *y, long rows, long n) {
    for (long i = 0; i < rows; i++, x += n, y += n) {
        float mx = -INFINITY, sum = 0.f;
        for (long k = 0; k < n; k++) mx = x[k] > mx ? x[k] : mx;
        for (long k = 0; k < n; k++) sum += (y[k] = expf(x[k] - mx));
        for (long k = 0; k < n; k++) y[k] /= sum;
    }
}

void rpcsrv_sigmoid_f32(const float *x, float *y, long count, int times_x) {
    for (long k = 0; k < count; k++) {
        float s = 1.0f / (1.0f + expf(-x[k]));
        y[k] = times_x ? x[k] * s : s;
    }
}

void rpcsrv_bias_swish_f32(float *y, const float *bias, long m, long q, long pitch) {
    for (long i = 0; i < m; i++)
        for (long k = 0; k < q; k++) {
            float v = y[i * pitch + k] + (bias ? bias[i] : 0.f);
            y[i * pitch + k] = v / (1.0f + expf(-v));
        }
}
void rpcsrv_gelu_f32(const float *x, float *y, long count) {
    for (long k = 0; k < count; k++) y[k] = gelu1(x[k]);
}
#endif
