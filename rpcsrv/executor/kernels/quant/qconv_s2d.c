/* A stride-2 stem conv (ResNet's 7x7, MobileNet's 3x3, over an image's 3 channels) as a stride-1 conv over the
 * image's 2x2 space-to-depth copy (quant/plans_quant.py packs the weights to match).
 *
 * The in-place tiles (qconv.c's conv_in_place) read taps of a multiple of 4 channels; a 7x7 stride-2 conv over 3
 * channels has patches of 147 bytes, 7 runs of 21 bytes each, gathered for every output pixel instead: the gather
 * costs about as much as the products.  Its input padded (zero points) and cut into 2x2 blocks,
 * each block's 4 pixels side by side as one pixel of 4C channels, the same conv is a 4x4 stride-1 conv without
 * padding over those pixels (the kernel padded to 8x8 with zero weights), each kernel row's 4 taps one run of 48
 * bytes that the in-place tiles read where it is, for 31% more products (192 against 147 per output; a 3x3's 48
 * against 27), all zero weights' or zero points'.  Every sum is the same integer.  Measured at 224x224: ResNet's
 * stem 1.15 -> 0.99 ms, MobileNetV2's 0.40 -> 0.27 ms.
 *
 * rpcsrv_qconv_s2d's block: the GEMM block, the geometry of the copy (4x4, stride 1, no padding), and the copy's
 * own numbers: n, h, w, c of the input, its padding top and left, the copy's height and width (pixels of 4C), the
 * input's zero point (its own type's value), whether the input is channels-first. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qgemm.h"

int rpcsrv_qconv(const long *g, const long *geom, const uint8_t *x, void *y);
void rpcsrv_q_nchw_to_nhwc(const uint8_t *x, long n, long c, long hw, uint8_t *y);

long rpcsrv_qconv_in_place(long asigned);

enum { SD_G, SD_GEOM, SD_N, SD_H, SD_W, SD_C, SD_PT, SD_PL, SD_H2, SD_W2, SD_ZA, SD_NCHW, SD_SIZE };

/* y[b, i, j, (2p + q) c + ch] = x[b, 2i + p - pt, 2j + q - pl, ch], the zero point outside x: for each (i, j, p) the
 * two pixels q = 0, 1 are 2c contiguous bytes in both */
static void space_to_depth(const long *s, const uint8_t *x, uint8_t *y)
{
    const long h = s[SD_H], w = s[SD_W], c = s[SD_C], h2 = s[SD_H2], w2 = s[SD_W2], pt = s[SD_PT], pl = s[SD_PL];
    const uint8_t za = (uint8_t)s[SD_ZA];
    for (long b = 0; b < s[SD_N]; b++)
        for (long i = 0; i < h2; i++)
            for (long p = 0; p < 2; p++) {
                const long r = 2 * i + p - pt;
                uint8_t *dst = y + (b * h2 + i) * w2 * 4 * c + 2 * p * c;
                if (r < 0 || r >= h) {
                    for (long j = 0; j < w2; j++)
                        memset(dst + j * 4 * c, za, (size_t)(2 * c));
                    continue;
                }
                const uint8_t *row = x + (b * h + r) * w * c;
                for (long j = 0; j < w2; j++) {
                    const long s0 = 2 * j - pl;
                    uint8_t *d = dst + j * 4 * c;
                    if (s0 >= 0 && s0 + 1 < w) {
                        memcpy(d, row + s0 * c, (size_t)(2 * c));
                    } else {
                        for (long q = 0; q < 2; q++) {
                            if (s0 + q >= 0 && s0 + q < w)
                                memcpy(d + q * c, row + (s0 + q) * c, (size_t)c);
                            else
                                memset(d + q * c, za, (size_t)c);
                        }
                    }
                }
            }
}

/* the conv over the copy by the in-place tiles, each kernel row's KW taps one run of KW x 4C bytes (the copy's
 * pixels j .. j + KW - 1 of row i + u are contiguous, and the weights are packed in that order) */
static int rows_in_place(const long *g, const long *geom, const uint8_t *copy, void *y)
{
    const long kh = geom[CG_KH], run = geom[CG_KW] * geom[CG_C], h2 = geom[CG_H], w2 = geom[CG_W];
    const long oh = geom[CG_OH], ow = geom[CG_OW], m = geom[CG_N] * oh * ow, mb = 240;
    const long esize = g[QG_OUT] >= QOUT_I32 ? 4 : 1;
    const uint8_t **ptrs = malloc(sizeof *ptrs * (size_t)(mb * kh));
    if (!ptrs)
        return -1;
    for (long r0 = 0; r0 < m; r0 += mb) {
        const long nrows = m - r0 < mb ? m - r0 : mb;
        for (long r = 0; r < nrows; r++) {
            const long px = r0 + r, b = px / (oh * ow), oy = px / ow % oh, ox = px % ow;
            for (long u = 0; u < kh; u++)
                ptrs[r * kh + u] = copy + ((b * h2 + oy + u) * w2 + ox) * geom[CG_C];
        }
        rpcsrv_qgemm_taps(g, ptrs, nrows, kh, run, geom[CG_ZA], (char *)y + r0 * g[QG_N] * esize, g[QG_N]);
    }
    free(ptrs);
    return 0;
}

/* the conv of x (channels-last, or channels-first when the block says) into y (N, OH, OW, M): 0, or -1 */
int rpcsrv_qconv_s2d(const long *s, const uint8_t *x, void *y)
{
    const long n = s[SD_N], c = s[SD_C], hw = s[SD_H] * s[SD_W];
    uint8_t *nhwc = s[SD_NCHW] ? malloc((size_t)(n * c * hw)) : NULL;
    uint8_t *copy = malloc((size_t)(n * s[SD_H2] * s[SD_W2] * 4 * c));
    if (!copy || (s[SD_NCHW] && !nhwc)) {
        free(nhwc), free(copy);
        return -1;
    }
    if (nhwc) {
        rpcsrv_q_nchw_to_nhwc(x, n, c, hw, nhwc);
        x = nhwc;
    }
    space_to_depth(s, x, copy);
    const long *g = (const long *)s[SD_G], *geom = (const long *)s[SD_GEOM];
    const int rc = rpcsrv_qconv_in_place(geom[CG_SIGNED]) && g[QG_BZP] == 0 ? rows_in_place(g, geom, copy, y)
                                                                            : rpcsrv_qconv(g, geom, copy, y);
    free(nhwc), free(copy);
    return rc;
}

/* whether rpcsrv_qconv reads the patches of a conv with activations of type ``asigned`` in place (when their
 * channels are a multiple of 4 and the weights' zero points 0): the kernel in use has in-place tiles and takes the
 * type as it is */
long rpcsrv_qconv_in_place(long asigned) { return rpcsrv_qkernel()->ipanel != NULL && !rpcsrv_qflip((int)asigned); }
