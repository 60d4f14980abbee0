/* Winograd F(2x2, 3x3) input and output transforms, float32, for rpcsrv's numpy executor (winograd.py does
 * the rest: the transformed weights, the 16 batched GEMMs through numpy's BLAS).  Built with dwconv.c by
 * kernels/clib/compiled.py; winograd.py's numpy transforms stay the fallback.
 *
 * numpy computes each transform as a dozen strided passes with temporaries: on ResNet-50's and
 * Inception's 3x3 layers they took 30-45% of the conv, as long as its GEMMs.  Here each is one pass: per
 * channel, per row of tiles, the vertical half of the transform over whole padded rows (contiguous loops),
 * then the horizontal half for VW tiles at a time (their stride-2 columns split by even/odd shuffles on
 * the way in, their output columns interleaved on the way out; a scalar loop for the last tiles).  The
 * output transform also adds the bias and applies the fused activation.
 */
#include <stdlib.h>
#include <string.h>

#include "vec.h"

/* v (16, C, N * th * tw): B^T d B of the 4x4 tiles (stride 2) of x (N, C, H, W) padded by pt rows above and
 * pl columns on the left (pads >= 0; the padded plane is 2 th + 2 by 2 tw + 2, anything of x past it is
 * not read).  Returns -1 when out of memory. */
int rpcsrv_wino_in_f32(const float *x, float *v, long n, long c, long h, long wd, long pt, long pl,
                       long th, long tw) {
    long ph = 2 * th + 2, pw = 2 * tw + 2, tiles = n * th * tw, k16 = c * tiles;
    float *pad = calloc((size_t)(ph * pw + 4 * pw), sizeof(float));  /* the plane, then 4 rows of t */
    if (!pad) return -1;
    float *t0 = pad + ph * pw, *t1 = t0 + pw, *t2 = t1 + pw, *t3 = t2 + pw;
    long rows = h < ph - pt ? h : ph - pt, cols = wd < pw - pl ? wd : pw - pl;
    for (long b = 0; b < n; b++)
        for (long ci = 0; ci < c; ci++) {
            const float *src = x + (b * c + ci) * h * wd;
            for (long r = 0; r < rows; r++) memcpy(pad + (r + pt) * pw + pl, src + r * wd, sizeof(float) * (size_t)cols);
            float *dst = v + ci * tiles + b * th * tw;
            for (long i = 0; i < th; i++, dst += tw) {
                const float *d0 = pad + 2 * i * pw, *d1 = d0 + pw, *d2 = d1 + pw, *d3 = d2 + pw;
                for (long s = 0; s < pw; s++) {  /* rows of B^T d */
                    t0[s] = d0[s] - d2[s];
                    t1[s] = d1[s] + d2[s];
                    t2[s] = d2[s] - d1[s];
                    t3[s] = d1[s] - d3[s];
                }
                const float *t[4] = {t0, t1, t2, t3};
                for (int r = 0; r < 4; r++) {  /* (B^T d) B, tile j reading columns 2j .. 2j + 3 */
                    const float *tr = t[r];
                    float *o0 = dst + (4 * r) * k16, *o1 = o0 + k16, *o2 = o1 + k16, *o3 = o2 + k16;
                    long j = 0;
                    for (; j + VW <= tw; j += VW) {  /* reads up to column 2 (j + VW) + 1 <= pw - 1 */
                        vf l0 = loadv(tr + 2 * j), l1 = loadv(tr + 2 * j + VW);
                        vf l2 = loadv(tr + 2 * j + 2), l3 = loadv(tr + 2 * j + 2 + VW);
                        vf a = EVENS(l0, l1), bb = ODDS(l0, l1), cc = EVENS(l2, l3), dd = ODDS(l2, l3);
                        storev(o0 + j, a - cc);
                        storev(o1 + j, bb + cc);
                        storev(o2 + j, cc - bb);
                        storev(o3 + j, bb - dd);
                    }
                    for (; j < tw; j++) {
                        float a = tr[2 * j], bb = tr[2 * j + 1], cc = tr[2 * j + 2], dd = tr[2 * j + 3];
                        o0[j] = a - cc;
                        o1[j] = bb + cc;
                        o2[j] = cc - bb;
                        o3[j] = bb - dd;
                    }
                }
            }
        }
    free(pad);
    return 0;
}

/* y (N, M, OH, OW) = A^T p A of the products p (16, M, N * th * tw), cropped to OH <= 2 th, OW <= 2 tw, plus
 * the bias (optional) and through the fused activation.  Returns -1 when out of memory. */
int rpcsrv_wino_out_f32(const float *p, float *y, const float *bias, long n, long m, long th, long tw,
                        long oh, long ow, int act, float lo, float hi) {
    long tiles = n * th * tw, k16 = m * tiles;
    float *row = malloc(sizeof(float) * (size_t)(4 * tw + 4));  /* two output rows of 2 tw, before the crop */
    if (!row) return -1;
    float *ra = row, *rb = row + 2 * tw + 2;
    for (long b = 0; b < n; b++)
        for (long mo = 0; mo < m; mo++) {
            const float *src = p + mo * tiles + b * th * tw;
            float bo = bias ? bias[mo] : 0.f, *plane = y + (b * m + mo) * oh * ow;
            for (long i = 0; i < th; i++, src += tw) {
                const float *q[16];
                for (int k = 0; k < 16; k++) q[k] = src + k * k16;
                long j = 0;
                const vf vb = splat(bo);
                for (; j + VW <= tw; j += VW) {
                    vf r0[4], r1[4];
                    for (int s = 0; s < 4; s++) {  /* A^T m: the tiles' two rows, per column s */
                        vf m1 = loadv(q[4 + s] + j), m2 = loadv(q[8 + s] + j);
                        r0[s] = loadv(q[s] + j) + m1 + m2;
                        r1[s] = m1 - m2 - loadv(q[12 + s] + j);
                    }
                    vf y00 = actv(r0[0] + r0[1] + r0[2] + vb, act, lo, hi);
                    vf y01 = actv(r0[1] - r0[2] - r0[3] + vb, act, lo, hi);
                    vf y10 = actv(r1[0] + r1[1] + r1[2] + vb, act, lo, hi);
                    vf y11 = actv(r1[1] - r1[2] - r1[3] + vb, act, lo, hi);
                    storev(ra + 2 * j, ZIPLO(y00, y01));
                    storev(ra + 2 * j + VW, ZIPHI(y00, y01));
                    storev(rb + 2 * j, ZIPLO(y10, y11));
                    storev(rb + 2 * j + VW, ZIPHI(y10, y11));
                }
                for (; j < tw; j++) {
                    float r0[4], r1[4];
                    for (int s = 0; s < 4; s++) {
                        r0[s] = q[s][j] + q[4 + s][j] + q[8 + s][j];
                        r1[s] = q[4 + s][j] - q[8 + s][j] - q[12 + s][j];
                    }
                    ra[2 * j] = act1(r0[0] + r0[1] + r0[2] + bo, act, lo, hi);
                    ra[2 * j + 1] = act1(r0[1] - r0[2] - r0[3] + bo, act, lo, hi);
                    rb[2 * j] = act1(r1[0] + r1[1] + r1[2] + bo, act, lo, hi);
                    rb[2 * j + 1] = act1(r1[1] - r1[2] - r1[3] + bo, act, lo, hi);
                }
                memcpy(plane + 2 * i * ow, ra, sizeof(float) * (size_t)ow);
                if (2 * i + 1 < oh) memcpy(plane + (2 * i + 1) * ow, rb, sizeof(float) * (size_t)ow);
            }
            if (act == ACT_SWISH) rpcsrv_sigmoid_f32(plane, plane, oh * ow, 1);
        }
    free(row);
    return 0;
}
