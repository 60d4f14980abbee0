/* Depthwise 2-D convolution, float32 NCHW, VW channels at a time: for small maps (MobileNet's 14x14 and 7x7
 * layers), whose rows of 14 or 7 values fill vectors badly along the width, and whose per-channel loops in
 * dwconv.c's rows kernel cost more than their multiply-adds.
 *
 * The interface stays NCHW.  Per block of VW output channels: the block's input planes are transposed
 * into an L1-resident scratch (PH, PW, VW), channels interleaved, the padding zeros written once (a flat
 * run of VW values of each plane is one VWxVW transpose in registers, each transposed vector stored where
 * its input position lands in the padded scratch: no per-row loops, any width); then each output pixel is
 * one multiply-add per tap over VW channels, eight pixels at a time (eight independent chains), bias
 * first and the activation in registers; the eight pixel vectors are transposed back in registers and
 * stored as eight consecutive outputs of each channel's plane.  The last run of a plane overlaps the one
 * before when the plane is no whole number of runs (recomputed, stored twice: the same values).
 * Lanes past the last channel read a real channel with zero weights, and are not stored.  Channel
 * multiplier m: output channel o reads input channel o / m (ShuffleNet's channel shuffle: read in place).
 * Needs H*W >= VW and OH*OW >= 8 (kernels/conv/plans_conv.py sends smaller maps to the rows kernel).
 */
#include <stdlib.h>

#include "vec.h"

#define RUN 8  /* output pixels per step: independent multiply-add chains (two FMA pipes, latency 4) */
/* 3x3: the 9 weight vectors held in registers over the block, next to the RUN accumulators, where there
 * are 32 vector registers (AVX-512VL, aarch64): 0.9x the time; with 16 (AVX2, SSE, armv7) they spill,
 * 1.05x, so there they are loaded per run */
#if defined(__AVX512VL__) || defined(__aarch64__)
#define HOLD3X3 1
#else
#define HOLD3X3 0
#endif

/* v[0 .. VW-1] transposed in place: v[i] lane j <- v[j] lane i (log2 VW rounds of zipping i with i + VW/2) */
static inline __attribute__((always_inline)) void transpose(vf *v) {
    for (int round = VW; round > 1; round /= 2) {
        vf t[VW];
#pragma GCC unroll 8
        for (int i = 0; i < VW / 2; i++) {
            t[2 * i] = ZIPLO(v[i], v[i + VW / 2]);
            t[2 * i + 1] = ZIPHI(v[i], v[i + VW / 2]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < VW; i++) v[i] = t[i];
    }
}

/* the activation on RUN finished pixel vectors, then transposed (VW pixels at a time) and stored at flat
 * output j of each of `lanes` channel planes */
static inline __attribute__((always_inline)) void finish(float *y, long plane, long j, long lanes, vf *a, int act,
                                                         float lo, float hi) {
#pragma GCC unroll 8
    for (int k = 0; k < RUN; k++) a[k] = actv(a[k], act, lo, hi);
    for (int k0 = 0; k0 < RUN; k0 += VW) {
        transpose(a + k0);
        for (long l = 0; l < lanes; l++) storev(y + l * plane + j + k0, a[k0 + l]);
    }
}

/* RUN output pixels from their scratch positions q[k]: bias, the taps' multiply-adds, finish */
static inline __attribute__((always_inline)) void pixels(float *y, long plane, long j, long lanes,
                                                         const float *const *q, const long *off,
                                                         const float *wv, const float *bv, const long taps,
                                                         int act, float lo, float hi, const vf *held) {
    vf a[RUN];
    vf b = loadv(bv);
#pragma GCC unroll 8
    for (int k = 0; k < RUN; k++) a[k] = b;
#if HOLD3X3
#pragma GCC unroll 9
#endif
    for (long t = 0; t < taps; t++) {
        vf wt = HOLD3X3 && taps == 9 ? held[t] : loadv(wv + t * VW);
        long o = off[t];
#pragma GCC unroll 8
        for (int k = 0; k < RUN; k++) a[k] += wt * loadv(q[k] + o);
    }
    finish(y, plane, j, lanes, a, act, lo, hi);
}

/* The same for RUN pixels side by side in one row, 3x3, stride and dilation 1 along the row: per kernel
 * row, RUN + 2 input vectors loaded once serve its 3 taps (3 * RUN multiply-adds), where each tap of
 * each pixel loaded its own; p: the first pixel's first tap, rowstep: one kernel row further */
static inline __attribute__((always_inline)) void row_run3(float *y, long plane, long j, long lanes,
                                                           const float *p, long rowstep, const float *wv,
                                                           const float *bv, int act, float lo, float hi,
                                                           const vf *held) {
    vf a[RUN];
    vf b = loadv(bv);
#pragma GCC unroll 8
    for (int k = 0; k < RUN; k++) a[k] = b;
#pragma GCC unroll 3
    for (int i = 0; i < 3; i++, p += rowstep) {
        vf v[RUN + 2];
#pragma GCC unroll 10
        for (int u = 0; u < RUN + 2; u++) v[u] = loadv(p + u * VW);
#pragma GCC unroll 3
        for (int t = 0; t < 3; t++) {
            vf wt = HOLD3X3 ? held[i * 3 + t] : loadv(wv + (i * 3 + t) * VW);
#pragma GCC unroll 8
            for (int k = 0; k < RUN; k++) a[k] += wt * v[k + t];
        }
    }
    finish(y, plane, j, lanes, a, act, lo, hi);
}

static inline __attribute__((always_inline)) void block_taps(float *y, long plane, long lanes, const float *buf,
                                                             const long *pix, const long *off, const float *wv,
                                                             const float *bv, const long taps, int act, float lo,
                                                             float hi, int rows3, long oh, long ow, long rowstep) {
    const float *q[RUN];
    vf held[9];
    for (int t = 0; t < 9 && HOLD3X3 && taps == 9; t++) held[t] = loadv(wv + t * VW);
    if (rows3) {  /* 3x3, stride 1 along rows at least RUN wide: runs within rows */
        for (long r = 0; r < oh; r++)
            for (long col = 0; col < ow; col += RUN) {
                if (col + RUN > ow) col = ow - RUN;  /* the row's last run overlaps the one before */
                row_run3(y, plane, r * ow + col, lanes, buf + pix[r * ow + col], rowstep, wv, bv, act, lo, hi,
                         held);
            }
        return;
    }
    for (long j = 0;; j += RUN) {
        if (j + RUN > plane) j = plane - RUN;  /* the last run overlaps the one before */
        for (int k = 0; k < RUN; k++) q[k] = buf + pix[j + k];
        pixels(y, plane, j, lanes, q, off, wv, bv, taps, act, lo, hi, held);
        if (j + RUN >= plane) break;
    }
}

/* the tables of a call: off[taps], each tap's offset in the scratch; then dst[h * wd], each input position's
 * slot (past the padded extent: the spare slot, never read); then pix[oh * ow], each output pixel's first
 * tap */
static void tables(long *off, long h, long wd, long kh, long kw, long sh, long sw, long dh, long dw, long pt,
                   long pl, long oh, long ow) {
    long ph = (oh - 1) * sh + (kh - 1) * dh + 1, pw = (ow - 1) * sw + (kw - 1) * dw + 1;
    long *dst = off + kh * kw, *pix = dst + h * wd;
    for (long i = 0; i < kh; i++)
        for (long j = 0; j < kw; j++) off[i * kw + j] = (i * dh * pw + j * dw) * VW;
    for (long r = 0; r < h; r++)
        for (long col = 0; col < wd; col++) {
            long pr = r + pt, pc = col + pl;
            dst[r * wd + col] = (pr < ph && pc < pw ? pr * pw + pc : ph * pw) * VW;
        }
    for (long r = 0; r < oh; r++)
        for (long col = 0; col < ow; col++) pix[r * ow + col] = (r * sh * pw + col * sw) * VW;
}

/* the VW planes src[] (hw values each) into the scratch, VW values of each at a time: one transpose, each
 * vector stored at its position's slot (the last group overlaps the one before) */
static void interleave(float *buf, const float *const *src, const long *dst, long hw) {
    for (long i = 0;; i += VW) {
        if (i + VW > hw) i = hw - VW;
        vf v[VW];
#pragma GCC unroll 8
        for (int l = 0; l < VW; l++) v[l] = loadv(src[l] + i);
        transpose(v);
#pragma GCC unroll 8
        for (int k = 0; k < VW; k++) storev(buf + dst[i + k], v[k]);
        if (i + VW >= hw) break;
    }
}

int rpcsrv_dwconv2d_chan_f32(const float *x, const float *w, const float *bias, float *y,
                             long n, long c, long h, long wd, long mult, long kh, long kw,
                             long sh, long sw, long dh, long dw, long pt, long pl,
                             long oh, long ow, int act, float lo, float hi, long shuffle) {
    long ph = (oh - 1) * sh + (kh - 1) * dh + 1, pw = (ow - 1) * sw + (kw - 1) * dw + 1;
    long taps = kh * kw, m = c * mult, hw = h * wd, plane = oh * ow;
    /* runs within rows where their overlap at each row's end costs little: 0.92-0.94x the time on 112 and 56
     * wide maps, 1.02-1.04x on 14 and 28 wide ones (14% computed twice) */
    int rows3 = kh == 3 && kw == 3 && sw == 1 && dw == 1 && ow >= RUN && (ow % RUN == 0 || ow >= 6 * RUN);
    if (hw < VW || plane < RUN || pt < 0 || pl < 0) return -2;
    /* the scratch, one spare slot (input positions past the padded extent: never read), the weights and
     * bias of the block; then the tables: tap offsets, each input's slot, each output pixel's first tap */
    float *buf = calloc((size_t)((ph * pw + 1) * VW + taps * VW + VW), sizeof(float));
    long *off = malloc(sizeof(long) * (size_t)(taps + hw + plane));
    if (!buf || !off) { free(buf); free(off); return -1; }
    float *wv = buf + (ph * pw + 1) * VW, *bv = wv + taps * VW;
    const long *dst = off + taps, *pix = dst + hw;
    tables(off, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
    for (long b = 0; b < n; b++)
        for (long o0 = 0; o0 < m; o0 += VW) {
            long lanes = m - o0 < VW ? m - o0 : VW;
            const float *src[VW];
            for (long l = 0; l < VW; l++) {
                long o = o0 + (l < lanes ? l : lanes - 1);  /* a spare lane reads a real channel */
                long ci = o / mult;  /* shuffle > 1: the channel ShuffleNet's shuffle in that many groups puts
                                      * at ci (as dwconv.c's rows kernel reads it) */
                if (shuffle > 1) ci = (ci % shuffle) * (c / shuffle) + ci / shuffle;
                src[l] = x + (b * c + ci) * hw;
                for (long t = 0; t < taps; t++) wv[t * VW + l] = l < lanes ? w[o * taps + t] : 0.f;
                bv[l] = l < lanes && bias ? bias[o] : 0.f;
            }
            interleave(buf, src, dst, hw);
            float *out = y + (b * m + o0) * plane;
            if (taps == 9)  /* 3x3: the taps' loop unrolled */
                block_taps(out, plane, lanes, buf, pix, off, wv, bv, 9, act, lo, hi, rows3, oh, ow, dh * pw * VW);
            else if (taps == 25)
                block_taps(out, plane, lanes, buf, pix, off, wv, bv, 25, act, lo, hi, 0, oh, ow, 0);
            else
                block_taps(out, plane, lanes, buf, pix, off, wv, bv, taps, act, lo, hi, 0, oh, ow, 0);
            if (act == ACT_SWISH) rpcsrv_sigmoid_f32(out, out, lanes * plane, 1);
        }
    free(buf);
    free(off);
    return 0;
}

/* The same with its arguments in the block of dwconv.c's rpcsrv_rows_block (made once per plan by
 * kernels/conv/plans_conv.py; depthwise only: p[19] must be 0). */
int rpcsrv_chan_block(const float *x, float *y, const long *p, const float *f) {
    if (p[19]) return -2;
    return rpcsrv_dwconv2d_chan_f32(x, (const float *)p[0], (const float *)p[1], y, p[2], p[3], p[4], p[5], p[6],
                                    p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], (int)p[17],
                                    f[0], f[1], p[18]);
}

/* MaxPool (counts NULL: the scratch's padding -inf, NaN wins) or AveragePool (the scratch's padding 0, each
 * window's sum divided by counts[oh * OW + ow], as pool.py works them out) of VW planes at a time, as the
 * conv above: for small maps (7x7, 14x14), whose rows pools.c's row loops run scalar or nearly */
int rpcsrv_pool_chan_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd,
                         long kh, long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow) {
    long ph = (oh - 1) * sh + (kh - 1) * dh + 1, pw = (ow - 1) * sw + (kw - 1) * dw + 1;
    long taps = kh * kw, hw = h * wd, plane = oh * ow, planes = n * c;
    if (hw < VW || plane < RUN || pt < 0 || pl < 0) return -2;
    float *buf = malloc(sizeof(float) * (size_t)((ph * pw + 1) * VW));
    long *off = malloc(sizeof(long) * (size_t)(taps + hw + plane));
    if (!buf || !off) { free(buf); free(off); return -1; }
    const float pad = counts ? 0.f : -__builtin_inff();
    for (long i = 0; i < (ph * pw + 1) * VW; i++) buf[i] = pad;
    const long *dst = off + taps, *pix = dst + hw;
    tables(off, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
    for (long p0 = 0; p0 < planes; p0 += VW) {
        long lanes = planes - p0 < VW ? planes - p0 : VW;
        const float *src[VW];
        for (long l = 0; l < VW; l++) src[l] = x + (p0 + (l < lanes ? l : lanes - 1)) * hw;
        interleave(buf, src, dst, hw);
        float *out = y + p0 * plane;
        for (long j = 0;; j += RUN) {
            if (j + RUN > plane) j = plane - RUN;
            vf a[RUN];
#pragma GCC unroll 8
            for (int k = 0; k < RUN; k++) a[k] = loadv(buf + pix[j + k]);
            for (long t = 1; t < taps; t++) {
                long o = off[t];
#pragma GCC unroll 8
                for (int k = 0; k < RUN; k++) {
                    vf u = loadv(buf + pix[j + k] + o);
                    a[k] = counts ? a[k] + u : vmaxnan(a[k], u);
                }
            }
            if (counts) {
#pragma GCC unroll 8
                for (int k = 0; k < RUN; k++) a[k] = a[k] / splat(counts[j + k]);
            }
            finish(out, plane, j, lanes, a, ACT_NONE, 0.f, 0.f);
            if (j + RUN >= plane) break;
        }
    }
    free(buf);
    free(off);
    return 0;
}
