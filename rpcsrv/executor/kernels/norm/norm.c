/* LayerNormalization over the last axis, float32, one row at a time while it is in cache, for rpcsrv's numpy
 * executor (kernels/norm/plans_norm.py plans it; norm.py's numpy kernel stays the fallback and computes the
 * statistics outputs).  numpy makes seven passes over the tensor with temporaries (the mean, the
 * differences, their squares, the variance, the scaling, the scale and the shift): 64 us per
 * LayerNormalization of the encoder's 128 x 256 activations inside its run, against 165 us for
 * onnxruntime's SkipLayerNormalization.  Built with the other kernels by kernels/clib/compiled.py.
 */
#include <math.h>

#include "vec.h"

static inline float hsum(vf v) {
    float s = 0.f;
    for (int l = 0; l < VW; l++) s += v[l];
    return s;
}

/* y[i, :] = (x[i, :] - mean_i) / sqrt(var_i + eps) * gamma + beta (beta optional) for `rows` contiguous rows
 * of n values; the mean and the variance (of the differences, as numpy) accumulated in two vectors of
 * partial sums.  NaN or inf in a row makes that row NaN, as numpy. */
void rpcsrv_layernorm_f32(const float *x, const float *gamma, const float *beta, float *y, long rows, long n,
                          float eps) {
    const float inv_n = 1.f / (float)n;
    for (long i = 0; i < rows; i++, x += n, y += n) {
        vf a0 = splat(0.f), a1 = splat(0.f);
        long k = 0;
        for (; k + 2 * VW <= n; k += 2 * VW) {
            a0 += loadv(x + k);
            a1 += loadv(x + k + VW);
        }
        float s = hsum(a0 + a1);
        for (; k < n; k++) s += x[k];
        const float mean = s * inv_n;
        const vf vm = splat(mean);
        a0 = a1 = splat(0.f);
        for (k = 0; k + 2 * VW <= n; k += 2 * VW) {
            const vf d0 = loadv(x + k) - vm, d1 = loadv(x + k + VW) - vm;
            a0 += d0 * d0;
            a1 += d1 * d1;
        }
        float q = hsum(a0 + a1);
        for (; k < n; k++) q += (x[k] - mean) * (x[k] - mean);
        const float inv = 1.f / sqrtf(q * inv_n + eps);
        const vf vi = splat(inv);
        for (k = 0; k + VW <= n; k += VW) {
            vf v = (loadv(x + k) - vm) * vi * loadv(gamma + k);
            if (beta) v += loadv(beta + k);
            storev(y + k, v);
        }
        for (; k < n; k++) y[k] = (x[k] - mean) * inv * gamma[k] + (beta ? beta[k] : 0.f);
    }
}
