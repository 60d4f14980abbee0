/* MaxPool and AveragePool, float32 NCHW, by rows (kernels/pool/plans_pool.py calls them through dwconv.c's
 * rpcsrv_pool_block): per output row, the maximum (or sum) of its KH input rows into one row buffer
 * (vectors along the width, the padding columns -inf, or 0), then each output of the row the maximum (sum)
 * of KW values of that buffer, an average divided by its window's count; at stride 2 the even lanes of two
 * vectors (one shuffle) give VW outputs per tap.  Both reductions are separable, so this costs KH + KW
 * operations per output where dwconv.c's phase planes cost KH * KW plus the planes' copies (SqueezeNet's
 * 3x3 stride-2 max pools were 4-5x onnxruntime's time, Inception-v2's average pools 4x).  NaN wins the
 * maximum, as in numpy's; padding rows and columns never do (-inf), and add nothing to a sum.
 */
#include <stdlib.h>

#include "vec.h"

enum { POOL_MAX = 0, POOL_SUM = 1 };

static inline float maxnan(float a, float u) {  /* no branch (random data mispredicts: 3-8x the time) */
    union { float f; unsigned i; } x = {a}, y = {u};
    unsigned take = 0u - (unsigned)((u > a) | (u != u));
    x.i = (y.i & take) | (x.i & ~take);
    return x.f;
}
static inline __attribute__((always_inline)) vf comb(vf a, vf u, const int kind) {
    return kind == POOL_MAX ? vmaxnan(a, u) : a + u;
}
static inline __attribute__((always_inline)) float comb1(float a, float u, const int kind) {
    return kind == POOL_MAX ? maxnan(a, u) : a + u;
}

/* row[0 .. wd) = the maximum (sum) of the rows src[0..k) (each wd long; k >= 1); the last vector overlaps
 * the one before when wd is no whole number of them */
static inline __attribute__((always_inline)) void rows_op(float *row, const float *const *src, long k, long wd,
                                                          const int kind) {
    long j = 0;
    for (; j < wd && wd >= VW; j += VW) {
        if (j + VW > wd) j = wd - VW;
        vf a = loadv(src[0] + j);
        for (long i = 1; i < k; i++) a = comb(a, loadv(src[i] + j), kind);
        storev(row + j, a);
    }
    for (; j < wd; j++) {
        float a = src[0][j];
        for (long i = 1; i < k; i++) a = comb1(a, src[i][j], kind);
        row[j] = a;
    }
}

/* out[0 .. ow) = the maximum (sum, divided by div[col]) over the taps t < kw of buf[col * sw + t * dw]
 * (overlapping last vector) */
static inline __attribute__((always_inline)) void cols_op(float *out, const float *buf, long ow, long kw, long sw,
                                                          long dw, const float *div, const int kind) {
    long col = 0;
    if (sw == 1) {
        for (; col < ow && ow >= VW; col += VW) {
            if (col + VW > ow) col = ow - VW;
            vf a = loadv(buf + col);
            for (long t = 1; t < kw; t++) a = comb(a, loadv(buf + col + t * dw), kind);
            storev(out + col, kind == POOL_MAX ? a : a / loadv(div + col));
        }
    } else if (sw == 2) {
        for (; col < ow && ow >= VW; col += VW) {
            if (col + VW > ow) col = ow - VW;
            const float *p = buf + 2 * col;
            vf a = EVENS(loadv(p), loadv(p + VW));
            for (long t = 1; t < kw; t++) a = comb(a, EVENS(loadv(p + t * dw), loadv(p + t * dw + VW)), kind);
            storev(out + col, kind == POOL_MAX ? a : a / loadv(div + col));
        }
    }
    for (; col < ow; col++) {
        float a = buf[col * sw];
        for (long t = 1; t < kw; t++) a = comb1(a, buf[col * sw + t * dw], kind);
        out[col] = kind == POOL_MAX ? a : a / div[col];
    }
}

static inline __attribute__((always_inline)) int pool_rows(const float *x, float *y, const float *counts, long n,
                                                           long c, long h, long wd, long kh, long kw, long sh,
                                                           long sw, long dh, long dw, long pt, long pl, long oh,
                                                           long ow, const int kind) {
    /* the row buffer: pl padding columns, the input's wd, the rest of the widest window read, and 2 VW of
     * slack for the stride-2 loads, all -inf (0) but the wd columns each output row rewrites */
    long need = (ow - 1) * sw + (kw - 1) * dw + 1, len = (need > pl + wd ? need : pl + wd) + 2 * VW;
    const float pad = kind == POOL_MAX ? -__builtin_inff() : 0.f;
    float *buf = malloc(sizeof(float) * (size_t)len);
    const float **src = malloc(sizeof(float *) * (size_t)kh);
    if (!buf || !src) { free(buf); free(src); return -1; }
    for (long i = 0; i < len; i++) buf[i] = pad;
    for (long p = 0; p < n * c; p++) {
        const float *plane = x + p * h * wd;
        float *out = y + p * oh * ow;
        for (long r = 0; r < oh; r++, out += ow) {
            long k = 0;
            for (long i = 0; i < kh; i++) {
                long row = r * sh - pt + i * dh;
                if (row >= 0 && row < h) src[k++] = plane + row * wd;
            }
            if (k == 0) {  /* every row of the window is padding */
                for (long col = 0; col < ow; col++) out[col] = kind == POOL_MAX ? pad : 0.f / counts[r * ow + col];
                continue;
            }
            rows_op(buf + pl, src, k, wd, kind);
            cols_op(out, buf, ow, kw, sw, dw, counts ? counts + r * ow : 0, kind);
        }
    }
    free(buf);
    free((void *)src);
    return 0;
}

int rpcsrv_maxpool_rows_f32(const float *x, float *y, long n, long c, long h, long wd, long kh, long kw,
                            long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow) {
    return pool_rows(x, y, 0, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, POOL_MAX);
}

/* each window's sum divided by counts[oh * OW + ow] (what ONNX's count_include_pad and ceil_mode make it,
 * worked out by pool.py) */
int rpcsrv_avgpool_rows_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd,
                            long kh, long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh,
                            long ow) {
    return pool_rows(x, y, counts, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, POOL_SUM);
}
