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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qgemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define QCLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QCLONES
#endif


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

/* n bytes (n of 2, 4, 8 or 16) from src to dst, each xor flip (flip 0 or 0x80 in every byte) */
#define COPY_FLIP(T, n)                                                                                      \
    {                                                                                                        \
        T v, f;                                                                                              \
        memcpy(&v, src, n), memset(&f, flip, n), v ^= f, memcpy(dst, &v, n);                                 \
        memcpy(&v, src + len - n, n), v ^= f, memcpy(dst + len - n, &v, n);                                  \
    }

/* len bytes from src to dst, each xor flip; runs of up to 32 bytes (a stem's kernel row: 3 taps x 3 channels, 7 x
 * 3) as two word copies that overlap in the middle (no byte past either run is read or written), longer ones by
 * memcpy (flip 0) or a loop */
static inline void copy_run(uint8_t *dst, const uint8_t *src, long len, uint8_t flip)
{
    typedef uint64_t u64x2 __attribute__((vector_size(16)));
    if (len > 32) {
        if (!flip) {
            memcpy(dst, src, (size_t)len);
            return;
        }
        for (long i = 0; i < len; i++)
            dst[i] = src[i] ^ flip;
    } else if (len >= 16) {
        u64x2 v, f, w;
        memcpy(&v, src, 16), memcpy(&w, src + len - 16, 16), memset(&f, flip, 16);
        v ^= f, w ^= f;
        memcpy(dst, &v, 16), memcpy(dst + len - 16, &w, 16);
    } else if (len >= 8) {
        COPY_FLIP(uint64_t, 8)
    } else if (len >= 4) {
        COPY_FLIP(uint32_t, 4)
    } else {
        for (long i = 0; i < len; i++)
            dst[i] = src[i] ^ flip;
    }
}

static inline void fill_run(uint8_t *dst, uint8_t fill, long len)
{
    for (long i = 0; i < len; i++)
        dst[i] = fill;
}

/* the patch of output pixel ``row`` as the GEMM reads it: for each tap (ky, kx) its C channels, a tap in the
 * padding filled with ``fill``; without dilation along x, the KW taps of one kernel row are one run of KW * C
 * bytes of the input row (less what falls in the padding) */
static void gather(const long *geom, const uint8_t *x, long b, long oy, long ox, uint8_t flip, uint8_t fill, long kp,
                   uint8_t *dst)
{
    const long h = geom[CG_H], w = geom[CG_W], c = geom[CG_C];
    const long kw = geom[CG_KW], dw = geom[CG_DW], ix0 = ox * geom[CG_SW] - geom[CG_PL];
    long k = 0;
    for (long ky = 0; ky < geom[CG_KH]; ky++, k += kw * c) {
        const long iy = oy * geom[CG_SH] - geom[CG_PT] + ky * geom[CG_DH];
        if (iy < 0 || iy >= h) {
            memset(dst + k, fill, (size_t)(kw * c));
            continue;
        }
        const uint8_t *src = x + (b * h + iy) * w * c;
        if (dw == 1) {
            long lo = ix0 < 0 ? -ix0 : 0, hi = w - ix0;  /* the taps inside the row: [lo, hi) */
            lo = lo > kw ? kw : lo;
            hi = hi > kw ? kw : hi < lo ? lo : hi;
            fill_run(dst + k, fill, lo * c);
            copy_run(dst + k + lo * c, src + (ix0 + lo) * c, (hi - lo) * c, flip);
            fill_run(dst + k + hi * c, fill, (kw - hi) * c);
            continue;
        }
        for (long kx = 0; kx < kw; kx++) {
            const long ix = ix0 + kx * dw;
            if (ix < 0 || ix >= w)
                memset(dst + k + kx * c, fill, (size_t)c);
            else
                copy_run(dst + k + kx * c, src + ix * c, c, flip);
        }
    }
    fill_run(dst + k, 0, kp - k);
}

/* the conv by the kernel's in-place tiles (qkernel.ipanel): per block of output pixels, a pointer per (pixel, tap)
 * into the channels-last input, or to a row of zero points for a tap in the padding */
static int conv_in_place(const long *g, const long *geom, const uint8_t *x, void *y, uint8_t fill, long zan, long m)
{
    const long h = geom[CG_H], w = geom[CG_W], c = geom[CG_C], kh = geom[CG_KH], kw = geom[CG_KW];
    const long taps = kh * kw, mb = 240, esize = g[QG_OUT] >= QOUT_I32 ? 4 : 1;
    const uint8_t **ptrs = malloc(sizeof *ptrs * (size_t)(mb * taps));
    uint8_t *zrow = malloc((size_t)c);
    long *off = malloc(sizeof *off * (size_t)taps);  /* each tap's offset from the patch's first pixel */
    if (!ptrs || !zrow || !off) {
        free(ptrs), free(zrow), free(off);
        return -1;
    }
    memset(zrow, fill, (size_t)c);
    for (long ky = 0; ky < kh; ky++)
        for (long kx = 0; kx < kw; kx++)
            off[ky * kw + kx] = (ky * geom[CG_DH] * w + kx * geom[CG_DW]) * c;
    const long yspan = (kh - 1) * geom[CG_DH], xspan = (kw - 1) * geom[CG_DW];
    long b = 0, oy = 0, ox = 0;
    for (long r0 = 0; r0 < m; r0 += mb) {
        const long nrows = m - r0 < mb ? m - r0 : mb;
        for (long r = 0; r < nrows; r++) {
            const uint8_t **p = ptrs + r * taps;
            const long iy0 = oy * geom[CG_SH] - geom[CG_PT], ix0 = ox * geom[CG_SW] - geom[CG_PL];
            if (iy0 >= 0 && iy0 + yspan < h && ix0 >= 0 && ix0 + xspan < w) {  /* no tap in the padding */
                const uint8_t *first = x + ((b * h + iy0) * w + ix0) * c;
                for (long t = 0; t < taps; t++)
                    p[t] = first + off[t];
            } else {
                for (long ky = 0; ky < kh; ky++) {
                    const long iy = iy0 + ky * geom[CG_DH];
                    for (long kx = 0; kx < kw; kx++) {
                        const long ix = ix0 + kx * geom[CG_DW];
                        p[ky * kw + kx] = iy < 0 || iy >= h || ix < 0 || ix >= w ? zrow : x + ((b * h + iy) * w + ix) * c;
                    }
                }
            }
            if (++ox == geom[CG_OW]) {
                ox = 0;
                if (++oy == geom[CG_OH])
                    oy = 0, b++;
            }
        }
        rpcsrv_qgemm_taps(g, ptrs, nrows, taps, c, zan, (char *)y + r0 * g[QG_N] * esize, g[QG_N]);
    }
    free(ptrs), free(zrow), free(off);
    return 0;
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
    if (!direct && kn->ipanel && !flip && !sums && c % 4 == 0) {
        int rc = conv_in_place(g, geom, x, y, fill, zan, m);
        free(pack), free(rows), free(rowsum), free(nhwc);
        return rc;
    }
    long b = 0, oy = 0, ox = 0;  /* the output pixel of the next row */
    for (long r0 = 0; r0 < m; r0 += mb) {
        const long nrows = m - r0 < mb ? m - r0 : mb;
        for (long r = 0; r < nrows; r++) {
            if (direct) {
                rows[r] = x + ((b * geom[CG_H] + oy * geom[CG_SH]) * geom[CG_W] + ox * geom[CG_SW]) * c;
            } else {
                gather(geom, x, b, oy, ox, (uint8_t)flip, fill, kp, pack + r * kp);
                rows[r] = pack + r * kp;
            }
            if (++ox == geom[CG_OW]) {
                ox = 0;
                if (++oy == geom[CG_OH])
                    oy = 0, b++;
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

/* one output pixel's channels [c0, c1) in plain C (the compiler vectorises the channel loops) */
static void dw_pixel(const long *dg, const long *geom, const uint8_t *x, long b, long oy, long ox, long c0, long c1,
                     uint8_t *y)
{
    const long h = geom[CG_H], w = geom[CG_W], c = geom[CG_C], kw = geom[CG_KW], nc = c1 - c0;
    const int32_t *wt = (const int32_t *)dg[DG_W], za = (int32_t)geom[CG_ZA];
    int32_t acc[64];
    memcpy(acc, (const int32_t *)dg[DG_BIAS] + c0, sizeof *acc * (size_t)nc);
    for (long ky = 0; ky < geom[CG_KH]; ky++) {
        const long iy = oy * geom[CG_SH] - geom[CG_PT] + ky * geom[CG_DH];
        for (long kx = 0; iy >= 0 && iy < h && kx < kw; kx++) {
            const long ix = ox * geom[CG_SW] - geom[CG_PL] + kx * geom[CG_DW];
            if (ix < 0 || ix >= w)
                continue;
            const int32_t *wk = wt + (ky * kw + kx) * c + c0;
            const uint8_t *src = x + ((b * h + iy) * w + ix) * c + c0;
            if (geom[CG_SIGNED])
                for (long ch = 0; ch < nc; ch++)
                    acc[ch] += ((int32_t)(int8_t)src[ch] - za) * wk[ch];
            else
                for (long ch = 0; ch < nc; ch++)
                    acc[ch] += ((int32_t)src[ch] - za) * wk[ch];
        }
    }
    const float *mult = (const float *)dg[DG_MULT] + c0, magic = 12582912.0f;
    const float lo = (float)(dg[DG_LO] - dg[DG_YZP]), hi = (float)(dg[DG_HI] - dg[DG_YZP]);
    for (long ch = 0; ch < nc; ch++) {
        float f = (float)acc[ch] * mult[ch];
        f = f < lo ? lo : f > hi ? hi : f;
        y[c0 + ch] = (uint8_t)((int32_t)((f + magic) - magic) + (int32_t)dg[DG_YZP]);  /* half to even */
    }
}

static void dw_plain(const long *dg, const long *geom, const uint8_t *x, uint8_t *y)
{
    const long n = geom[CG_N], c = geom[CG_C], oh = geom[CG_OH], ow = geom[CG_OW];
    for (long b = 0; b < n; b++)
        for (long oy = 0; oy < oh; oy++)
            for (long ox = 0; ox < ow; ox++)
                for (long c0 = 0; c0 < c; c0 += 64)
                    dw_pixel(dg, geom, x, b, oy, ox, c0, c0 + 64 < c ? c0 + 64 : c, y + ((b * oh + oy) * ow + ox) * c);
}

#if defined(__x86_64__)
#include <immintrin.h>
extern const qkernel rpcsrv_qk_vnni512;
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* the taps 2p and 2p + 1 of 32 channels (from c0) of the pixel whose tap pointers are t, into acc_lo, acc_hi */
#define DW_PAIR(t, acc_lo, acc_hi)                                                                           \
    {                                                                                                        \
        const __m256i xa = _mm256_maskz_loadu_epi8(mk, t[2 * p] + c0);                                       \
        const __m256i xb = _mm256_maskz_loadu_epi8(mk, t[2 * p + 1] + c0);                                   \
        const __m256i l8 = _mm256_unpacklo_epi8(xa, xb), h8 = _mm256_unpackhi_epi8(xa, xb);                   \
        acc_lo = _mm512_dpwssd_epi32(acc_lo, is_signed ? _mm512_cvtepi8_epi16(l8) : _mm512_cvtepu8_epi16(l8), w0); \
        acc_hi = _mm512_dpwssd_epi32(acc_hi, is_signed ? _mm512_cvtepi8_epi16(h8) : _mm512_cvtepu8_epi16(h8), w1); \
    }

/* 32 channels' sums (in DW_ORDER) requantized and stored at dst (mask: the channels that exist) */
static inline __attribute__((always_inline)) T512 void dw_store(__m512i acc0, __m512i acc1, const float *mult,
                                                                 __m512 lo, __m512 hi, __m512i yzp, uint8_t *dst,
                                                                 __mmask32 mk)
{
    __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(acc0), _mm512_loadu_ps(mult));
    __m512 f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(acc1), _mm512_loadu_ps(mult + 16));
    f0 = _mm512_min_ps(_mm512_max_ps(f0, lo), hi);
    f1 = _mm512_min_ps(_mm512_max_ps(f1, lo), hi);
    __m128i q0 = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f0), yzp));  /* 0-7 16-23 */
    __m128i q1 = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f1), yzp));  /* 8-15 24-31 */
    _mm256_mask_storeu_epi8(dst, mk, _mm256_set_m128i(_mm_unpackhi_epi64(q0, q1), _mm_unpacklo_epi64(q0, q1)));
}

/* 32 channels of two neighbouring pixels at a time (two independent chains of sums, each weight load serving both:
 * a 32-channel map's pixels were waiting on one chain's latency, 1.6x slower): the bytes of two taps interleaved (vpunpck*bw), widened to 16 bits, and
 * multiplied and added in pairs into 2 x 16 int32 lanes by vpdpwssd (AVX-512 VNNI: taken with the VNNI GEMM), the
 * channels in DW_ORDER.  A tap in the padding
 * reads a row of zero points, so every pixel sums x * w over all its taps, and the bias of this kernel already holds
 * - zero point * (the sum of each channel's weights): sum (x - zero point) * w without a subtraction per tap */
static inline __attribute__((always_inline)) T512 void dw_avx512_k(const long *dg, const long *geom, const uint8_t *x,
                                                                    uint8_t *y, const uint8_t *zrow, const long kh,
                                                                    const long kw)
{
    const long n = geom[CG_N], h = geom[CG_H], w = geom[CG_W], c = geom[CG_C];
    const long oh = geom[CG_OH], ow = geom[CG_OW], sh = geom[CG_SH], sw = geom[CG_SW], dh = geom[CG_DH];
    const long dw = geom[CG_DW], pt = geom[CG_PT], pl = geom[CG_PL], cp = dg[DG_CP], taps = kh * kw;
    const int16_t *w16 = (const int16_t *)dg[DG_W16];
    const int32_t *bias = (const int32_t *)dg[DG_BIAS16];
    const float *mult = (const float *)dg[DG_MULT16];
    const int is_signed = (int)geom[CG_SIGNED];
    const __m512i yzp = _mm512_set1_epi32((int32_t)dg[DG_YZP]);
    const __m512 lo = _mm512_set1_ps((float)(dg[DG_LO] - dg[DG_YZP])), hi = _mm512_set1_ps((float)(dg[DG_HI] - dg[DG_YZP]));
    const uint8_t *tp[64], *tq[64], *rowp[64];
    for (long b = 0; b < n; b++)
        for (long oy = 0; oy < oh; oy++) {
            int rows_in = 1;
            for (long ky = 0; ky < kh; ky++) {  /* each kernel row's input row, or the zero points' */
                const long iy = oy * sh - pt + ky * dh;
                rowp[ky] = iy < 0 || iy >= h ? zrow : x + (b * h + iy) * w * c;
                rows_in &= rowp[ky] != zrow;
            }
            for (long ox = 0; ox < ow; ox += 2) {  /* two pixels at a time: two chains of sums, the weights loaded once */
                const int two = ox + 1 < ow;
                const long ix0 = ox * sw - pl;
                if (rows_in && two && ix0 >= 0 && ix0 + sw + (kw - 1) * dw < w) {  /* no tap of either in the padding */
                    for (long ky = 0, t = 0; ky < kh; ky++)
                        for (long kx = 0; kx < kw; kx++, t++) {
                            tp[t] = rowp[ky] + (ix0 + kx * dw) * c;
                            tq[t] = tp[t] + sw * c;
                        }
                } else {
                    for (long ky = 0, t = 0; ky < kh; ky++) {
                        const uint8_t *row = rowp[ky];
                        for (long kx = 0, ix = ix0; kx < kw; kx++, t++, ix += dw) {
                            tp[t] = row == zrow || ix < 0 || ix >= w ? zrow : row + ix * c;
                            const long iq = two ? ix + sw : ix;
                            tq[t] = row == zrow || iq < 0 || iq >= w ? zrow : row + iq * c;
                        }
                    }
                }
                tp[taps] = tq[taps] = zrow;
                uint8_t *yp = y + ((b * oh + oy) * ow + ox) * c;
                for (long c0 = 0; c0 < c; c0 += 32) {
                    const long left = c - c0;
                    const __mmask32 mk = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
                    __m512i acc0 = _mm512_loadu_si512((const void *)(bias + c0));
                    __m512i acc1 = _mm512_loadu_si512((const void *)(bias + c0 + 16)), acc2 = acc0, acc3 = acc1;
                    for (long p = 0; 2 * p < taps; p++) {
                        const int16_t *wp = w16 + (p * cp + c0) * 2;
                        const __m512i w0 = _mm512_loadu_si512((const void *)wp);
                        const __m512i w1 = _mm512_loadu_si512((const void *)(wp + 32));
                        DW_PAIR(tp, acc0, acc1)
                        DW_PAIR(tq, acc2, acc3)
                    }
                    dw_store(acc0, acc1, mult + c0, lo, hi, yzp, yp + c0, mk);
                    if (two)
                        dw_store(acc2, acc3, mult + c0, lo, hi, yzp, yp + c + c0, mk);
                }
            }
        }
}

/* the kernel sizes of nearly every depthwise conv as constants (their tap loops unrolled), any other as variables */
T512 static void dw_avx512(const long *dg, const long *geom, const uint8_t *x, uint8_t *y, const uint8_t *zrow)
{
    if (geom[CG_KH] == 3 && geom[CG_KW] == 3)
        dw_avx512_k(dg, geom, x, y, zrow, 3, 3);
    else if (geom[CG_KH] == 5 && geom[CG_KW] == 5)
        dw_avx512_k(dg, geom, x, y, zrow, 5, 5);
    else
        dw_avx512_k(dg, geom, x, y, zrow, geom[CG_KH], geom[CG_KW]);
}
#endif

/* a depthwise conv (one weight plane per channel) of x (geom, channels-last) into y (N, OH, OW, C) */
int rpcsrv_qdwconv(const long *dg, const long *geom, const uint8_t *x, uint8_t *y)
{
    const long n = geom[CG_N], c = geom[CG_C];
    uint8_t *nhwc = geom[CG_NCHW] ? malloc((size_t)(n * c * geom[CG_H] * geom[CG_W])) : NULL;
    if (geom[CG_NCHW] && !nhwc)
        return -1;
    if (nhwc) {
        rpcsrv_q_nchw_to_nhwc(x, n, c, geom[CG_H] * geom[CG_W], nhwc);
        x = nhwc;
    }
#if defined(__x86_64__)
    if (rpcsrv_qkernel() == &rpcsrv_qk_vnni512 && geom[CG_KH] * geom[CG_KW] < 64) {
        /* (follows the GEMM's choice: tests that select another kernel run dw_plain) */
        uint8_t *zrow = malloc((size_t)dg[DG_CP]);
        if (!zrow) {
            free(nhwc);
            return -1;
        }
        memset(zrow, (int)(uint8_t)geom[CG_ZA], (size_t)dg[DG_CP]);
        dw_avx512(dg, geom, x, y, zrow);
        free(zrow);
    } else
#endif
        dw_plain(dg, geom, x, y);
    free(nhwc);
    return 0;
}
