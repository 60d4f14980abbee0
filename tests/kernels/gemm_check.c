/* tests/kernels/test_gemm.py's check of kernels/conv/gemm.c on other targets (cross-compiled, run under qemu):
 * rpcsrv_gemm_f32 against a naive double loop, every activation, a scale, a residual and a bias, sizes that
 * are no multiple of the tile (MR x NR of the target) nor of the packing blocks; then rpcsrv_matmul_f32
 * (x @ w + a bias per column) the same way, and rpcsrv_gemm_conv (with im2col.c) against a naive conv.  Prints
 * "ok MR" or the first mismatches; exit status 1 on any. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

long rpcsrv_gemm_mr(void);
void rpcsrv_gemm_pack_w(const float *w, float *wp, long m, long k);
int rpcsrv_gemm_conv(const float *x, float *y, const long *p, const long *g, const float *f);
int rpcsrv_gemm_f32(const float *wp, const float *x, const float *s, const float *r, const float *bias, float *y,
                    long m, long k, long q, int act, float lo, float hi);
long rpcsrv_gemm_nr(void);
void rpcsrv_gemm_pack_b(const float *w, float *bp, long k, long n);
int rpcsrv_matmul_f32(const float *x, const float *bp, const float *bias, float *y, long rows, long k, long n,
                      int act, float lo, float hi);

static unsigned state = 12345u;
static double act_ref(double v, int act) {
    if (act == 1) v = v < 0 ? 0 : v;
    if (act == 2) v = v < -0.5 ? -0.5 : v > 0.5 ? 0.5 : v;
    if (act == 3) {
        double g = v / 6 + 0.5;
        v *= g < 0 ? 0 : g > 1 ? 1 : g;
    }
    if (act == 4) v = v / (1 + exp(-v));
    return v;
}

static float rnd(void) { /* uniform in [-1, 1) */
    state = state * 1103515245u + 12345u;
    return (float)((state >> 8) & 0xffff) / 32768.f - 1.f;
}

/* rpcsrv_gemm_conv (the column matrix packed straight from the input) against a naive conv: stride 2 and 1,
 * dilation, asymmetric pads, outputs that are no multiple of the tile, relu */
static int conv_check(long mr) {
    static const long geos[][9] = {/* c, m, h, w, kh, kw, stride, dilation, pad top (left = top + 1) */
                                   {5, 11, 11, 9, 3, 3, 2, 1, 1}, {3, 7, 13, 17, 5, 5, 1, 2, 2}, {9, 13, 8, 7, 3, 3, 1, 1, 0}};
    int bad = 0;
    for (int t = 0; t < 3; t++) {
        const long c = geos[t][0], m = geos[t][1], h = geos[t][2], w = geos[t][3], kh = geos[t][4], kw = geos[t][5];
        const long st = geos[t][6], dl = geos[t][7], pt = geos[t][8], pl = pt + 1, k = c * kh * kw;
        const long oh = (h + 2 * pt - dl * (kh - 1) - 1) / st + 1, ow = (w + pt + pl - dl * (kw - 1) - 1) / st + 1;
        float *x = malloc(sizeof(float) * c * h * w), *wt = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * m);
        float *y = malloc(sizeof(float) * m * oh * ow), *wp = malloc(sizeof(float) * (((m + mr - 1) / mr * mr) * k + 8));
        for (long i = 0; i < c * h * w; i++) x[i] = rnd();
        for (long i = 0; i < m * k; i++) wt[i] = rnd();
        for (long i = 0; i < m; i++) b[i] = rnd();
        rpcsrv_gemm_pack_w(wt, wp, m, k);
        const long geo[14] = {c, h, w, kh, kw, st, st, dl, dl, pt, pl, ow, 0, oh};
        const long p[7] = {(long)wp, (long)b, m, k, 0, 1, oh * ow};
        const float f[2] = {0.f, 0.f};
        if (rpcsrv_gemm_conv(x, y, p, geo, f) != 0) return 1;
        for (long o = 0; o < m; o++)
            for (long r = 0; r < oh; r++)
                for (long q = 0; q < ow; q++) {
                    double v = b[o];
                    for (long ci = 0; ci < c; ci++)
                        for (long i = 0; i < kh; i++)
                            for (long j = 0; j < kw; j++) {
                                const long yy = r * st + i * dl - pt, xx = q * st + j * dl - pl;
                                if (yy >= 0 && yy < h && xx >= 0 && xx < w)
                                    v += (double)wt[((o * c + ci) * kh + i) * kw + j] * x[(ci * h + yy) * w + xx];
                            }
                    v = v < 0 ? 0 : v;
                    const float got = y[(o * oh + r) * ow + q];
                    if (fabs(v - got) > 1e-4 * (1 + fabs(v)) && bad++ < 5)
                        printf("conv %d at (%ld, %ld, %ld): %g, want %g\n", t, o, r, q, got, v);
                }
        free(x), free(wt), free(b), free(y), free(wp);
    }
    return bad;
}

int main(void) {
    static const long shapes[][3] = {{1, 1, 1}, {3, 7, 17}, {17, 49, 33}, {9, 3, 1031}, {40, 400, 50}, {7, 800, 77}};
    const long mr = rpcsrv_gemm_mr();
    int bad = 0;
    for (int t = 0; t < 6; t++)
        for (int act = 0; act < 5; act++) {
            const long m = shapes[t][0], k = shapes[t][1], q = shapes[t][2];
            float *w = malloc(sizeof(float) * m * k), *x = malloc(sizeof(float) * k * q);
            float *r = malloc(sizeof(float) * m * q), *b = malloc(sizeof(float) * m), *s = malloc(sizeof(float) * k);
            float *y = malloc(sizeof(float) * m * q), *wp = malloc(sizeof(float) * (((m + mr - 1) / mr * mr) * k + 8));
            for (long i = 0; i < m * k; i++) w[i] = rnd();
            for (long i = 0; i < k * q; i++) x[i] = rnd();
            for (long i = 0; i < m * q; i++) r[i] = rnd();
            for (long i = 0; i < m; i++) b[i] = rnd();
            for (long i = 0; i < k; i++) s[i] = rnd();
            rpcsrv_gemm_pack_w(w, wp, m, k);
            if (rpcsrv_gemm_f32(wp, x, s, r, b, y, m, k, q, act, -0.5f, 0.5f) != 0) return 2;
            for (long i = 0; i < m; i++)
                for (long j = 0; j < q; j++) {
                    double v = 0;
                    for (long p = 0; p < k; p++) v += (double)w[i * k + p] * x[p * q + j] * s[p];
                    v = act_ref(v + r[i * q + j] + b[i], act);
                    if (fabs(v - y[i * q + j]) > 1e-4 * (1 + fabs(v)) && bad++ < 5)
                        printf("m %ld k %ld q %ld act %d at (%ld, %ld): %g, want %g\n", m, k, q, act, i, j, y[i * q + j],
                               v);
                }
            free(w), free(x), free(r), free(b), free(s), free(y), free(wp);
        }
    for (int t = 0; t < 6; t++) /* the MatMul: rows = m, n = q, x (m x k) @ w (k x n) + b[n] */
        for (int act = 0; act < 5; act++) {
            const long m = shapes[t][0], k = shapes[t][1], n = shapes[t][2], np = (n + rpcsrv_gemm_nr() - 1) /
                                                                                 rpcsrv_gemm_nr() * rpcsrv_gemm_nr();
            float *x = malloc(sizeof(float) * m * k), *w = malloc(sizeof(float) * k * n), *b = malloc(sizeof(float) * n);
            float *y = malloc(sizeof(float) * m * n), *bp = malloc(sizeof(float) * np * k);
            for (long i = 0; i < m * k; i++) x[i] = rnd();
            for (long i = 0; i < k * n; i++) w[i] = rnd();
            for (long i = 0; i < n; i++) b[i] = rnd();
            rpcsrv_gemm_pack_b(w, bp, k, n);
            if (rpcsrv_matmul_f32(x, bp, b, y, m, k, n, act, -0.5f, 0.5f) != 0) return 2;
            for (long i = 0; i < m; i++)
                for (long j = 0; j < n; j++) {
                    double v = 0;
                    for (long p = 0; p < k; p++) v += (double)x[i * k + p] * w[p * n + j];
                    v = act_ref(v + b[j], act);
                    if (fabs(v - y[i * n + j]) > 1e-4 * (1 + fabs(v)) && bad++ < 5)
                        printf("matmul rows %ld k %ld n %ld act %d at (%ld, %ld): %g, want %g\n", m, k, n, act, i, j,
                               y[i * n + j], v);
                }
            free(x), free(w), free(b), free(y), free(bp);
        }
    bad += conv_check(mr);
    if (!bad) printf("ok %ld\n", mr);
    return bad != 0;
}
