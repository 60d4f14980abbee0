/* A check of dwchan.c (and pools.c's pools by rows) against naive loops, built for other targets by test_dwchan_cross.py and run under
 * qemu-user: its register-held 3x3 weights (aarch64's 32 vector registers), 4-float vectors (NEON, and
 * armv7 without NEON: scalar code from the generic vectors), runs within rows.  Random geometries of the
 * depthwise conv (every fused activation but swish, multipliers, strides, dilation, pads) and of the max
 * and average pools; prints "ok <cases>" and exits 0, or the first mismatch and exits 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int rpcsrv_dwconv2d_chan_f32(const float *x, const float *w, const float *bias, float *y, long n, long c, long h,
                             long wd, long mult, long kh, long kw, long sh, long sw, long dh, long dw, long pt,
                             long pl, long oh, long ow, int act, float lo, float hi, long shuffle);
int rpcsrv_pool_chan_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd, long kh,
                         long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow);
int rpcsrv_maxpool_rows_f32(const float *x, float *y, long n, long c, long h, long wd, long kh, long kw, long sh,
                            long sw, long dh, long dw, long pt, long pl, long oh, long ow);
int rpcsrv_avgpool_rows_f32(const float *x, float *y, const float *counts, long n, long c, long h, long wd, long kh,
                            long kw, long sh, long sw, long dh, long dw, long pt, long pl, long oh, long ow);

static unsigned long long state = 88172645463325252ull;
static long rnd(long lo, long hi) {  /* lo .. hi inclusive */
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return lo + (long)(state % (unsigned long long)(hi - lo + 1));
}
static float rndf(void) { return (float)rnd(-1000, 1000) / 250.f; }

static double act1(double v, int act) {
    if (act == 1) return v < 0 ? 0 : v;
    if (act == 2) return v < 0 ? 0 : v > 6 ? 6 : v;
    if (act == 3) { double g = v / 6 + 0.5; return v * (g < 0 ? 0 : g > 1 ? 1 : g); }
    return v;
}

int main(void) {
    int cases = 0;
    for (int it = 0; it < 300; it++) {
        long c = rnd(1, 21), mult = rnd(1, 3), h = rnd(3, 20), wd = rnd(3, 20), kh = rnd(1, 5), kw = rnd(1, 5);
        long sh = rnd(1, 2), sw = rnd(1, 2), dh = rnd(1, 2), dw = rnd(1, 2), pt = rnd(0, 2), pl = rnd(0, 2);
        if (it % 3 == 0) kh = kw = 3, sw = dw = 1;  /* the runs within rows and the held 3x3 weights */
        long pb = rnd(0, 2), pr = rnd(0, 2);
        long oh = (h + pt + pb - dh * (kh - 1) - 1) / sh + 1, ow = (wd + pl + pr - dw * (kw - 1) - 1) / sw + 1;
        if (oh < 1 || ow < 1 || h * wd < 8 || oh * ow < 8) continue;
        long m = c * mult;
        int act = (int)rnd(0, 3);
        float *x = malloc(sizeof(float) * (size_t)(c * h * wd)), *w = malloc(sizeof(float) * (size_t)(m * kh * kw));
        float *b = malloc(sizeof(float) * (size_t)m), *y = malloc(sizeof(float) * (size_t)(m * oh * ow));
        float *counts = malloc(sizeof(float) * (size_t)(oh * ow));
        for (long i = 0; i < c * h * wd; i++) x[i] = rndf();
        for (long i = 0; i < m * kh * kw; i++) w[i] = rndf();
        for (long i = 0; i < m; i++) b[i] = rndf();
        if (rpcsrv_dwconv2d_chan_f32(x, w, b, y, 1, c, h, wd, mult, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, 0.f,
                                     6.f, 1)) { printf("conv refused case %d\n", it); return 1; }
        for (long o = 0; o < m; o++)
            for (long r = 0; r < oh; r++)
                for (long q = 0; q < ow; q++) {
                    double s = b[o];
                    for (long i = 0; i < kh; i++)
                        for (long j = 0; j < kw; j++) {
                            long ir = r * sh - pt + i * dh, ic = q * sw - pl + j * dw;
                            if (ir >= 0 && ir < h && ic >= 0 && ic < wd)
                                s += (double)w[(o * kh + i) * kw + j] * x[((o / mult) * h + ir) * wd + ic];
                        }
                    double want = act1(s, act), got = y[(o * oh + r) * ow + q];
                    if (fabs(got - want) > 1e-4 * (1 + fabs(want))) {
                        printf("conv case %d (c %ld m %ld %ldx%ld k %ldx%ld s %ld,%ld d %ld,%ld p %ld,%ld act %d) at "
                               "%ld,%ld,%ld: %g, want %g\n", it, c, mult, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, act, o,
                               r, q, got, want);
                        return 1;
                    }
                }
        for (int kind = 0; kind < 4; kind++) {  /* max, average; channels side by side, by rows */
            int avg = kind & 1, rc;
            for (long i = 0; i < oh * ow; i++) counts[i] = (float)rnd(1, 9);
            if (kind < 2)
                rc = rpcsrv_pool_chan_f32(x, y, avg ? counts : 0, 1, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
            else if (avg)
                rc = rpcsrv_avgpool_rows_f32(x, y, counts, 1, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
            else
                rc = rpcsrv_maxpool_rows_f32(x, y, 1, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
            if (rc) {
                printf("pool refused case %d\n", it);
                return 1;
            }
            for (long o = 0; o < c; o++)
                for (long r = 0; r < oh; r++)
                    for (long q = 0; q < ow; q++) {
                        double s = avg ? 0 : -INFINITY;
                        for (long i = 0; i < kh; i++)
                            for (long j = 0; j < kw; j++) {
                                long ir = r * sh - pt + i * dh, ic = q * sw - pl + j * dw;
                                if (ir >= 0 && ir < h && ic >= 0 && ic < wd) {
                                    double v = x[(o * h + ir) * wd + ic];
                                    s = avg ? s + v : v > s ? v : s;
                                }
                            }
                        double want = avg ? s / counts[r * ow + q] : s, got = y[(o * oh + r) * ow + q];
                        if (!(fabs(got - want) <= 1e-5 * (1 + fabs(want))) && !(isinf(want) && got == want)) {
                            printf("%s pool (%s) case %d at %ld,%ld,%ld: %g, want %g\n", avg ? "average" : "max",
                                   kind < 2 ? "channels" : "rows", it, o, r, q, got, want);
                            return 1;
                        }
                    }
        }
        free(x), free(w), free(b), free(y), free(counts);
        cases++;
    }
    printf("ok %d\n", cases);
    return 0;
}
