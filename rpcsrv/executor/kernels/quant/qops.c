/* The int8 ops around the convolutions and GEMMs, each one pass in generic C (vectorised per x86 level and
 * picked at load; NEON on ARM by the compiler), rounding as qgemm.c's epilogue does (clamp, then half to even):
 *
 * - rpcsrv_quantize_f32: QuantizeLinear per tensor, float32 to int8/uint8, optionally channels-first in and
 *   channels-last out (the int8 plans' layout) in the same pass;
 * - rpcsrv_dequantize_q8: DequantizeLinear per tensor, int8/uint8 to float32, channels-last in, channels-first
 *   out when asked;
 * - rpcsrv_qadd: QLinearAdd of two tensors of one shape and layout, as onnxruntime computes it (each operand
 *   dequantized, the sum quantized), with a fused clamp;
 * - rpcsrv_qgap: QLinearGlobalAveragePool over channels-last images (exact int32 sums, one requantization);
 * - rpcsrv_qmaxpool: MaxPool on the integers of a channels-last tensor (the same order as their real values);
 * - rpcsrv_qlut: an elementwise op of one int8 input as its table of 256 outputs (QLinearSigmoid, LeakyRelu,
 *   a requantizing copy);
 * - rpcsrv_dynamic_quantize: DynamicQuantizeLinear, the range [min(x, 0), max(x, 0)] over 0..255. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define QCLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QCLONES
#endif

#define MAGIC 12582912.0f  /* 1.5 * 2^23: (f + MAGIC) - MAGIC rounds |f| < 2^22 half to even */

static inline float clampf(float f, float lo, float hi) { return f < lo ? lo : f > hi ? hi : f; }

/* y = saturate(round(x / scale) + zp) over [lo, hi]; x (n, c, hw) float32; nhwc: y is (n, hw, c), written a block of
 * 64 pixels at a time (all channels quantized into a scratch, then stored pixel by pixel) */
QCLONES
void rpcsrv_quantize_f32(const float *x, long n, long c, long hw, float scale, long zp, long lo, long hi,
                         long nhwc, uint8_t *y)
{
    const float flo = (float)(lo - zp), fhi = (float)(hi - zp);
    if (!nhwc || c == 1 || c > 64) {
        for (long b = 0; b < n; b++)
            for (long ch = 0; ch < c; ch++) {
                const float *xr = x + (b * c + ch) * hw;
                uint8_t *yr = nhwc ? y + b * hw * c + ch : y + (b * c + ch) * hw;
                const long step = nhwc ? c : 1;
                for (long i = 0; i < hw; i++)
                    yr[i * step] = (uint8_t)((int32_t)((clampf(xr[i] / scale, flo, fhi) + MAGIC) - MAGIC) + (int32_t)zp);
            }
        return;
    }
    uint8_t q[64 * 64];
    for (long b = 0; b < n; b++)
        for (long i0 = 0; i0 < hw; i0 += 64) {
            const long len = hw - i0 < 64 ? hw - i0 : 64;
            for (long ch = 0; ch < c; ch++) {
                const float *xr = x + (b * c + ch) * hw + i0;
                for (long i = 0; i < len; i++)
                    q[ch * 64 + i] = (uint8_t)((int32_t)((clampf(xr[i] / scale, flo, fhi) + MAGIC) - MAGIC) + (int32_t)zp);
            }
            uint8_t *yb = y + (b * hw + i0) * c;
            if (c == 3)  /* an image's channels: the loop over them unrolled */
                for (long i = 0; i < len; i++)
                    yb[i * 3] = q[i], yb[i * 3 + 1] = q[64 + i], yb[i * 3 + 2] = q[128 + i];
            else
                for (long i = 0; i < len; i++)
                    for (long ch = 0; ch < c; ch++)
                        yb[i * c + ch] = q[ch * 64 + i];
        }
}

/* y = (x - zp) * scale; x (n, hw, c) when nhwc else (n, c, hw), y (n, c, hw) */
QCLONES
void rpcsrv_dequantize_q8(const uint8_t *x, long n, long c, long hw, long xsigned, float scale, long zp, long nhwc,
                          float *y)
{
    const long cs = nhwc ? 1 : hw, is = nhwc ? c : 1;
    for (long b = 0; b < n; b++)
        for (long ch = 0; ch < c; ch++) {
            const uint8_t *xr = x + b * c * hw + ch * cs;
            float *yr = y + (b * c + ch) * hw;
            if (xsigned)
                for (long i = 0; i < hw; i++)
                    yr[i] = (float)((int32_t)(int8_t)xr[i * is] - (int32_t)zp) * scale;
            else
                for (long i = 0; i < hw; i++)
                    yr[i] = (float)((int32_t)xr[i * is] - (int32_t)zp) * scale;
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QADD512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

/* 16 operands widened to int32 straight from memory (mask: the ones that exist) */
static inline __attribute__((always_inline)) QADD512 __m512i qadd_load(const uint8_t *p, __mmask16 m, int sgn)
{
    const __m128i v = _mm_maskz_loadu_epi8(m, p);
    return sgn ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
}

/* rpcsrv_qadd in AVX-512, 16 elements a step, each widened from memory in one instruction (the compiler's own
 * vectorisation widened through 16 bits with extracts: twice the instructions): the same float32 operations as the
 * C loop of the x86-64-v3 and v4 builds, the product of a contracted into the sum (fma), the division exact,
 * cvtps2dq rounding half to even */
static QADD512 void qadd_avx512(const uint8_t *a, const uint8_t *b, uint8_t *y, long count, int sgn, float sa,
                                long za, float sb, long zb, float sc, long yzp, float flo, float fhi)
{
    const __m512 vsa = _mm512_set1_ps(sa), vsb = _mm512_set1_ps(sb), vsc = _mm512_set1_ps(sc);
    const __m512 vlo = _mm512_set1_ps(flo), vhi = _mm512_set1_ps(fhi);
    const __m512i vza = _mm512_set1_epi32((int32_t)za), vzb = _mm512_set1_epi32((int32_t)zb);
    const __m512i vyzp = _mm512_set1_epi32((int32_t)yzp);
#define QADD16(i, m)                                                                                             \
    {                                                                                                            \
        const __m512 fa = _mm512_cvtepi32_ps(_mm512_sub_epi32(qadd_load(a + (i), m, sgn), vza));                 \
        const __m512 fb = _mm512_cvtepi32_ps(_mm512_sub_epi32(qadd_load(b + (i), m, sgn), vzb));                 \
        __m512 f = _mm512_div_ps(_mm512_fmadd_ps(fa, vsa, _mm512_mul_ps(fb, vsb)), vsc);                          \
        f = _mm512_min_ps(_mm512_max_ps(f, vlo), vhi);                                                            \
        _mm_mask_storeu_epi8(y + (i), m, _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), vyzp)));    \
    }
    long i = 0;
    for (; i + 64 <= count; i += 64) {
        QADD16(i, 0xffff) QADD16(i + 16, 0xffff) QADD16(i + 32, 0xffff) QADD16(i + 48, 0xffff)
    }
    for (; i < count; i += 16)
        QADD16(i, count - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (count - i)) - 1))
#undef QADD16
}
#endif

/* y = saturate(round(((a - za) * sa + (b - zb) * sb) / sc) + yzp) over [lo, hi]: each operand dequantized, the sum
 * quantized, all in float32 (onnxruntime's QLinearAdd gives these very integers; scale ratios would not) */
QCLONES
void rpcsrv_qadd(const uint8_t *a, const uint8_t *b, uint8_t *y, long count, long signed_, float sa, long za,
                 float sb, long zb, float sc, long yzp, long lo, long hi)
{
    const float flo = (float)(lo - yzp), fhi = (float)(hi - yzp);
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
        qadd_avx512(a, b, y, count, (int)signed_, sa, za, sb, zb, sc, yzp, flo, fhi);
        return;
    }
#endif
    if (signed_) {
        const int8_t *a8 = (const int8_t *)a, *b8 = (const int8_t *)b;
        for (long i = 0; i < count; i++) {
            float f = ((float)((int32_t)a8[i] - (int32_t)za) * sa + (float)((int32_t)b8[i] - (int32_t)zb) * sb) / sc;
            y[i] = (uint8_t)((int32_t)((clampf(f, flo, fhi) + MAGIC) - MAGIC) + (int32_t)yzp);
        }
    } else {
        for (long i = 0; i < count; i++) {
            float f = ((float)((int32_t)a[i] - (int32_t)za) * sa + (float)((int32_t)b[i] - (int32_t)zb) * sb) / sc;
            y[i] = (uint8_t)((int32_t)((clampf(f, flo, fhi) + MAGIC) - MAGIC) + (int32_t)yzp);
        }
    }
}

/* global average pool of x (n, hw, c) into y (n, c): sum(x - zp) * mult, rounded, + yzp */
QCLONES
void rpcsrv_qgap(const uint8_t *x, long n, long hw, long c, long xsigned, long zp, float mult, long yzp, long lo,
                 long hi, uint8_t *y)
{
    int32_t acc[512];
    const float flo = (float)(lo - yzp), fhi = (float)(hi - yzp);
    for (long b = 0; b < n; b++)
        for (long c0 = 0; c0 < c; c0 += 512) {
            const long cl = c - c0 < 512 ? c - c0 : 512;
            for (long ch = 0; ch < cl; ch++)
                acc[ch] = -(int32_t)(zp * hw);
            for (long i = 0; i < hw; i++) {
                const uint8_t *xr = x + (b * hw + i) * c + c0;
                if (xsigned)
                    for (long ch = 0; ch < cl; ch++)
                        acc[ch] += (int8_t)xr[ch];
                else
                    for (long ch = 0; ch < cl; ch++)
                        acc[ch] += xr[ch];
            }
            for (long ch = 0; ch < cl; ch++)
                y[b * c + c0 + ch] = (uint8_t)((int32_t)((clampf((float)acc[ch] * mult, flo, fhi) + MAGIC) - MAGIC) +
                                               (int32_t)yzp);
        }
}

/* one output pixel's maximum over channels [c0, c0 + cl) of its taps, cl <= 64 (a constant where inlined) */
static inline __attribute__((always_inline)) void qmax_pixel(const uint8_t *x, long h, long w, long c, const long *g,
                                                              long b, long oy, long ox, long c0, const long cl,
                                                              uint8_t flip, uint8_t *yr)
{
    uint8_t m[64] = {0};
    for (long ky = 0; ky < g[0]; ky++) {
        const long iy = oy * g[2] - g[6] + ky * g[4];
        if (iy < 0 || iy >= h)
            continue;
        for (long kx = 0; kx < g[1]; kx++) {
            const long ix = ox * g[3] - g[7] + kx * g[5];
            if (ix < 0 || ix >= w)
                continue;
            const uint8_t *xr = x + ((b * h + iy) * w + ix) * c + c0;
            for (long ch = 0; ch < cl; ch++) {
                const uint8_t v = xr[ch] ^ flip;
                m[ch] = v > m[ch] ? v : m[ch];
            }
        }
    }
    for (long ch = 0; ch < cl; ch++)
        yr[c0 + ch] = m[ch] ^ flip;
}

/* max pool of x (n, h, w, c) into y (n, oh, ow, c): g = kh kw sh sw dh dw pt pl oh ow; padding never wins.  Each
 * pixel's maximum is taken 64 channels at a time in a local block (int8 as uint8 with the sign bit flipped, which
 * keeps the order), written once */
QCLONES
void rpcsrv_qmaxpool(const uint8_t *x, long n, long h, long w, long c, long xsigned, const long *g, uint8_t *y)
{
    const long oh = g[8], ow = g[9];
    const uint8_t flip = xsigned ? 0x80 : 0;
    for (long b = 0; b < n; b++)
        for (long oy = 0; oy < oh; oy++)
            for (long ox = 0; ox < ow; ox++) {
                uint8_t *yr = y + ((b * oh + oy) * ow + ox) * c;
                long c0 = 0;
                for (; c0 + 64 <= c; c0 += 64)
                    qmax_pixel(x, h, w, c, g, b, oy, ox, c0, 64, flip, yr);
                if (c0 < c)
                    qmax_pixel(x, h, w, c, g, b, oy, ox, c0, c - c0, flip, yr);
            }
}

/* y[i] = table[x[i]] (int8 inputs index from -128: table[x + 128]) */
void rpcsrv_qlut(const uint8_t *x, long count, long xsigned, const uint8_t *table, uint8_t *y)
{
    const uint8_t shift = xsigned ? 0x80 : 0;
    for (long i = 0; i < count; i++)
        y[i] = table[(uint8_t)(x[i] ^ shift)];
}

/* DynamicQuantizeLinear of x (count float32) into y (uint8); params: [scale, zero point] as floats */
QCLONES
void rpcsrv_dynamic_quantize(const float *x, long count, uint8_t *y, float *params)
{
    /* the range over 16 lanes (a running minimum and maximum per lane, in generic vectors: the compiler left
     * lane arrays scalar, every element waiting for the one before), then across them; a NaN never wins */
    typedef float f16 __attribute__((vector_size(64)));
    typedef int32_t m16 __attribute__((vector_size(64)));
    typedef float f16u __attribute__((vector_size(64), aligned(4), may_alias));
    f16 lov = {0}, hiv = {0};
    long i = 0;
    for (; i + 16 <= count; i += 16) {
        const f16 v = *(const f16u *)(x + i);
        const m16 below = v < lov, above = v > hiv;
        lov = (f16)(((m16)v & below) | ((m16)lov & ~below));
        hiv = (f16)(((m16)v & above) | ((m16)hiv & ~above));
    }
    float lo = 0.0f, hi = 0.0f;
    for (long j = 0; j < 16; j++) {
        lo = lov[j] < lo ? lov[j] : lo;
        hi = hiv[j] > hi ? hiv[j] : hi;
    }
    for (; i < count; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    const float scale = (hi - lo) / 255.0f;
    if (scale == 0.0f) {
        memset(y, 0, (size_t)count);
        params[0] = 0.0f, params[1] = 0.0f;
        return;
    }
    const float zpf = clampf(nearbyintf(0.0f - lo / scale), 0.0f, 255.0f);
    const int32_t zp = (int32_t)zpf;
    for (long i = 0; i < count; i++)
        y[i] = (uint8_t)((int32_t)((clampf(x[i] / scale, (float)-zp, (float)(255 - zp)) + MAGIC) - MAGIC) + zp);
    params[0] = scale, params[1] = zpf;
}
