/* tests/kernels/test_int8_cross.py's check of the int8 kernels (kernels/quant/qgemm*.c, qconv.c) on other targets
 * (cross-compiled, run under qemu-user; and here): for every micro-kernel of the build that the CPU runs (x86:
 * AVX-512 VNNI, AVX-VNNI, AVX-512VL VNNI, AVX2; aarch64: dotprod, NEON; armv7: NEON; generic C), the GEMM against
 * exact integer sums (the types' extremes on every product: 255 x -128 over depths to 4099), with uint8 and int8
 * activations and weights, weight zero points, a bias, and the requantization (clamp, round half to even, zero
 * point) against the same rule in plain C; dense and depthwise convs against naive loops.  Prints "ok N" (N:
 * the checks) or the first mismatch; exit status 1 on any. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qgemm.h"

const char *rpcsrv_qgemm_kernel_name(long i, long *supported);
long rpcsrv_qgemm_select(long i);
long rpcsrv_qgemm_packed_size(long k, long n);
void rpcsrv_qgemm_pack(const int8_t *w, long k, long n, long sk, long sn, long flip, int8_t *out);
int rpcsrv_qgemm(const long *g, const uint8_t *a, long m, long lda, long asigned, long za, float ascale, void *y,
                 long ldy);
int rpcsrv_qconv(const long *g, const long *geom, const uint8_t *x, void *y);
int rpcsrv_qdwconv(const long *dg, const long *geom, const uint8_t *x, uint8_t *y);

static uint32_t state = 2463534242u;
static long rnd(long lo, long hi) /* uniform in [lo, hi] */
{
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    return lo + (long)(state % (uint32_t)(hi - lo + 1));
}

static long checks, failures;
static void expect(int ok, const char *what, long i, long got, long want)
{
    checks++;
    if (!ok && failures++ < 5)
        printf("%s: element %ld is %ld, want %ld\n", what, i, got, want);
}

static long requant(int64_t t, float mult, long yzp, long lo, long hi)
{
    float f = (float)t * mult, flo = (float)(lo - yzp), fhi = (float)(hi - yzp);
    f = f < flo ? flo : f > fhi ? fhi : f;
    return (long)nearbyintf(f) + yzp;
}

/* a GEMM of m x k uint8/int8 by k x n int8/uint8 weights; mode 0: random with zero points, bias, int32 and
 * requantized outputs; 1: the types' extremes, int32 output */
static void gemm_check(const char *kname, long m, long k, long n, int asigned, int wunsigned, int mode)
{
    long kp = (k + 3) / 4 * 4, g[QG_SIZE];
    uint8_t *a = malloc((size_t)(m * k)), *wraw = malloc((size_t)(k * n));
    int8_t *packed = malloc((size_t)rpcsrv_qgemm_packed_size(k, n));
    int32_t *bias = malloc(sizeof(int32_t) * (size_t)n), *colsum = calloc((size_t)n, 4), *bzp = malloc(4 * (size_t)n);
    float *mult = malloc(sizeof(float) * (size_t)n);
    int32_t *y32 = malloc(4 * (size_t)(m * n));
    uint8_t *y8 = malloc((size_t)(m * n));
    const long alo = asigned ? -128 : 0, ahi = asigned ? 127 : 255, wlo = wunsigned ? 0 : -128, whi = wlo + 255;
    const long av = mode ? (rnd(0, 1) ? alo : ahi) : 0, wv = mode ? (rnd(0, 1) ? wlo : whi) : 0;
    const long za = mode ? 0 : rnd(alo, ahi);
    for (long i = 0; i < m * k; i++)
        a[i] = (uint8_t)(mode ? av : rnd(alo, ahi));
    for (long i = 0; i < k * n; i++)
        wraw[i] = (uint8_t)(mode ? wv : rnd(wlo, whi));
    int any_zp = 0;
    for (long j = 0; j < n; j++) {  /* the weights as packed (int8: uint8 ones less 128), their zero points too */
        long z = mode ? 0 : rnd(wlo, whi);
        bzp[j] = (int32_t)(wunsigned ? z - 128 : z);
        any_zp |= bzp[j] != 0;
        for (long kk = 0; kk < k; kk++)
            colsum[j] += wunsigned ? (int32_t)wraw[kk * n + j] - 128 : (int32_t)(int8_t)wraw[kk * n + j];
        bias[j] = mode ? 0 : (int32_t)rnd(-20000, 20000);
        mult[j] = mode ? 1.0f : (float)ldexp(1.0, -(int)rnd(4, 12)) * (float)rnd(1, 3);
    }
    rpcsrv_qgemm_pack((const int8_t *)wraw, k, n, n, 1, wunsigned ? 0x80 : 0, packed);
    for (int out = QOUT_U8; out <= QOUT_I32; out++) {
        if (mode && out != QOUT_I32)
            continue;
        long lo = out == QOUT_U8 ? 0 : -128, hi = out == QOUT_U8 ? 255 : 127, yzp = out == QOUT_U8 ? 100 : -7;
        const long fields[QG_SIZE] = {n, k, kp, (long)packed, (long)bias, (long)colsum, any_zp ? (long)bzp : 0,
                                      (long)mult, 0, out, yzp, lo, hi, (long)(state & 1)};  /* (either store) */
        memcpy(g, fields, sizeof g);
        void *y = out == QOUT_I32 ? (void *)y32 : (void *)y8;
        if (rpcsrv_qgemm(g, a, m, k, asigned, za, 1.0f, y, n) != 0) {
            expect(0, "rpcsrv_qgemm failed", 0, 0, 0);
            break;
        }
        for (long i = 0; i < m; i++)
            for (long j = 0; j < n; j++) {
                int64_t t = bias[j];
                for (long kk = 0; kk < k; kk++) {
                    long x = asigned ? (int8_t)a[i * k + kk] : a[i * k + kk];
                    long wq = wunsigned ? wraw[kk * n + j] : (int8_t)wraw[kk * n + j];
                    t += (int64_t)(x - za) * (wq - (wunsigned ? bzp[j] + 128 : bzp[j]));
                }
                long want = out == QOUT_I32 ? (long)t : requant(t, mult[j], yzp, lo, hi);
                long got = out == QOUT_I32 ? y32[i * n + j] : out == QOUT_U8 ? (long)y8[i * n + j] : (int8_t)y8[i * n + j];
                expect(got == want, kname, i * n + j, got, want);
            }
    }
    free(a), free(wraw), free(packed), free(bias), free(colsum), free(bzp), free(mult), free(y32), free(y8);
}

/* dense (group 1) and depthwise convs of channels-last uint8 input against naive loops */
static void conv_check(const char *kname, long c, long m, long hw, long kk, long stride, long pad, int depthwise)
{
    const long o = (hw + 2 * pad - kk) / stride + 1, taps = kk * kk, k = depthwise ? taps : c * taps;
    const long za = rnd(0, 255), yzp = rnd(0, 255), cp = (c + 31) / 32 * 32;
    uint8_t *x = malloc((size_t)(hw * hw * c)), *y = malloc((size_t)(o * o * m));
    int8_t *w = malloc((size_t)(m * k)), *bmat = malloc((size_t)(k * m));
    int8_t *packed = malloc((size_t)rpcsrv_qgemm_packed_size(k, m));
    int32_t *bias = malloc(4 * (size_t)cp), *colsum = calloc((size_t)m, 4), *w32 = malloc(4 * (size_t)(taps * c));
    int16_t *w16 = calloc((size_t)((taps + 1) / 2 * 2 * cp), 2);
    int32_t *bias16 = calloc((size_t)cp, 4);
    float *mult = malloc(4 * (size_t)cp), *mult16 = calloc((size_t)cp, 4);
    for (long i = 0; i < hw * hw * c; i++)
        x[i] = (uint8_t)rnd(0, 255);
    for (long i = 0; i < m * k; i++)  /* w[oc][ky][kx][ic] (depthwise: w[c][ky][kx]) */
        w[i] = (int8_t)rnd(-128, 127);
    for (long j = 0; j < m; j++) {
        bias[j] = (int32_t)rnd(-5000, 5000);
        mult[j] = (float)ldexp(1.0, -(int)rnd(8, 12)) * (float)rnd(1, 3);
        for (long i = 0; i < k; i++) {
            bmat[i * m + j] = w[j * k + i];
            colsum[j] += w[j * k + i];
        }
    }
    long geom[17] = {1, hw, hw, c, kk, kk, stride, stride, 1, 1, pad, pad, o, o, 0, za, 0};
    int rc;
    if (depthwise) {
        static const int order[32] = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23,
                                      8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
        for (long t = 0; t < taps; t++)
            for (long ch = 0; ch < c; ch++)
                w32[t * c + ch] = w[ch * taps + t];
        for (long slot = 0; slot < cp; slot++) {  /* qpack.PackedDepthwise's AVX-512 layout */
            long ch = slot / 32 * 32 + order[slot % 32];
            if (ch >= c)
                continue;
            bias16[slot] = bias[ch], mult16[slot] = mult[ch];
            for (long t = 0; t < taps; t++) {
                w16[((t / 2) * cp + slot) * 2 + t % 2] = (int16_t)w32[t * c + ch];
                bias16[slot] -= (int32_t)za * w32[t * c + ch];  /* (every tap summed, padded ones at the zero point) */
            }
        }
        const long dg[DG_SIZE] = {(long)w32, (long)bias, (long)mult, QOUT_U8, yzp, 0, 255, (long)w16, (long)bias16,
                                    (long)mult16, cp};
        rc = rpcsrv_qdwconv(dg, geom, x, y);
    } else {
        rpcsrv_qgemm_pack(bmat, k, m, m, 1, 0, packed);
        const long g[QG_SIZE] = {m, k, (k + 3) / 4 * 4, (long)packed, (long)bias, (long)colsum, 0, (long)mult, 0,
                                 QOUT_U8, yzp, 0, 255};
        rc = rpcsrv_qconv(g, geom, x, y);
    }
    expect(rc == 0, "conv failed", 0, rc, 0);
    for (long oy = 0; oy < o; oy++)
        for (long ox = 0; ox < o; ox++)
            for (long j = 0; j < m; j++) {
                int64_t t = bias[j];
                for (long ky = 0; ky < kk; ky++)
                    for (long kx = 0; kx < kk; kx++) {
                        long iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                        if (iy < 0 || iy >= hw || ix < 0 || ix >= hw)
                            continue;
                        for (long ic = depthwise ? j : 0; ic < (depthwise ? j + 1 : c); ic++)
                            t += (int64_t)((long)x[(iy * hw + ix) * c + ic] - za) *
                                 w[depthwise ? j * taps + ky * kk + kx : j * k + (ky * kk + kx) * c + ic];
                    }
                expect(y[(oy * o + ox) * m + j] == requant(t, mult[j], yzp, 0, 255), kname, (oy * o + ox) * m + j,
                       y[(oy * o + ox) * m + j], requant(t, mult[j], yzp, 0, 255));
            }
    free(x), free(y), free(w), free(bmat), free(packed), free(bias), free(colsum), free(w32), free(w16), free(bias16);
    free(mult), free(mult16);
}

int main(void)
{
    long kernels = 0, supported;
    for (long i = 0; rpcsrv_qgemm_kernel_name(i, &supported); i++) {
        const char *name = rpcsrv_qgemm_kernel_name(i, &supported);
        if (!supported || rpcsrv_qgemm_select(i) != 0)
            continue;
        kernels++;
        static const long sizes[][3] = {{1, 1, 1}, {7, 3, 17}, {13, 64, 70}, {6, 4099, 33}, {50, 300, 129}};
        for (int s = 0; s < 5; s++)
            for (int types = 0; types < 4; types++)
                for (int mode = 0; mode < 2; mode++)
                    gemm_check(name, sizes[s][0], sizes[s][1], sizes[s][2], types & 1, types >> 1, mode);
        conv_check(name, 3, 16, 15, 3, 2, 1, 0);
        conv_check(name, 12, 20, 9, 1, 1, 0, 0);
        conv_check(name, 8, 8, 7, 5, 1, 2, 0);
        conv_check(name, 48, 48, 11, 3, 1, 1, 1);
        conv_check(name, 40, 40, 10, 3, 2, 1, 1);
        conv_check(name, 7, 7, 6, 5, 1, 2, 1);
    }
    if (failures) {
        printf("%ld of %ld checks failed\n", failures, checks);
        return 1;
    }
    printf("ok %ld (%ld kernels)\n", checks, kernels);
    return 0;
}
