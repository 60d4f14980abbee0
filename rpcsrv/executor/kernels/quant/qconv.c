/* int8 convolutions over channels-last (NHWC) activations, the layout the int8 plans keep between int8 ops
 * (quant/plans_quant.py: a (N, C, H, W) tensor whose memory is (N, H, W, C)):
 *
 * - rpcsrv_qconv: a dense conv as the int8 GEMM (qgemm.c) of the output pixels' patches (rows: the KH x KW taps'
 *   C channels each, a padded tap filled with the input zero point, so that it adds nothing) by the weights
 *   packed as (KH, KW, C) x M; patches gathered a block of rows at a time into an L2-sized buffer, or read in
 *   place for 1x1 convs without padding (each row is one input pixel's channels);
 * - rpcsrv_qdwconv: a depthwise conv, each output pixel's channels side by side in int32 vectors, the
 *   requantization of qgemm.c's epilogue at the end of each pixel;
 * - rpcsrv_q_nchw_to_nhwc: the transpose of an int8 tensor that arrives channels-first. */
#include <stdlib.h>
#include <string.h>

#include "qgemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define QCLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QCLONES
#endif

/* the geometry block: input N H W C, kernel KH KW, strides, dilations, pads top/left, output OH OW, the input's
 * type (0 uint8, 1 int8) and zero point, and whether it is channels-first (then it is transposed first) */
enum { CG_N, CG_H, CG_W, CG_C, CG_KH, CG_KW, CG_SH, CG_SW, CG_DH, CG_DW, CG_PT, CG_PL, CG_OH, CG_OW, CG_SIGNED,
       CG_ZA, CG_NCHW, CG_SIZE };

void rpcsrv_q_nchw_to_nhwc(const uint8_t *x, long n, long c, long hw, uint8_t *y)
{
    for (long b = 0; b < n; b++, x += c * hw, y += c * hw)
        for (long i0 = 0; i0 < hw; i0 += 64)  /* in tiles, so that the reads of each channel stay in cache lines */
            for (long ch = 0; ch < c; ch++)
                for (long i = i0; i < i0 + 64 && i < hw; i++)
                    y[i * c + ch] = x[ch * hw + i];
}

/* the rows per block of gathered patches: about 128 KB */
static long conv_block_rows(long kp, long mr) { long r = (131072 / kp) / mr * mr; return r < mr ? mr : r; }

static void gather(const long *geom, const uint8_t *x, long row, uint8_t flip, uint8_t fill, long kp, uint8_t *dst)
{
    const long h = geom[CG_H], w = geom[CG_W], c = geom[CG_C], oh = geom[CG_OH], ow = geom[CG_OW];
    const long b = row / (oh * ow), oy = row / ow % oh, ox = row % ow;
    long k = 0;
    for (long ky = 0; ky < geom[CG_KH]; ky++) {
        const long iy = oy * geom[CG_SH] - geom[CG_PT] + ky * geom[CG_DH];
        for (long kx = 0; kx < geom[CG_KW]; kx++, k += c) {
            const long ix = ox * geom[CG_SW] - geom[CG_PL] + kx * geom[CG_DW];
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                memset(dst + k, fill, (size_t)c);
            } else {
                const uint8_t *src = x + ((b * h + iy) * w + ix) * c;
                for (long ch = 0; ch < c; ch++)
                    dst[k + ch] = src[ch] ^ flip;
            }
        }
    }
    memset(dst + k, 0, (size_t)(kp - k));
}

/* a dense conv of x (geom) by the plan's packed weights g into y (N, OH, OW, M): 0, or -1 without memory */
int rpcsrv_qconv(const long *g, const long *geom, const uint8_t *x, void *y)
{
    const qkernel *kn = rpcsrv_qkernel();
    const long n = geom[CG_N], c = geom[CG_C], m = n * geom[CG_OH] * geom[CG_OW], kp = g[QG_KP];
    const long k = g[QG_K], esize = g[QG_OUT] >= QOUT_I32 ? 4 : 1, mb = conv_block_rows(kp, kn->mr);
    const int asigned = (int)geom[CG_SIGNED], flip = rpcsrv_qflip(asigned), sums = g[QG_BZP] != 0;
    const long za = geom[CG_ZA], zan = flip ? (asigned ? za + 128 : za - 128) : za;
    const int direct = !flip && kp == k && geom[CG_KH] == 1 && geom[CG_KW] == 1 && geom[CG_PT] == 0 &&
                       geom[CG_PL] == 0 && (geom[CG_OH] - 1) * geom[CG_SH] < geom[CG_H] &&
                       (geom[CG_OW] - 1) * geom[CG_SW] < geom[CG_W];
    uint8_t *nhwc = NULL, *pack = direct ? NULL : malloc((size_t)(mb * kp));
    const uint8_t **rows = malloc(sizeof *rows * (size_t)mb);
    int32_t *rowsum = sums ? malloc(sizeof *rowsum * (size_t)mb) : NULL;
    if (geom[CG_NCHW])
        nhwc = malloc((size_t)(n * c * geom[CG_H] * geom[CG_W]));
    if (!rows || (!direct && !pack) || (sums && !rowsum) || (geom[CG_NCHW] && !nhwc)) {
        free(pack), free(rows), free(rowsum), free(nhwc);
        return -1;
    }
    if (nhwc) {
        rpcsrv_q_nchw_to_nhwc(x, n, c, geom[CG_H] * geom[CG_W], nhwc);
        x = nhwc;
    }
    const uint8_t fill = (uint8_t)zan;  /* a padded tap: the zero point, as the kernel reads it */
    for (long r0 = 0; r0 < m; r0 += mb) {
        const long nrows = m - r0 < mb ? m - r0 : mb;
        for (long r = 0; r < nrows; r++) {
            const long row = r0 + r;
            if (direct) {
                const long b = row / (geom[CG_OH] * geom[CG_OW]), oy = row / geom[CG_OW] % geom[CG_OH];
                const long ox = row % geom[CG_OW];
                rows[r] = x + ((b * geom[CG_H] + oy * geom[CG_SH]) * geom[CG_W] + ox * geom[CG_SW]) * c;
            } else {
                gather(geom, x, row, (uint8_t)flip, fill, kp, pack + r * kp);
                rows[r] = pack + r * kp;
            }
            if (sums) {
                int32_t s = 0;
                for (long kk = 0; kk < k; kk++)
                    s += kn->asigned ? (int32_t)(int8_t)rows[r][kk] : (int32_t)rows[r][kk];
                rowsum[r] = s;
            }
        }
        rpcsrv_qgemm_rows(g, rows, nrows, rowsum, zan, 1.0f, (char *)y + r0 * g[QG_N] * esize, g[QG_N]);
    }
    free(pack), free(rows), free(rowsum), free(nhwc);
    return 0;
}

/* the depthwise plan's block: weights (KH * KW, C) int16 with their zero points taken away, int32 bias (C),
 * float multipliers (C), output type, zero point and clamp */
enum { DG_W, DG_BIAS, DG_MULT, DG_OUT, DG_YZP, DG_LO, DG_HI, DG_SIZE };

QCLONES
static void dw_pixel(const long *dg, const long *geom, const uint8_t *x, long b, long oy, long ox, int32_t *acc,
                     int32_t *xs, uint8_t *y)
{
    const long h = geom[CG_H], w = geom[CG_W], c = geom[CG_C], kw = geom[CG_KW];
    const int16_t *wt = (const int16_t *)dg[DG_W];
    const int32_t za = (int32_t)geom[CG_ZA];
    memcpy(acc, (const int32_t *)dg[DG_BIAS], sizeof *acc * (size_t)c);
    for (long ky = 0; ky < geom[CG_KH]; ky++) {
        const long iy = oy * geom[CG_SH] - geom[CG_PT] + ky * geom[CG_DH];
        if (iy < 0 || iy >= h)
            continue;
        for (long kx = 0; kx < kw; kx++) {
            const long ix = ox * geom[CG_SW] - geom[CG_PL] + kx * geom[CG_DW];
            if (ix < 0 || ix >= w)
                continue;
            const int16_t *wk = wt + (ky * kw + kx) * c;
            const uint8_t *src = x + ((b * h + iy) * w + ix) * c;
            if (geom[CG_SIGNED]) {
                const int8_t *s8 = (const int8_t *)src;
                for (long ch = 0; ch < c; ch++)
                    xs[ch] = (int32_t)s8[ch] - za;
            } else {
                for (long ch = 0; ch < c; ch++)
                    xs[ch] = (int32_t)src[ch] - za;
            }
            for (long ch = 0; ch < c; ch++)
                acc[ch] += xs[ch] * wk[ch];
        }
    }
    const float *mult = (const float *)dg[DG_MULT], magic = 12582912.0f;
    const float flo = (float)(dg[DG_LO] - dg[DG_YZP]), fhi = (float)(dg[DG_HI] - dg[DG_YZP]);
    const int32_t yzp = (int32_t)dg[DG_YZP];
    for (long ch = 0; ch < c; ch++) {
        float f = (float)acc[ch] * mult[ch];
        f = f < flo ? flo : f > fhi ? fhi : f;
        xs[ch] = (int32_t)((f + magic) - magic) + yzp;  /* half to even: see qgemm.c's epilogue */
    }
    for (long ch = 0; ch < c; ch++)
        y[ch] = (uint8_t)xs[ch];
}

/* a depthwise conv (one weight plane per channel) of x (geom, channels-last) into y (N, OH, OW, C) */
int rpcsrv_qdwconv(const long *dg, const long *geom, const uint8_t *x, uint8_t *y)
{
    const long n = geom[CG_N], c = geom[CG_C], oh = geom[CG_OH], ow = geom[CG_OW];
    int32_t *acc = malloc(sizeof *acc * (size_t)c * 2);
    uint8_t *nhwc = geom[CG_NCHW] ? malloc((size_t)(n * c * geom[CG_H] * geom[CG_W])) : NULL;
    if (!acc || (geom[CG_NCHW] && !nhwc)) {
        free(acc), free(nhwc);
        return -1;
    }
    if (nhwc) {
        rpcsrv_q_nchw_to_nhwc(x, n, c, geom[CG_H] * geom[CG_W], nhwc);
        x = nhwc;
    }
    for (long b = 0; b < n; b++)
        for (long oy = 0; oy < oh; oy++)
            for (long ox = 0; ox < ow; ox++)
                dw_pixel(dg, geom, x, b, oy, ox, acc, acc + c, y + ((b * oh + oy) * ow + ox) * c);
    free(acc), free(nhwc);
    return 0;
}
