/* Winograd F(4x4, 3x3) input and output transforms, float32, for rpcsrv's numpy executor (winograd.py does
 * the rest: the transformed weights, the 36 batched GEMMs through numpy's BLAS).  Built with the other
 * kernels by kernels/clib/compiled.py.
 *
 * F(2x2, 3x3) (winograd.c) spends 75-88% of its time in its 16 GEMMs on ResNet-50's and Inception's 3x3
 * layers; F(4x4, 3x3) computes each 4x4 output tile from a 6x6 input tile with 36 multiplies per channel
 * pair, 1.78x fewer GEMM flops (and a smaller transformed input: 2.25 values per input value, not 4), at the
 * price of larger transform coefficients (points 0, +-1, +-2; the error is bounded by the tests).
 *
 * Input: per channel, each padded row is split into its 4 column phases (column 4 j + s at [s][j]), so the
 * vertical half of B^T d B runs over the 6 rows of a tile row and the horizontal half over VW tiles at a
 * time, both on contiguous vectors (tile j's columns 4 j + 4 and 4 j + 5 are phases 0 and 1 at j + 1).
 * Output: A^T m A for VW tiles at a time from the 36 contiguous product planes, the bias and the fused
 * activation, the 4 columns of each tile interleaved through a small buffer into two-dimensional rows.
 */
#include <stdlib.h>
#include <string.h>

#include "vec.h"

/* one column of B^T d (or one row of (B^T d) B): o0..o5 from v0..v5 */
#define BT6(v0, v1, v2, v3, v4, v5, o0, o1, o2, o3, o4, o5) do { \
        o0 = 4.f * v0 - 5.f * v2 + v4; \
        o1 = -4.f * (v1 + v2) + v3 + v4; \
        o2 = 4.f * (v1 - v2) - v3 + v4; \
        o3 = 2.f * (v3 - v1) - v2 + v4; \
        o4 = 2.f * (v1 - v3) - v2 + v4; \
        o5 = 4.f * v1 - 5.f * v3 + v5; \
    } while (0)

/* v (36, C, N * th * tw): B^T d B of the 6x6 tiles (stride 4) of x (N, C, H, W) padded by pt rows above and pl
 * columns on the left (pads >= 0; the padded plane is 4 th + 2 by 4 tw + 4, anything of x past it is not
 * read).  Returns -1 when out of memory. */
int rpcsrv_wino4_in_f32(const float *x, float *v, long n, long c, long h, long wd, long pt, long pl, long th,
                        long tw) {
    const long ph = 4 * th + 2, pw = 4 * (tw + 1), lp = tw + 1 + VW, tiles = n * th * tw, k36 = c * tiles;
    /* the padded rows' 4 column phases (ph rows of lp each), then one padded row, then 6 x 4 rows of B^T d */
    float *buf = calloc((size_t)(4 * ph * lp + pw + 24 * lp), sizeof(float));
    if (!buf) return -1;
    float *row = buf + 4 * ph * lp, *t = row + pw;
    const long rows = h < ph - pt ? h : ph - pt, cols = wd < pw - pl ? wd : pw - pl;
    for (long b = 0; b < n; b++)
        for (long ci = 0; ci < c; ci++) {
            const float *src = x + (b * c + ci) * h * wd;
            for (long r = 0; r < ph; r++) {  /* the phases of padded row r */
                memset(row, 0, sizeof(float) * (size_t)pw);
                if (r >= pt && r - pt < rows) memcpy(row + pl, src + (r - pt) * wd, sizeof(float) * (size_t)cols);
                float *f0 = buf + r * lp, *f1 = f0 + ph * lp, *f2 = f1 + ph * lp, *f3 = f2 + ph * lp;
                long j = 0;
                for (; j + VW <= tw + 1; j += VW) {  /* four-way deinterleave: two rounds of even/odd */
                    const float *q = row + 4 * j;
                    const vf l0 = loadv(q), l1 = loadv(q + VW), l2 = loadv(q + 2 * VW), l3 = loadv(q + 3 * VW);
                    const vf e0 = EVENS(l0, l1), o0 = ODDS(l0, l1), e1 = EVENS(l2, l3), o1 = ODDS(l2, l3);
                    storev(f0 + j, EVENS(e0, e1));
                    storev(f1 + j, EVENS(o0, o1));
                    storev(f2 + j, ODDS(e0, e1));
                    storev(f3 + j, ODDS(o0, o1));
                }
                for (; j < tw + 1; j++) {
                    f0[j] = row[4 * j];
                    f1[j] = row[4 * j + 1];
                    f2[j] = row[4 * j + 2];
                    f3[j] = row[4 * j + 3];
                }
            }
            float *out = v + ci * tiles + b * th * tw;
            for (long i = 0; i < th; i++, out += tw) {
                for (int s = 0; s < 4; s++) {  /* B^T d per phase: t[(r * 4 + s) * lp + j] */
                    const float *d = buf + (s * ph + 4 * i) * lp;
                    float *o = t + s * lp;
                    for (long j = 0; j < tw + 1; j += VW) {  /* (rows are lp >= tw + 1 + VW long) */
                        const vf d0 = loadv(d + j), d1 = loadv(d + lp + j), d2 = loadv(d + 2 * lp + j);
                        const vf d3 = loadv(d + 3 * lp + j), d4 = loadv(d + 4 * lp + j), d5 = loadv(d + 5 * lp + j);
                        vf r0, r1, r2, r3, r4, r5;
                        BT6(d0, d1, d2, d3, d4, d5, r0, r1, r2, r3, r4, r5);
                        storev(o + j, r0);
                        storev(o + 4 * lp + j, r1);
                        storev(o + 8 * lp + j, r2);
                        storev(o + 12 * lp + j, r3);
                        storev(o + 16 * lp + j, r4);
                        storev(o + 20 * lp + j, r5);
                    }
                }
                for (int r = 0; r < 6; r++) {  /* (B^T d) B over the tiles of the row */
                    const float *p0 = t + 4 * r * lp, *p1 = p0 + lp, *p2 = p1 + lp, *p3 = p2 + lp;
                    float *o0 = out + 6 * r * k36, *o1 = o0 + k36, *o2 = o1 + k36, *o3 = o2 + k36;
                    float *o4 = o3 + k36, *o5 = o4 + k36;
                    long j = 0;
                    for (; j + VW <= tw; j += VW) {
                        vf a0 = loadv(p0 + j), a1 = loadv(p1 + j), a2 = loadv(p2 + j), a3 = loadv(p3 + j);
                        vf a4 = loadv(p0 + j + 1), a5 = loadv(p1 + j + 1), r0, r1, r2, r3, r4, r5;
                        BT6(a0, a1, a2, a3, a4, a5, r0, r1, r2, r3, r4, r5);
                        storev(o0 + j, r0);
                        storev(o1 + j, r1);
                        storev(o2 + j, r2);
                        storev(o3 + j, r3);
                        storev(o4 + j, r4);
                        storev(o5 + j, r5);
                    }
                    for (; j < tw; j++)
                        BT6(p0[j], p1[j], p2[j], p3[j], p0[j + 1], p1[j + 1], o0[j], o1[j], o2[j], o3[j], o4[j],
                            o5[j]);
                }
            }
        }
    free(buf);
    return 0;
}

/* 64-bit lanes (pairs of floats) of a and b interleaved, low and high halves: with ZIPLO/ZIPHI, the 4-way
 * interleave of a tile row's four output columns */
#if VW == 8 || VW == 4
typedef double vd __attribute__((vector_size(VW * 4)));
typedef long long vdmask __attribute__((vector_size(VW * 4)));
#if defined(__clang__)
#if VW == 8
#define ZIP64LO(a, b) (vf) __builtin_shufflevector((vd)(a), (vd)(b), 0, 4, 1, 5)
#define ZIP64HI(a, b) (vf) __builtin_shufflevector((vd)(a), (vd)(b), 2, 6, 3, 7)
#else
#define ZIP64LO(a, b) (vf) __builtin_shufflevector((vd)(a), (vd)(b), 0, 2)
#define ZIP64HI(a, b) (vf) __builtin_shufflevector((vd)(a), (vd)(b), 1, 3)
#endif
#else
#if VW == 8
#define ZIP64LO(a, b) (vf) __builtin_shuffle((vd)(a), (vd)(b), (vdmask){0, 4, 1, 5})
#define ZIP64HI(a, b) (vf) __builtin_shuffle((vd)(a), (vd)(b), (vdmask){2, 6, 3, 7})
#else
#define ZIP64LO(a, b) (vf) __builtin_shuffle((vd)(a), (vd)(b), (vdmask){0, 2})
#define ZIP64HI(a, b) (vf) __builtin_shuffle((vd)(a), (vd)(b), (vdmask){1, 3})
#endif
#endif
#endif

/* one column of A^T m (or one row of (A^T m) A) */
#define AT4(m0, m1, m2, m3, m4, m5, o0, o1, o2, o3) do { \
        const vf s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4; \
        o0 = m0 + s12 + s34; \
        o1 = d12 + 2.f * d34; \
        o2 = s12 + 4.f * s34; \
        o3 = d12 + 8.f * d34 + m5; \
    } while (0)

/* y (N, M, OH, OW) = A^T p A of the products p (36, M, N * th * tw), cropped to OH <= 4 th, OW <= 4 tw, plus
 * the bias (optional) and through the fused activation.  Returns -1 when out of memory. */
int rpcsrv_wino4_out_f32(const float *p, float *y, const float *bias, long n, long m, long th, long tw,
                         long oh, long ow, int act, float lo, float hi) {
    const long tiles = n * th * tw, k36 = m * tiles, tv = (tw + VW - 1) / VW * VW;
    /* four output rows of 4 tv columns (before the crop), and 36 planes of tv tiles (the last block's copy) */
    float *rows = malloc(sizeof(float) * (size_t)(16 * tv + 36 * VW));
    if (!rows) return -1;
    float *pad = rows + 16 * tv;
    for (long b = 0; b < n; b++)
        for (long mo = 0; mo < m; mo++) {
            const float *src = p + mo * tiles + b * th * tw;
            const float bo = bias ? bias[mo] : 0.f;
            const vf vb = splat(bo);
            float *plane = y + (b * m + mo) * oh * ow;
            for (long i = 0; i < th; i++, src += tw) {
                for (long j = 0; j < tw; j += VW) {
                    const float *q = src + j;  /* plane k at q + k * ld */
                    long ld = k36;
                    if (j + VW > tw) {  /* the last tiles, through a zero-padded copy */
                        memset(pad, 0, sizeof(float) * 36 * VW);
                        for (int k = 0; k < 36; k++)
                            memcpy(pad + k * VW, src + k * k36 + j, sizeof(float) * (size_t)(tw - j));
                        q = pad;
                        ld = VW;
                    }
                    vf c[4][6];
                    for (int s = 0; s < 6; s++)
                        AT4(loadv(q + s * ld), loadv(q + (6 + s) * ld), loadv(q + (12 + s) * ld),
                            loadv(q + (18 + s) * ld), loadv(q + (24 + s) * ld), loadv(q + (30 + s) * ld), c[0][s],
                            c[1][s], c[2][s], c[3][s]);
                    for (int a = 0; a < 4; a++) {
                        vf o[4];
                        AT4(c[a][0], c[a][1], c[a][2], c[a][3], c[a][4], c[a][5], o[0], o[1], o[2], o[3]);
                        for (int e = 0; e < 4; e++) o[e] = actv(o[e] + vb, act, lo, hi);
                        float *dst = rows + a * 4 * tv + 4 * j;
#ifdef ZIP64LO
                        const vf z01 = ZIPLO(o[0], o[1]), z23 = ZIPLO(o[2], o[3]);
                        const vf h01 = ZIPHI(o[0], o[1]), h23 = ZIPHI(o[2], o[3]);
                        storev(dst, ZIP64LO(z01, z23));
                        storev(dst + VW, ZIP64HI(z01, z23));
                        storev(dst + 2 * VW, ZIP64LO(h01, h23));
                        storev(dst + 3 * VW, ZIP64HI(h01, h23));
#else
                        float lanes[4][VW];
                        for (int e = 0; e < 4; e++) storev(lanes[e], o[e]);
                        for (int l = 0; l < VW; l++)
                            for (int e = 0; e < 4; e++) dst[4 * l + e] = lanes[e][l];
#endif
                    }
                }
                for (int a = 0; a < 4 && 4 * i + a < oh; a++)
                    memcpy(plane + (4 * i + a) * ow, rows + a * 4 * tv, sizeof(float) * (size_t)ow);
            }
            if (act == ACT_SWISH) rpcsrv_sigmoid_f32(plane, plane, oh * ow, 1);
        }
    free(rows);
    return 0;
}
