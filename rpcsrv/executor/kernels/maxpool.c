/* MaxPool, float32 NCHW, by rows (kernels/plans_ops.py calls it through dwconv.c's rpcsrv_pool_block):
 * per output row, the maximum of its KH input rows into one row buffer (vectors along the width, the
 * padding columns -inf), then each output of the row the maximum of KW values of that buffer; at stride 2
 * the even lanes of two vectors (one shuffle) give VW outputs per tap.  The window's maximum is separable,
 * so this costs KH + KW maxima per output where the phase planes of dwconv.c's average pool cost KH * KW
 * plus the planes' copies (SqueezeNet's 3x3 stride-2 pools: 4-5x onnxruntime's time before).  NaN wins,
 * as numpy's maximum; padding rows and columns never do (-inf).
 */
#include <stdlib.h>

#include "vec.h"

/* max(a, u), u where u is NaN (and a NaN in a stays: u > a is false) */
static inline vf vmaxnan(vf a, vf u) { return vselect((u > a) | (u != u), u, a); }
static inline float maxnan(float a, float u) {  /* no branch (random data mispredicts: 3x the time) */
    int take = (u > a) | (u != u);
    return take ? u : a;
}

/* row[0 .. wd) = the maximum of the rows src[0..k) (each wd long; k >= 1); the last vector overlaps the
 * one before when wd is no whole number of them */
static void rows_max(float *row, const float *const *src, long k, long wd) {
    long j = 0;
    for (; j < wd && wd >= VW; j += VW) {
        if (j + VW > wd) j = wd - VW;
        vf a = loadv(src[0] + j);
        for (long i = 1; i < k; i++) a = vmaxnan(a, loadv(src[i] + j));
        storev(row + j, a);
    }
    for (; j < wd; j++) {
        float a = src[0][j];
        for (long i = 1; i < k; i++) a = maxnan(a, src[i][j]);
        row[j] = a;
    }
}

/* out[0 .. ow) = the maximum over the taps t < kw of buf[col * sw + t * dw] (overlapping last vector) */
static void cols_max(float *out, const float *buf, long ow, long kw, long sw, long dw) {
    long col = 0;
    if (sw == 1) {
        for (; col < ow && ow >= VW; col += VW) {
            if (col + VW > ow) col = ow - VW;
            vf a = loadv(buf + col);
            for (long t = 1; t < kw; t++) a = vmaxnan(a, loadv(buf + col + t * dw));
            storev(out + col, a);
        }
    } else if (sw == 2) {
        for (; col < ow && ow >= VW; col += VW) {
            if (col + VW > ow) col = ow - VW;
            const float *p = buf + 2 * col;
            vf a = EVENS(loadv(p), loadv(p + VW));
            for (long t = 1; t < kw; t++) a = vmaxnan(a, EVENS(loadv(p + t * dw), loadv(p + t * dw + VW)));
            storev(out + col, a);
        }
    }
    for (; col < ow; col++) {
        float a = buf[col * sw];
        for (long t = 1; t < kw; t++) a = maxnan(a, buf[col * sw + t * dw]);
        out[col] = a;
    }
}

int rpcsrv_maxpool_rows_f32(const float *x, float *y, long n, long c, long h, long wd, long kh, long kw,
                            long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow) {
    /* the row buffer: pl padding columns, the input's wd, the rest of the widest window read, and 2 VW of
     * slack for the stride-2 loads, all -inf but the wd columns each output row rewrites */
    long need = (ow - 1) * sw + (kw - 1) * dw + 1, len = (need > pl + wd ? need : pl + wd) + 2 * VW;
    float *buf = malloc(sizeof(float) * (size_t)len);
    const float **src = malloc(sizeof(float *) * (size_t)kh);
    if (!buf || !src) { free(buf); free(src); return -1; }
    for (long i = 0; i < len; i++) buf[i] = -__builtin_inff();
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
                for (long col = 0; col < ow; col++) out[col] = -__builtin_inff();
                continue;
            }
            rows_max(buf + pl, src, k, wd);
            cols_max(out, buf, ow, kw, sw, dw);
        }
    }
    free(buf);
    free((void *)src);
    return 0;
}
