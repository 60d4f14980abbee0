/* The epilogue of a GEMM convolution, float32, in place, in one pass: y (M rows of Q values, rows `pitch`
 * apart) gets its row's bias (optional) and the fused activation (relu, clip, hard_swish, swish).  numpy
 * does this in one pass per step (bias add, then clip: two or three passes over an output that no longer
 * fits in cache), and each pass runs numpy's per-call machinery; in MobileNetV2 that was 10-25% of every
 * 1x1 conv.  Built with dwconv.c by kernels/clib/compiled.py; conv.py's numpy epilogue stays the fallback. */

#include "vec.h"

void rpcsrv_bias_swish_f32(float *y, const float *bias, long m, long q, long pitch);  /* sigmoid.c */

void rpcsrv_bias_act_f32(float *y, const float *bias, long m, long q, long pitch, int act, float lo, float hi) {
    if (act == ACT_SWISH) {  /* the bias inside SiLU's one pass */
        rpcsrv_bias_swish_f32(y, bias, m, q, pitch);
        return;
    }
    for (long i = 0; i < m; i++) {
        float *row = y + i * pitch;
        const float b = bias ? bias[i] : 0.f;
        /* one loop per case, so that each vectorises; NaN stays NaN (comparisons false), as in numpy */
        if (act == ACT_RELU) {
            for (long j = 0; j < q; j++) { float v = row[j] + b; row[j] = v < 0.f ? 0.f : v; }
        } else if (act == ACT_CLIP) {
            for (long j = 0; j < q; j++) {
                float v = row[j] + b;
                v = v < lo ? lo : v;
                row[j] = v > hi ? hi : v;
            }
        } else if (act == ACT_HARDSWISH) {
            for (long j = 0; j < q; j++) {
                float v = row[j] + b, g = v * (1.f / 6.f) + 0.5f;
                g = g < 0.f ? 0.f : g;
                row[j] = v * (g > 1.f ? 1.f : g);
            }
        } else if (bias) {
            for (long j = 0; j < q; j++) row[j] += b;
        }
    }
}

/* y = act(x + r + bias) for m rows of q values, contiguous: r (optional) the same shape as x (a residual
 * connection, ResNet's Add/Sum + Relu), bias (optional) one value per row (DenseNet's batch-norm shift +
 * Relu before each conv): one pass where numpy makes two or three (the broadcast add over rows of H*W
 * values runs numpy's slow short-row loops).  x may be y (in place); swish runs after, over all of y. */
void rpcsrv_add_act_f32(const float *x, const float *r, const float *bias, float *y, long m, long q, int act,
                        float lo, float hi) {
    for (long i = 0; i < m; i++) {
        const float *xi = x + i * q, *ri = r ? r + i * q : 0;
        float *yi = y + i * q;
        const float b = bias ? bias[i] : 0.f;
        if (ri) {
            for (long j = 0; j < q; j++) yi[j] = xi[j] + ri[j] + b;
        } else {
            for (long j = 0; j < q; j++) yi[j] = xi[j] + b;
        }
        if (act == ACT_RELU) {
            for (long j = 0; j < q; j++) yi[j] = yi[j] < 0.f ? 0.f : yi[j];
        } else if (act == ACT_CLIP) {
            for (long j = 0; j < q; j++) {
                float v = yi[j];
                v = v < lo ? lo : v;
                yi[j] = v > hi ? hi : v;
            }
        } else if (act == ACT_HARDSWISH) {
            for (long j = 0; j < q; j++) {
                float v = yi[j], g = v * (1.f / 6.f) + 0.5f;
                g = g < 0.f ? 0.f : g;
                yi[j] = v * (g > 1.f ? 1.f : g);
            }
        }
    }
    if (act == ACT_SWISH) rpcsrv_sigmoid_f32(y, y, m * q, 1);
}

/* The two above with their arguments in blocks made once per plan (the run plans, kernels/plans.py: a ctypes
 * call's cost grows with its argument count).  p: bias (0: none), m, q, act; f: lo, hi.  bias_act runs on y in
 * place. */
void rpcsrv_bias_act_block(float *y, const long *p, const float *f) {
    rpcsrv_bias_act_f32(y, (const float *)p[0], p[1], p[2], p[2], (int)p[3], f[0], f[1]);
}

void rpcsrv_add_act_block(const float *x, const float *r, float *y, const long *p, const float *f) {
    rpcsrv_add_act_f32(x, r, (const float *)p[0], y, p[1], p[2], (int)p[3], f[0], f[1]);
}

/* y[i] = the mean of row i of x (m rows of q values, contiguous): GlobalAveragePool over (N * C, H * W) in one
 * pass, two vector accumulators per row.  numpy's product with a ones vector is a BLAS call, a divide and
 * reshapes: 18-24 us each inside EfficientNet's run (its 16 squeeze-and-excitation blocks), 10 alone. */
void rpcsrv_row_mean_f32(const float *x, float *y, long m, long q) {
    const float scale = 1.f / (float)q;
    for (long i = 0; i < m; i++) {
        const float *xi = x + i * q;
        vf a = {0}, b = {0};
        long j = 0;
        for (; j + 2 * VW <= q; j += 2 * VW) {
            a += loadv(xi + j);
            b += loadv(xi + j + VW);
        }
        if (j + VW <= q) { a += loadv(xi + j); j += VW; }
        a += b;
        float t = 0.f;
        for (int k = 0; k < VW; k++) t += a[k];
        for (; j < q; j++) t += xi[j];
        y[i] = t * scale;
    }
}

/* y = clip(a * x + b, lo, hi) over count values: HardSigmoid (MobileNetV3's squeeze-and-excitation gates)
 * in one call, where numpy makes three passes and as many calls.  NaN stays NaN, as np.clip. */
void rpcsrv_affine_clip_f32(const float *x, float *y, long count, float a, float b, float lo, float hi) {
    for (long j = 0; j < count; j++) {
        float v = a * x[j] + b;
        v = v < lo ? lo : v;
        y[j] = v > hi ? hi : v;
    }
}

/* y (rows of n values, contiguous), in place: act(y + bias) with one bias value per column (a MatMul's
 * dense + bias composite, an encoder's projections), in one pass per row while it is in cache */
void rpcsrv_col_bias_act_f32(float *y, const float *bias, long rows, long n, int act, float lo, float hi) {
    for (long i = 0; i < rows; i++)
        rpcsrv_add_act_f32(y + i * n, bias, 0, y + i * n, 1, n, act == ACT_SWISH ? 0 : act, lo, hi);
    if (act == ACT_SWISH) rpcsrv_sigmoid_f32(y, y, rows * n, 1);
}
