/* Depthwise 2-D convolution, float32 NCHW, for rpcsrv's numpy executor (kernels/clib/compiled.py builds this
 * file with the board's C compiler at first use and loads it with ctypes; the numpy kernel in
 * depthwise.py stays the fallback).
 *
 * Per input channel: the padded plane is copied into sh * sw phase planes (padded row a*sh + p, column
 * b*sw + q goes to phase (p, q) at (a, b)), so every kernel tap of every output reads one contiguous run of
 * a phase plane: output (oh, ow) at flat index j = oh * QW + ow, tap (kh, kw) at j + its offset.  The
 * columns ow >= OW of each flat row are computed and dropped.  Outputs are accumulated in runs of 8, 4, 2
 * or 1 vectors held in registers over all taps (8 independent multiply-add chains keep both FMA pipes of a
 * core busy), bias first, the activation applied in registers, then copied row by row into the output.
 * Channel multiplier m: output channel o reads input channel o / m.
 */
#include <stdlib.h>
#include <string.h>

#include "vec.h"

#define BLOCK 32  /* a multiple of every VW: rounds the accumulator's length up */

/* Rows of ow outputs from the flat accumulator (rows qw apart, activation already applied); each row in
 * vectors, the last one overlapping the one before when the row is no whole number of them, or a short
 * loop when it is narrower than a vector (a memcpy call per row cost more than the copy: 10-20%). */
static inline void copy(float *dst, const float *src, long count) {  /* a short run: no memcpy call */
    if (count >= VW) {
        long j = 0;
        for (; j + VW <= count; j += VW) storev(dst + j, loadv(src + j));
        if (j < count) storev(dst + count - VW, loadv(src + count - VW));
    } else {
        for (long j = 0; j < count; j++) dst[j] = src[j];
    }
}

static void store(float *dst, const float *acc, long oh, long ow, long qw) {
    for (long r = 0; r < oh; r++, dst += ow, acc += qw) copy(dst, acc, ow);
}

/* dst[k] = src[k * step] for k < count (a column phase); stride 2 by pairs of vectors deinterleaved. */
static void gather(float *dst, const float *src, long count, long step) {
    long k = 0;
    if (step == 2) {  /* reads src[2k .. 2k + 2 VW - 1]: within the last column read, 2 (count - 1) */
        for (; k + VW + 1 <= count; k += VW) storev(dst + k, EVENS(loadv(src + 2 * k), loadv(src + 2 * k + VW)));
    }
    for (; k < count; k++) dst[k] = src[k * step];
}

/* acc[j0 ..] = bias + the taps' multiply-adds over nv vectors from flat position j0, in registers (nv is a
 * constant at each call: the function is inlined and its loops unrolled) */
static inline __attribute__((always_inline)) void taps_run(float *acc, const float *buf, const long *off,
                                                           const float *wo, long taps, float bo, long j0,
                                                           const int nv, int act, float lo, float hi) {
    vf a[8];
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) a[v] = splat(bo);
    for (long t = 0; t < taps; t++) {
        const float *s = buf + off[t] + j0;
        vf wt = splat(wo[t]);
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) a[v] += wt * loadv(s + v * VW);
    }
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) storev(acc + j0 + v * VW, actv(a[v], act, lo, hi));
}

/* The phase-plane geometry of one call (see the top of the file), for cg planes side by side: the tap
 * offsets (cg * kh * kw, in the weights' (ci, i, j) order), and where each input row and column phase
 * lands, worked out once (integer divisions cost more than the copies they place when done per channel);
 * rowat[r] < 0: the row lies past the phase planes. */
typedef struct {
    long qw, plane, chplanes, len, padded, *off, *rowat, *pcol, *pdst, *pcnt;
} geom;

static int geom_init(geom *g, long cg, long h, long wd, long kh, long kw, long sh, long sw, long dh, long dw,
                     long pt, long pl, long oh, long ow) {
    long qw = ((ow - 1) * sw + (kw - 1) * dw) / sw + 1;  /* phase width: the widest column a tap reads + 1 */
    long maxu = 0;
    for (long i = 0; i < kh; i++)
        if ((i * dh) / sh > maxu) maxu = (i * dh) / sh;
    long qh = oh + maxu + 1;  /* phase rows, one more for the last flat row's overrun */
    g->qw = qw;
    g->plane = qh * qw;
    g->chplanes = sh * sw * g->plane;
    g->len = oh * qw;
    g->padded = (g->len + BLOCK - 1) / BLOCK * BLOCK;
    g->off = malloc(sizeof(long) * (size_t)(cg * kh * kw + h + 3 * sw));
    if (!g->off) return -1;
    g->rowat = g->off + cg * kh * kw;
    g->pcol = g->rowat + h;
    g->pdst = g->pcol + sw;
    g->pcnt = g->pdst + sw;
    for (long r = 0; r < h; r++) {
        long pr = r + pt, a = pr / sh;
        g->rowat[r] = a >= qh ? -1 : (pr % sh) * sw * g->plane + a * qw;
    }
    for (long q = 0; q < sw; q++) {  /* phase q: padded columns bq * sw + q */
        long col = ((q - pl) % sw + sw) % sw;  /* the first input column of that phase */
        long bq = (col + pl) / sw;
        long end = (wd - col + sw - 1) / sw;  /* the phase's columns in a row */
        if (end > qw - bq) end = qw - bq;
        g->pcol[q] = col;
        g->pdst[q] = q * g->plane + bq;
        g->pcnt[q] = end;
    }
    for (long ci = 0; ci < cg; ci++)
        for (long i = 0; i < kh; i++)
            for (long j = 0; j < kw; j++) {
                long r = i * dh, s = j * dw;
                g->off[(ci * kh + i) * kw + j] = ci * g->chplanes + ((r % sh) * sw + (s % sw)) * g->plane
                                                 + (r / sh) * qw + s / sw;
            }
    return 0;
}

/* one input plane (h, wd) into its phase planes at dst (the padding positions are left as they are) */
static void fill_phases(const geom *g, float *dst, const float *src, long h, long wd, long sw) {
    for (long r = 0; r < h; r++) {
        if (g->rowat[r] < 0) break;
        float *rowbase = dst + g->rowat[r];
        const float *in = src + r * wd;
        for (long q = 0; q < sw; q++) {
            if (g->pcnt[q] <= 0) continue;
            if (sw == 1) memcpy(rowbase + g->pdst[q], in, sizeof(float) * (size_t)g->pcnt[q]);
            else gather(rowbase + g->pdst[q], in + g->pcol[q], g->pcnt[q], sw);
        }
    }
}

/* The rows kernel for a conv of g groups of cg input channels and mult outputs each (depthwise: cg = 1, g =
 * C; a dense conv of few input channels, a stem: g = 1, cg = C): the group's cg planes are split into
 * phases side by side, and an output's taps run over all of them (cg * kh * kw offsets). */
/* Four outputs that read the same phase planes (a stem's output channels, a channel multiplier) at once:
 * each input vector loaded feeds four multiply-adds, where one output at a time loads one vector per
 * multiply-add and is bound by the loads (a stem's 27 taps read 12 phase planes from L2).  acc holds the
 * four flat accumulators, `stride` apart; wo the four outputs' weights, t apart. */
static inline __attribute__((always_inline)) void taps_run4(float *acc, long stride, const float *buf,
                                                            const long *off, const float *wo, long t,
                                                            const float *bo, long j0, const int nv, int act,
                                                            float lo, float hi) {
    vf a[4][2];
    const vf zero = {0};
    for (int k = 0; k < 4; k++) a[k][0] = a[k][1] = splat(bo[k]);
    for (long tt = 0; tt < t; tt++) {
        const float *s = buf + off[tt] + j0;
        vf x0 = loadv(s), x1 = nv > 1 ? loadv(s + VW) : zero;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            vf wk = splat(wo[k * t + tt]);
            a[k][0] += wk * x0;
            if (nv > 1) a[k][1] += wk * x1;
        }
    }
    for (int k = 0; k < 4; k++) {
        storev(acc + k * stride + j0, actv(a[k][0], act, lo, hi));
        if (nv > 1) storev(acc + k * stride + j0 + VW, actv(a[k][1], act, lo, hi));
    }
}

static int conv_rows(const float *x, const float *w, const float *bias, float *y,
                     long n, long g, long cg, long h, long wd, long mult, long kh, long kw,
                     long sh, long sw, long dh, long dw, long pt, long pl,
                     long oh, long ow, int act, float lo, float hi, long shuffle) {
    geom gm;
    if (geom_init(&gm, cg, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)) return -1;
    /* the phase planes of cg channels (zeroed once: every group writes the same positions), BLOCK values of
     * slack for the last block's reads, and the flat accumulator */
    float *buf = calloc((size_t)(cg * gm.chplanes + BLOCK + 4 * gm.padded), sizeof(float));
    if (!buf) { free(gm.off); return -1; }
    float *acc = buf + cg * gm.chplanes + BLOCK;  /* four flat accumulators, padded apart */
    long t = cg * kh * kw, nvec = (gm.len + VW - 1) / VW;
    for (long b = 0; b < n; b++)
        for (long gi = 0; gi < g; gi++) {
            /* shuffle > 1 (depthwise only): group gi reads the channel ShuffleNet's shuffle in that many
             * groups puts there, (gi % shuffle) * (g / shuffle) + gi / shuffle, with no shuffled copy */
            long src = shuffle > 1 ? (gi % shuffle) * (g / shuffle) + gi / shuffle : gi;
            for (long ci = 0; ci < cg; ci++)
                fill_phases(&gm, buf + ci * gm.chplanes, x + (b * g * cg + src * cg + ci) * h * wd, h, wd, sw);
            long m = 0;
            for (; m + 4 <= mult; m += 4) {  /* outputs four at a time, then one at a time */
                long o = gi * mult + m, v0 = 0;
                float bo[4];
                for (int k = 0; k < 4; k++) bo[k] = bias ? bias[o + k] : 0.f;
                for (; v0 + 2 <= nvec; v0 += 2)
                    taps_run4(acc, gm.padded, buf, gm.off, w + o * t, t, bo, v0 * VW, 2, act, lo, hi);
                if (v0 < nvec) taps_run4(acc, gm.padded, buf, gm.off, w + o * t, t, bo, v0 * VW, 1, act, lo, hi);
                for (int k = 0; k < 4; k++) {
                    float *plane = y + (b * g * mult + o + k) * oh * ow;
                    store(plane, acc + k * gm.padded, oh, ow, gm.qw);
                    if (act == ACT_SWISH) rpcsrv_sigmoid_f32(plane, plane, oh * ow, 1);
                }
            }
            for (; m < mult; m++) {
                long o = gi * mult + m, v0 = 0;
                const float *wo = w + o * t;
                float bo = bias ? bias[o] : 0.f;
                /* runs of 8 vectors (8 independent multiply-add chains: enough to keep both FMA pipes busy),
                 * then 4, 2, 1: no more than VW - 1 computed-and-dropped values at the end of the plane */
                for (; v0 + 8 <= nvec; v0 += 8) taps_run(acc, buf, gm.off, wo, t, bo, v0 * VW, 8, act, lo, hi);
                if (nvec - v0 >= 4) { taps_run(acc, buf, gm.off, wo, t, bo, v0 * VW, 4, act, lo, hi); v0 += 4; }
                if (nvec - v0 >= 2) { taps_run(acc, buf, gm.off, wo, t, bo, v0 * VW, 2, act, lo, hi); v0 += 2; }
                if (nvec - v0 >= 1) taps_run(acc, buf, gm.off, wo, t, bo, v0 * VW, 1, act, lo, hi);
                float *plane = y + (b * g * mult + o) * oh * ow;
                store(plane, acc, oh, ow, gm.qw);
                if (act == ACT_SWISH) rpcsrv_sigmoid_f32(plane, plane, oh * ow, 1);
            }
        }
    free(buf);
    free(gm.off);
    return 0;
}

/* acc[j0 ..] = the maximum (is_max; NaN wins, as numpy's) or the sum over the taps of nv vectors from flat
 * position j0 (both constants where it is inlined, so each use compiles to its own loop) */
static inline __attribute__((always_inline)) void reduce_run(float *acc, const float *buf, const long *off,
                                                             long taps, long j0, const int nv, const int is_max) {
    vf a[8];
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) a[v] = loadv(buf + off[0] + j0 + v * VW);
    for (long t = 1; t < taps; t++) {
        const float *s = buf + off[t] + j0;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            vf u = loadv(s + v * VW);
            a[v] = is_max ? vselect((u > a[v]) | (u != u), u, a[v]) : a[v] + u;
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) storev(acc + j0 + v * VW, a[v]);
}

/* reduce_run over nvec vectors: blocks of 8, then one of 4, 2 and 1 as they fit (each nv a constant, so that
 * the always-inlined run unrolls) */
#define OVER_VECTORS(is_max, acc, buf, off, taps, nvec)                                                              \
    do {                                                                                                             \
        long v0_ = 0;                                                                                                \
        for (; v0_ + 8 <= (nvec); v0_ += 8) reduce_run(acc, buf, off, taps, v0_ * VW, 8, is_max);                    \
        if ((nvec) - v0_ >= 4) { reduce_run(acc, buf, off, taps, v0_ * VW, 4, is_max); v0_ += 4; }                   \
        if ((nvec) - v0_ >= 2) { reduce_run(acc, buf, off, taps, v0_ * VW, 2, is_max); v0_ += 2; }                   \
        if ((nvec) - v0_ >= 1) reduce_run(acc, buf, off, taps, v0_ * VW, 1, is_max);                                 \
    } while (0)

/* AveragePool of x (N, C, H, W), float32, by the same phase planes (padding: 0): each window's sum divided
 * by counts[oh * OW + ow] (what ONNX's count_include_pad and ceil_mode make it, worked out by pool.py). */
int rpcsrv_avgpool2d_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd,
                         long kh, long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow) {
    geom gm;
    if (geom_init(&gm, 1, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)) return -1;
    float *buf = calloc((size_t)(gm.chplanes + BLOCK + gm.padded), sizeof(float));
    if (!buf) { free(gm.off); return -1; }
    float *acc = buf + gm.chplanes + BLOCK;
    long taps = kh * kw, nvec = (gm.len + VW - 1) / VW;
    for (long p = 0; p < n * c; p++) {
        fill_phases(&gm, buf, x + p * h * wd, h, wd, sw);
        OVER_VECTORS(0, acc, buf, gm.off, taps, nvec);
        float *dst = y + p * oh * ow;
        for (long r = 0; r < oh; r++)
            for (long j = 0; j < ow; j++) dst[r * ow + j] = acc[r * gm.qw + j] / counts[r * ow + j];
    }
    free(buf);
    free(gm.off);
    return 0;
}

/* MaxPool of x (N, C, H, W), float32, by the same phase planes (padding: -inf, which never wins). */
int rpcsrv_maxpool2d_f32(const float *x, float *y, long n, long c, long h, long wd, long kh, long kw,
                         long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow) {
    geom gm;
    if (geom_init(&gm, 1, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)) return -1;
    float *buf = malloc(sizeof(float) * (size_t)(gm.chplanes + BLOCK + gm.padded));
    if (!buf) { free(gm.off); return -1; }
    for (long i = 0; i < gm.chplanes + BLOCK; i++) buf[i] = -__builtin_inff();
    float *acc = buf + gm.chplanes + BLOCK;
    long taps = kh * kw, nvec = (gm.len + VW - 1) / VW;
    for (long p = 0; p < n * c; p++) {
        fill_phases(&gm, buf, x + p * h * wd, h, wd, sw);
        OVER_VECTORS(1, acc, buf, gm.off, taps, nvec);
        store(y + p * oh * ow, acc, oh, ow, gm.qw);
    }
    free(buf);
    free(gm.off);
    return 0;
}

int rpcsrv_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y,
                        long n, long c, long h, long wd, long mult, long kh, long kw,
                        long sh, long sw, long dh, long dw, long pt, long pl,
                        long oh, long ow, int act, float lo, float hi, long shuffle) {
    return conv_rows(x, w, bias, y, n, c, 1, h, wd, mult, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, lo, hi,
                     shuffle);
}

/* A dense (ungrouped) conv of x (N, C, H, W) with w (M, C, KH, KW) by the rows kernel: for stems, whose
 * few input channels make im2col's column matrix and a GEMM of inner size C*KH*KW <= 27 cost more. */
int rpcsrv_conv2d_rows_f32(const float *x, const float *w, const float *bias, float *y,
                           long n, long c, long h, long wd, long m, long kh, long kw,
                           long sh, long sw, long dh, long dw, long pt, long pl,
                           long oh, long ow, int act, float lo, float hi) {
    return conv_rows(x, w, bias, y, n, 1, c, h, wd, m, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, lo, hi, 1);
}

/* The rows kernels and the pools with their arguments in blocks made once per plan (kernels/conv/plans_conv.py,
 * kernels/pool/plans_pool.py): a
 * ctypes call converts every argument it is given, 3 us for 23 of them and several times that inside a
 * model run, where the interpreter's code is cold; these take 4.  p (longs; pointers fit a long on the
 * LP64 and ILP32 boards): w, bias (0: none), n, c, h, wd, per group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
 * act, shuffle, dense (1: a stem, c channels in one group; 0: depthwise); f: lo, hi. */
int rpcsrv_rows_block(const float *x, float *y, const long *p, const float *f) {
    const float *w = (const float *)p[0], *bias = (const float *)p[1];
    if (p[19]) return conv_rows(x, w, bias, y, p[2], 1, p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11],
                                p[12], p[13], p[14], p[15], p[16], (int)p[17], f[0], f[1], 1);
    return conv_rows(x, w, bias, y, p[2], p[3], 1, p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12],
                     p[13], p[14], p[15], p[16], (int)p[17], f[0], f[1], p[18]);
}

/* pools.c: the pools by rows (separable: KH + KW operations per output, where phase planes cost KH * KW) */
int rpcsrv_maxpool_rows_f32(const float *x, float *y, long n, long c, long h, long wd, long kh, long kw,
                            long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow);
int rpcsrv_avgpool_rows_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd,
                            long kh, long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh,
                            long ow);
/* dwchan.c: the pools VW channels side by side (small maps); -2 when it does not take the shape */
int rpcsrv_pool_chan_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd,
                         long kh, long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow);

/* p: counts (0: a max pool, else an average pool's divisors), n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl,
 * oh, ow */
int rpcsrv_pool_block(const float *x, float *y, const long *p) {
    /* as measured (bench/pools_bench.py, 1 thread; chan / rows / phase planes, us): VW channels side by side
     * (dwchan.c) for max pools under 2 VW outputs wide (7x7x1024 s1 55 / 403 / 96, 14x14x576 s1 112 / 130
     * / 154, s2 41 / 156 / 142) and average pools on padded planes up to 30x30 (28x28x320 s1 119 / 165 /
     * 201, 7x7x1024 34 / 206 / 87); else by rows (pools.c) at strides up to 2 (max 111x111x64 s2 257 / 164 /
     * 313, 28x28x320 s1 224 / 183 / 269; average 56x56x192 s2 146 / 125 / 221), where rows more than VW
     * wide keep them out of scalar loops; else the phase planes */
    long sw = p[8], oh = p[13], ow = p[14];
    long ph = (oh - 1) * p[7] + (p[5] - 1) * p[9] + 1, pw = (ow - 1) * sw + (p[6] - 1) * p[10] + 1;
    const float *counts = (const float *)p[0];
    if (counts ? ph * pw <= 30 * 30 : ow < 2 * VW) {
        int rc = rpcsrv_pool_chan_f32(x, y, counts, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
                                      p[11], p[12], p[13], p[14]);
        if (rc != -2) return rc;  /* -2: a plane too small for it */
    }
    if (counts && sw <= 2)
        return rpcsrv_avgpool_rows_f32(x, y, counts, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
                                       p[11], p[12], p[13], p[14]);
    if (!counts && sw <= 2 && ow > VW)
        return rpcsrv_maxpool_rows_f32(x, y, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11],
                                       p[12], p[13], p[14]);
    if (counts) return rpcsrv_avgpool2d_f32(x, y, counts, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9],
                                            p[10], p[11], p[12], p[13], p[14]);
    return rpcsrv_maxpool2d_f32(x, y, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12],
                                p[13], p[14]);
}
