/* Depthwise 2-D convolution, float32 NCHW, for rpcsrv's numpy executor (kernels/compiled.py builds this
 * file with the board's C compiler at first use and loads it with ctypes; the numpy kernel in
 * depthwise.py stays the fallback).
 *
 * Per input channel: the padded plane is copied into sh * sw phase planes (padded row a*sh + p, column
 * b*sw + q goes to phase (p, q) at (a, b)), so every kernel tap of every output reads one contiguous run of
 * a phase plane: output (oh, ow) at flat index j = oh * QW + ow, tap (kh, kw) at j + its offset.  The
 * columns ow >= OW of each flat row are computed and dropped.  Outputs are accumulated in blocks of BLOCK
 * values (a loop the compiler vectorises), then written with the bias and the activation.
 * Channel multiplier m: output channel o reads input channel o / m.
 */
#include <stdlib.h>
#include <string.h>

#define BLOCK 64

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2, ACT_HARDSWISH = 3 };

static inline float activate(float v, int act, float lo, float hi) {
    switch (act) {
    case ACT_RELU: return v > 0.f ? v : 0.f;
    case ACT_CLIP: return v < lo ? lo : (v > hi ? hi : v);
    case ACT_HARDSWISH: {
        float g = v * (1.f / 6.f) + 0.5f;
        g = g < 0.f ? 0.f : (g > 1.f ? 1.f : g);
        return v * g;
    }
    default: return v;
    }
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
    float *buf = malloc(sizeof(float) * (size_t)(phases * plane));
    long *off = malloc(sizeof(long) * (size_t)taps);
    if (!buf || !off) { free(buf); free(off); return -1; }
    for (long i = 0; i < kh; i++)
        for (long j = 0; j < kw; j++) {
            long r = i * dh, s = j * dw;
            off[i * kw + j] = ((r % sh) * sw + (s % sw)) * plane + (r / sh) * qw + s / sw;
        }
    float acc[BLOCK];
    for (long b = 0; b < n; b++)
        for (long ci = 0; ci < c; ci++) {
            const float *src = x + (b * c + ci) * h * wd;
            memset(buf, 0, sizeof(float) * (size_t)(phases * plane));
            for (long r = 0; r < h; r++) {
                long pr = r + pt;
                long a = pr / sh;
                if (a >= qh) break;
                float *rowbase = buf + (pr % sh) * sw * plane + a * qw;
                const float *in = src + r * wd;
                if (sw == 1) {
                    long c0 = pl, cnt = wd;
                    if (c0 + cnt > qw) cnt = qw - c0;
                    if (cnt > 0) memcpy(rowbase + c0, in, sizeof(float) * (size_t)cnt);
                } else {
                    for (long col = 0; col < wd; col++) {
                        long pc = col + pl, bq = pc / sw;
                        if (bq < qw) rowbase[(pc % sw) * plane + bq] = in[col];
                    }
                }
            }
            for (long m = 0; m < mult; m++) {
                long o = ci * mult + m;
                const float *wo = w + o * taps;
                float bo = bias ? bias[o] : 0.f;
                float *dst = y + (b * c * mult + o) * oh * ow;
                for (long j0 = 0; j0 < len; j0 += BLOCK) {
                    long cnt = len - j0 < BLOCK ? len - j0 : BLOCK;
                    for (long j = 0; j < BLOCK; j++) acc[j] = bo;
                    for (long t = 0; t < taps; t++) {
                        const float *s = buf + off[t] + j0;
                        float wt = wo[t];
                        if (cnt == BLOCK) {
                            for (long j = 0; j < BLOCK; j++) acc[j] += wt * s[j];
                        } else {
                            for (long j = 0; j < cnt; j++) acc[j] += wt * s[j];
                        }
                    }
                    long r = j0 / qw, col = j0 - r * qw;
                    for (long j = 0; j < cnt; j++) {
                        if (col < ow) dst[r * ow + col] = activate(acc[j], act, lo, hi);
                        if (++col == qw) { col = 0; r++; }
                    }
                }
            }
        }
    free(buf);
    free(off);
    return 0;
}
