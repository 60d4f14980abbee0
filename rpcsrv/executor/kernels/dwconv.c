/* Depthwise 2-D convolution, float32 NCHW, for rpcsrv's numpy executor (kernels/compiled.py builds this
 * file with the board's C compiler at first use and loads it with ctypes; the numpy kernel in
 * depthwise.py stays the fallback).
 *
 * Per input channel: the padded plane is copied into sh * sw phase planes (padded row a*sh + p, column
 * b*sw + q goes to phase (p, q) at (a, b)), so every kernel tap of every output reads one contiguous run of
 * a phase plane: output (oh, ow) at flat index j = oh * QW + ow, tap (kh, kw) at j + its offset.  The
 * columns ow >= OW of each flat row are computed and dropped.  Outputs are accumulated in blocks of BLOCK
 * values held in registers over all taps (loops the compiler vectorises and unrolls), bias first, and
 * written row by row with the activation.
 * Channel multiplier m: output channel o reads input channel o / m.
 */
#include <stdlib.h>
#include <string.h>

#define BLOCK 32

/* Vectors in GCC/clang's generic vector extension: 8 floats where the target has AVX, else 4 (SSE, NEON);
 * BLOCK values are held in BLOCK / VW of them, in registers, over all taps.  (Plain loops left this to the
 * auto-vectoriser, whose choices varied 3.6x with the flags.) */
#if defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
#define NV (BLOCK / VW)
typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4), may_alias));

static inline vf loadv(const float *p) { return *(const vfu *)p; }
static inline void storev(float *p, vf v) { *(vfu *)p = v; }

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2, ACT_HARDSWISH = 3, ACT_SWISH = 4 };

/* sigmoid.c: y = x * sigmoid(x) (times_x 1), in place when y == x; SiLU runs over a channel's finished
 * plane (or a packed group's planes), long runs for its vector loop */
void rpcsrv_sigmoid_f32(const float *x, float *y, long count, int times_x);

static inline float act1(float v, int act, float lo, float hi) {
    if (act == ACT_RELU) return v < 0.f ? 0.f : v;
    if (act == ACT_CLIP) { v = v < lo ? lo : v; return v > hi ? hi : v; }
    if (act == ACT_HARDSWISH) {
        float g = v * (1.f / 6.f) + 0.5f;
        g = g < 0.f ? 0.f : g;
        return v * (g > 1.f ? 1.f : g);
    }
    return v;
}

/* Rows of ow outputs from the flat accumulator (rows qw apart), with the activation: one loop per
 * activation so that each vectorises. */
static void store(float *dst, const float *acc, long oh, long ow, long qw, int act, float lo, float hi) {
    for (long r = 0; r < oh; r++, dst += ow, acc += qw) {
        if (act == ACT_RELU) {
            for (long j = 0; j < ow; j++) dst[j] = acc[j] < 0.f ? 0.f : acc[j];  /* NaN stays NaN */
        } else if (act == ACT_CLIP) {  /* NaN stays NaN, as np.clip */
            for (long j = 0; j < ow; j++) {
                float v = acc[j];
                v = v < lo ? lo : v;
                dst[j] = v > hi ? hi : v;
            }
        } else if (act == ACT_HARDSWISH) {
            for (long j = 0; j < ow; j++) {
                float v = acc[j], g = v * (1.f / 6.f) + 0.5f;
                g = g < 0.f ? 0.f : g;
                g = g > 1.f ? 1.f : g;
                dst[j] = v * g;
            }
        } else {
            memcpy(dst, acc, sizeof(float) * (size_t)ow);
        }
    }
}

/* dst[k] = src[k * step] for k < count (a column phase); stride 2 by pairs of vectors deinterleaved. */
static void gather(float *dst, const float *src, long count, long step) {
    long k = 0;
    if (step == 2 && VW == 8) {
        for (; k + 9 <= count; k += 8) {  /* reads src[2k .. 2k + 15], within the last column */
            float tmp[16];
            memcpy(tmp, src + 2 * k, sizeof tmp);
            for (int i = 0; i < 8; i++) dst[k + i] = tmp[2 * i];
        }
    }
    for (; k < count; k++) dst[k] = src[k * step];
}

int rpcsrv_dwconv2d_f32(const float *x, const float *w, const float *bias, float *y,
                        long n, long c, long h, long wd, long mult, long kh, long kw,
                        long sh, long sw, long dh, long dw, long pt, long pl,
                        long oh, long ow, int act, float lo, float hi) {
    long qw = ((ow - 1) * sw + (kw - 1) * dw) / sw + 1;  /* phase width: the widest column a tap reads + 1 */
    long maxu = 0;
    for (long i = 0; i < kh; i++)
        if ((i * dh) / sh > maxu) maxu = (i * dh) / sh;
    long qh = oh + maxu + 1;  /* phase rows, one more for the last flat row's overrun */
    long plane = qh * qw, phases = sh * sw, taps = kh * kw, len = oh * qw;
    long padded = (len + BLOCK - 1) / BLOCK * BLOCK;
    /* the phase planes (zeroed once: every channel writes the same positions), BLOCK values of slack for
     * the last block's reads, and the flat accumulator */
    float *buf = calloc((size_t)(phases * plane + BLOCK + padded), sizeof(float));
    long *off = malloc(sizeof(long) * (size_t)taps);
    if (!buf || !off) { free(buf); free(off); return -1; }
    float *acc = buf + phases * plane + BLOCK;
    for (long i = 0; i < kh; i++)
        for (long j = 0; j < kw; j++) {
            long r = i * dh, s = j * dw;
            off[i * kw + j] = ((r % sh) * sw + (s % sw)) * plane + (r / sh) * qw + s / sw;
        }
    for (long b = 0; b < n; b++)
        for (long ci = 0; ci < c; ci++) {
            const float *src = x + (b * c + ci) * h * wd;
            for (long r = 0; r < h; r++) {
                long pr = r + pt, a = pr / sh;
                if (a >= qh) break;
                float *rowbase = buf + (pr % sh) * sw * plane + a * qw;
                const float *in = src + r * wd;
                for (long q = 0; q < sw; q++) {  /* phase q: padded columns bq * sw + q */
                    long col = ((q - pl) % sw + sw) % sw;  /* the first input column of that phase */
                    long bq = (col + pl) / sw;
                    float *dst = rowbase + q * plane;
                    if (sw == 1) {
                        long cnt = wd < qw - bq ? wd : qw - bq;
                        if (cnt > 0) memcpy(dst + bq, in, sizeof(float) * (size_t)cnt);
                    } else {
                        long end = (wd - col + sw - 1) / sw;  /* the phase's columns in this row */
                        if (end > qw - bq) end = qw - bq;
                        gather(dst + bq, in + col, end, sw);
                    }
                }
            }
            for (long m = 0; m < mult; m++) {
                long o = ci * mult + m;
                const float *wo = w + o * taps;
                float bo = bias ? bias[o] : 0.f;
                for (long j0 = 0; j0 < len; j0 += BLOCK) {
                    vf a[NV];
#pragma GCC unroll 8
                    for (int v = 0; v < NV; v++) a[v] = (vf){0} + bo;
                    for (long t = 0; t < taps; t++) {
                        const float *s = buf + off[t] + j0;
                        vf wt = (vf){0} + wo[t];
#pragma GCC unroll 8
                        for (int v = 0; v < NV; v++) a[v] += wt * loadv(s + v * VW);
                    }
#pragma GCC unroll 8
                    for (int v = 0; v < NV; v++) storev(acc + j0 + v * VW, a[v]);
                }
                float *plane = y + (b * c * mult + o) * oh * ow;
                store(plane, acc, oh, ow, qw, act, lo, hi);
                if (act == ACT_SWISH) rpcsrv_sigmoid_f32(plane, plane, oh * ow, 1);
            }
        }
    free(buf);
    free(off);
    return 0;
}

/* The same convolution with VW output channels side by side (small planes, where a plane's rows are too
 * short for the per-channel loops above): the padded input of VW channels is interleaved once, (PH, PW,
 * VW), so each tap of an output pixel is one vector load and one multiply-add for VW channels, at any
 * stride or dilation, with no computed-and-dropped columns.  Outputs are scattered back to NCHW with the
 * activation.  Lanes past the last channel compute zeros and are not stored. */
int rpcsrv_dwconv2d_packed_f32(const float *x, const float *w, const float *bias, float *y,
                               long n, long c, long h, long wd, long mult, long kh, long kw,
                               long sh, long sw, long dh, long dw, long pt, long pl,
                               long oh, long ow, int act, float lo, float hi) {
    long ph = (oh - 1) * sh + (kh - 1) * dh + 1, pw = (ow - 1) * sw + (kw - 1) * dw + 1;
    long taps = kh * kw, m = c * mult, groups = (m + VW - 1) / VW;
    float *buf = calloc((size_t)(ph * pw * VW + taps * VW + VW), sizeof(float));
    long *off = malloc(sizeof(long) * (size_t)taps);
    if (!buf || !off) { free(buf); free(off); return -1; }
    float *wv = buf + ph * pw * VW, *bv = wv + taps * VW;
    for (long i = 0; i < kh; i++)
        for (long j = 0; j < kw; j++) off[i * kw + j] = ((i * dh) * pw + j * dw) * VW;
    long r0 = pt > 0 ? 0 : -pt, r1 = h < ph - pt ? h : ph - pt;   /* input rows inside the padded extent */
    long c0 = pl > 0 ? 0 : -pl, c1 = wd < pw - pl ? wd : pw - pl;
    for (long b = 0; b < n; b++)
        for (long g = 0; g < groups; g++) {
            long o0 = g * VW, lanes = m - o0 < VW ? m - o0 : VW;
            for (long l = 0; l < lanes; l++) {
                const float *src = x + (b * c + (o0 + l) / mult) * h * wd;
                for (long r = r0; r < r1; r++) {
                    float *dst = buf + ((r + pt) * pw + pl) * VW + l;
                    for (long col = c0; col < c1; col++) dst[col * VW] = src[r * wd + col];
                }
                for (long t = 0; t < taps; t++) wv[t * VW + l] = w[(o0 + l) * taps + t];
                bv[l] = bias ? bias[o0 + l] : 0.f;
            }
            for (long l = lanes; l < VW; l++) {  /* unused lanes: zero weights (their inputs are stale) */
                for (long t = 0; t < taps; t++) wv[t * VW + l] = 0.f;
                bv[l] = 0.f;
            }
            float *dst = y + (b * m + o0) * oh * ow;
            for (long r = 0; r < oh; r++)
                for (long col = 0; col < ow; col++) {
                    const float *p = buf + ((r * sh) * pw + col * sw) * VW;
                    vf a = loadv(bv);
                    for (long t = 0; t < taps; t++) a += loadv(wv + t * VW) * loadv(p + off[t]);
                    float out[VW];
                    storev(out, a);
                    long k = r * ow + col;
                    for (long l = 0; l < lanes; l++) dst[l * oh * ow + k] = act1(out[l], act, lo, hi);
                }
            if (act == ACT_SWISH) rpcsrv_sigmoid_f32(dst, dst, lanes * oh * ow, 1);
        }
    free(buf);
    free(off);
    return 0;
}
