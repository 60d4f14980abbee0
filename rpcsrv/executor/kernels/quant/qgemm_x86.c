/* x86-64 micro-kernels of the int8 GEMM (qgemm.h), each compiled for its instructions by a function attribute,
 * whatever the library's own target, and taken only where cpuid says the CPU has them (qgemm.c):
 *
 * - AVX-512 VNNI: 6 rows x up to 4 strips (64 columns) of vpdpbusd on 16-lane vectors (uint8 x int8, four
 *   products summed into each int32 lane: exact, no intermediate saturation);
 * - AVX-VNNI (VEX vpdpbusd) and AVX-512 VNNI on 8-lane vectors: 6 rows x 1 strip;
 * - AVX2: vpmaddubsw would saturate (255 x 127 twice is past int16), so the activations and weights are widened
 *   to 16 bits and multiplied by vpmaddwd (two products per int32 lane, at most 2 x 255 x 128): 2 rows x 1 strip,
 *   each column's two lanes added at the end. */
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#include "qgemm.h"

static inline __attribute__((always_inline)) int32_t load4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* the accumulators are named variables (an array of them was spilled to the stack by GCC 12) */
#define ZERO4(r) __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
/* the panels' sums start from the store's per-column terms (qepi.corr: bias and zero points), not from 0 */
#define INIT4(r) __m512i c##r##0 = k0, c##r##1 = k1, c##r##2 = k2, c##r##3 = k3;
#define CORR4                                                                                       \
    const __m512i k0 = _mm512_loadu_si512((const void *)e->corr);                                   \
    const __m512i k1 = _mm512_loadu_si512((const void *)(e->corr + 16));                            \
    const __m512i k2 = _mm512_loadu_si512((const void *)(e->corr + 32));                            \
    const __m512i k3 = _mm512_loadu_si512((const void *)(e->corr + 48));
#define DOT4(r)                                                          \
    {                                                                    \
        __m512i av = _mm512_set1_epi32(load4(a##r + k));                 \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, av, b0);                  \
        if (nv > 1) c##r##1 = _mm512_dpbusd_epi32(c##r##1, av, b1);      \
        if (nv > 2) c##r##2 = _mm512_dpbusd_epi32(c##r##2, av, b2);      \
        if (nv > 3) c##r##3 = _mm512_dpbusd_epi32(c##r##3, av, b3);      \
    }
#define STORE4(r)                                                                     \
    {                                                                                 \
        _mm512_storeu_si512((void *)(acc + r * QACC), c##r##0);                       \
        if (nv > 1) _mm512_storeu_si512((void *)(acc + r * QACC + 16), c##r##1);      \
        if (nv > 2) _mm512_storeu_si512((void *)(acc + r * QACC + 32), c##r##2);      \
        if (nv > 3) _mm512_storeu_si512((void *)(acc + r * QACC + 48), c##r##3);      \
    }

/* the k loop of a 6-row tile over nv strips from BASE (a0..a5: the rows, read from a##r + k; strip: the pitch of
 * the chunk's strips) for k in [0, KEND) */
#define VNNI512_KLOOP(BASE, KEND)                                                       \
    for (long k = 0; k < (KEND); k += 4) {                                              \
        const int8_t *bk = (BASE) + k * QSTRIP;                                         \
        __m512i b0 = _mm512_loadu_si512((const void *)bk), b1 = b0, b2 = b0, b3 = b0;   \
        if (nv > 1) b1 = _mm512_loadu_si512((const void *)(bk + strip));                \
        if (nv > 2) b2 = _mm512_loadu_si512((const void *)(bk + 2 * strip));            \
        if (nv > 3) b3 = _mm512_loadu_si512((const void *)(bk + 3 * strip));            \
        DOT4(0) DOT4(1) DOT4(2) DOT4(3) DOT4(4) DOT4(5)                                 \
    }
#define VNNI512_LOOP                                                                    \
    ZERO4(0) ZERO4(1) ZERO4(2) ZERO4(3) ZERO4(4) ZERO4(5)                               \
    VNNI512_KLOOP(b, kp)

static inline __attribute__((always_inline)) T512 void vnni512(const uint8_t *const *a, const int8_t *b, long kp,
                                                               int32_t *acc, const int nv)
{
    const uint8_t *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    const long strip = kp * QSTRIP;
    VNNI512_LOOP
    STORE4(0) STORE4(1) STORE4(2) STORE4(3) STORE4(4) STORE4(5)
}

/* qgemm.h's store of 16 columns (from 16 * v) of one row, in registers (the sums c already hold qepi.corr); mask:
 * the columns that exist */
static inline __attribute__((always_inline)) T512 void store16(__m512i c, const qepi *e, int v, char *yr,
                                                               __mmask16 mask, int32_t rowsum)
{
    __m512i t = c;
    if (e->bzp)
        t = _mm512_sub_epi32(t, _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(mask, e->bzp + 16 * v),
                                                   _mm512_set1_epi32(rowsum)));
    if (e->out == QOUT_I32) {
        _mm512_mask_storeu_epi32(yr + 64 * v, mask, t);
        return;
    }
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_loadu_ps(e->mult + 16 * v));
    if (e->out == QOUT_F32) {
        if (e->fbias)
            f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(mask, e->fbias + 16 * v));
        if (e->sat)  /* a fused Relu: max(0, f) (a NaN f stays one: the second operand) */
            f = _mm512_max_ps(_mm512_setzero_ps(), f);
        _mm512_mask_storeu_ps(yr + 64 * v, mask, f);
        return;
    }
    if (e->sat) {  /* rounded, then narrowed with saturation: the same as clamping first to the type's range */
        __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(e->yzp));
        if (e->out == QOUT_U8)
            _mm512_mask_cvtusepi32_storeu_epi8(yr + 16 * v, mask, _mm512_max_epi32(q, _mm512_setzero_si512()));
        else
            _mm512_mask_cvtsepi32_storeu_epi8(yr + 16 * v, mask, q);
        return;
    }
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(e->flo)), _mm512_set1_ps(e->fhi));
    __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(e->yzp));  /* nearest, ties to even */
    _mm512_mask_cvtepi32_storeu_epi8(yr + 16 * v, mask, q);
}

#define STOREROW(r)                                                                                 \
    if (r < nrows) {                                                                                \
        char *yr = y + (r0 + r) * ldy * esize;                                                      \
        const int32_t rs = e->rowsum ? e->rowsum[r0 + r] : 0;                                       \
        store16(c##r##0, e, 0, yr, m0, rs);                                                         \
        if (nv > 1) store16(c##r##1, e, 1, yr, m1, rs);                                             \
        if (nv > 2) store16(c##r##2, e, 2, yr, m2, rs);                                             \
        if (nv > 3) store16(c##r##3, e, 3, yr, m3, rs);                                             \
    }

/* m0..m3: the lanes of the panel's four 16-column vectors that hold one of e->cols columns */
#define COLUMN_MASKS(e)                                                                                      \
    __mmask16 mk[4];                                                                                         \
    for (int v = 0; v < 4; v++) {                                                                            \
        long left = (e)->cols - 16 * v;                                                                      \
        mk[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);              \
    }                                                                                                        \
    const __mmask16 m0 = mk[0], m1 = mk[1], m2 = mk[2], m3 = mk[3];

static inline __attribute__((always_inline)) T512 void panel512(const uint8_t *const *rows, long m, const int8_t *b,
                                                                long kp, const qepi *e, char *y, long ldy,
                                                                const int nv)
{
    const long strip = kp * QSTRIP, esize = e->out >= QOUT_I32 ? 4 : 1;
    COLUMN_MASKS(e)
    CORR4
    for (long r0 = 0; r0 < m; r0 += 6) {
        const long nrows = m - r0 < 6 ? m - r0 : 6;
        const uint8_t *a0 = rows[r0], *a1 = rows[r0 + (nrows > 1 ? 1 : 0)], *a2 = rows[r0 + (nrows > 2 ? 2 : 0)];
        const uint8_t *a3 = rows[r0 + (nrows > 3 ? 3 : 0)], *a4 = rows[r0 + (nrows > 4 ? 4 : 0)];
        const uint8_t *a5 = rows[r0 + (nrows > 5 ? 5 : 0)];
        INIT4(0) INIT4(1) INIT4(2) INIT4(3) INIT4(4) INIT4(5)
        VNNI512_KLOOP(b, kp)
        STOREROW(0) STOREROW(1) STOREROW(2) STOREROW(3) STOREROW(4) STOREROW(5)
    }
}

/* the same tiles with each row's depth read as taps of c bytes each, from a pointer per (row, tap) (ptrs: m x taps):
 * a conv's patches read in place from its channels-last input, no gathered copy (c a multiple of 4) */
static inline __attribute__((always_inline)) T512 void ipanel512(const uint8_t *const *ptrs, long m, long taps, long c,
                                                                 const int8_t *b, long kp, const qepi *e, char *y,
                                                                 long ldy, const int nv)
{
    const long strip = kp * QSTRIP, esize = e->out >= QOUT_I32 ? 4 : 1;
    COLUMN_MASKS(e)
    CORR4
    for (long r0 = 0; r0 < m; r0 += 6) {
        const long nrows = m - r0 < 6 ? m - r0 : 6;
        const uint8_t *const *p0 = ptrs + r0 * taps, *const *p1 = ptrs + (r0 + (nrows > 1 ? 1 : 0)) * taps;
        const uint8_t *const *p2 = ptrs + (r0 + (nrows > 2 ? 2 : 0)) * taps;
        const uint8_t *const *p3 = ptrs + (r0 + (nrows > 3 ? 3 : 0)) * taps;
        const uint8_t *const *p4 = ptrs + (r0 + (nrows > 4 ? 4 : 0)) * taps;
        const uint8_t *const *p5 = ptrs + (r0 + (nrows > 5 ? 5 : 0)) * taps;
        INIT4(0) INIT4(1) INIT4(2) INIT4(3) INIT4(4) INIT4(5)
        for (long t = 0; t < taps; t++) {
            const uint8_t *a0 = p0[t], *a1 = p1[t], *a2 = p2[t], *a3 = p3[t], *a4 = p4[t], *a5 = p5[t];
            VNNI512_KLOOP(b + t * c * QSTRIP, c)
        }
        STOREROW(0) STOREROW(1) STOREROW(2) STOREROW(3) STOREROW(4) STOREROW(5)
    }
}

T512 static void ipanel_vnni512(const uint8_t *const *ptrs, long m, long taps, long c, const int8_t *b, long kp,
                                long nv, const qepi *e, char *y, long ldy)
{
    switch (nv) {
    case 1: ipanel512(ptrs, m, taps, c, b, kp, e, y, ldy, 1); break;
    case 2: ipanel512(ptrs, m, taps, c, b, kp, e, y, ldy, 2); break;
    case 3: ipanel512(ptrs, m, taps, c, b, kp, e, y, ldy, 3); break;
    default: ipanel512(ptrs, m, taps, c, b, kp, e, y, ldy, 4); break;
    }
}

T512 static void panel_vnni512(const uint8_t *const *rows, long m, const int8_t *b, long kp, long nv, const qepi *e,
                               char *y, long ldy)
{
    switch (nv) {
    case 1: panel512(rows, m, b, kp, e, y, ldy, 1); break;
    case 2: panel512(rows, m, b, kp, e, y, ldy, 2); break;
    case 3: panel512(rows, m, b, kp, e, y, ldy, 3); break;
    default: panel512(rows, m, b, kp, e, y, ldy, 4); break;
    }
}

T512 static void tile_vnni512(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc)
{
    switch (nv) {
    case 1: vnni512(a, b, kp, acc, 1); break;
    case 2: vnni512(a, b, kp, acc, 2); break;
    case 3: vnni512(a, b, kp, acc, 3); break;
    default: vnni512(a, b, kp, acc, 4); break;
    }
}

/* 8-lane vpdpbusd, 6 rows x 16 columns; DPBUSD names the VEX (AVX-VNNI) or EVEX (AVX-512VL) form */
#define VNNI256_TILE(NAME, TARGET, DPBUSD)                                                                   \
    TARGET static void NAME(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc)      \
    {                                                                                                     \
        (void)nv;                                                                                         \
        __m256i c[6][2];                                                                                  \
        for (int r = 0; r < 6; r++)                                                                       \
            c[r][0] = c[r][1] = _mm256_setzero_si256();                                                   \
        for (long k = 0; k < kp; k += 4) {                                                                \
            __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + k * QSTRIP));                           \
            __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + k * QSTRIP + 32));                      \
            for (int r = 0; r < 6; r++) {                                                                 \
                __m256i av = _mm256_set1_epi32(load4(a[r] + k));                                          \
                c[r][0] = DPBUSD(c[r][0], av, b0);                                                        \
                c[r][1] = DPBUSD(c[r][1], av, b1);                                                        \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < 6; r++) {                                                                     \
            _mm256_storeu_si256((__m256i *)(acc + r * QACC), c[r][0]);                                    \
            _mm256_storeu_si256((__m256i *)(acc + r * QACC + 8), c[r][1]);                                \
        }                                                                                                 \
    }

VNNI256_TILE(tile_avxvnni, __attribute__((target("avx2,avxvnni"))), _mm256_dpbusd_avx_epi32)
VNNI256_TILE(tile_vnni256, __attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))), _mm256_dpbusd_epi32)

#define TAVX2 __attribute__((target("avx2")))

/* the sums of each column's two lanes: acc (c0 c0 c1 c1 | c2 c2 c3 c3), (c4 c4 c5 c5 | c6 c6 c7 c7) -> c0..c7 */
TAVX2 static inline __m256i pair_sums(__m256i lo, __m256i hi)
{
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xd8);
}

TAVX2 static void tile_avx2(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc)
{
    (void)nv;
    __m256i c[2][4];
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 4; q++)
            c[r][q] = _mm256_setzero_si256();
    for (long k = 0; k < kp; k += 4) {
        __m256i bw[4];  /* 4 columns x 4 depths each, widened: (b0 b1) (b2 b3) pairs per column */
        for (int q = 0; q < 4; q++)
            bw[q] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + k * QSTRIP + q * 16)));
        for (int r = 0; r < 2; r++) {
            __m256i av = _mm256_cvtepu8_epi16(_mm_set1_epi32(load4(a[r] + k)));  /* (a0 a1) (a2 a3) ... */
            for (int q = 0; q < 4; q++)
                c[r][q] = _mm256_add_epi32(c[r][q], _mm256_madd_epi16(av, bw[q]));
        }
    }
    for (int r = 0; r < 2; r++) {
        _mm256_storeu_si256((__m256i *)(acc + r * QACC), pair_sums(c[r][0], c[r][1]));
        _mm256_storeu_si256((__m256i *)(acc + r * QACC + 8), pair_sums(c[r][2], c[r][3]));
    }
}

static int has_vnni512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
/* AVX-VNNI: cpuid leaf 7, sub-leaf 1, eax bit 4 (not every compiler's __builtin_cpu_supports knows its name) */
static int has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx2") && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1);
}
static int has_vnni256(void) { return __builtin_cpu_supports("avx2") && has_vnni512(); }
static int has_avx2(void) { return __builtin_cpu_supports("avx2"); }

const qkernel rpcsrv_qk_vnni512 = {"AVX-512 VNNI (vpdpbusd, 16 lanes)", 6, 4, 0, tile_vnni512, has_vnni512,
                                   panel_vnni512, ipanel_vnni512};
const qkernel rpcsrv_qk_avxvnni = {"AVX-VNNI (vpdpbusd, 8 lanes)", 6, 1, 0, tile_avxvnni, has_avxvnni, NULL, NULL};
const qkernel rpcsrv_qk_vnni256 = {"AVX-512VL VNNI (vpdpbusd, 8 lanes)", 6, 1, 0, tile_vnni256, has_vnni256, NULL, NULL};
const qkernel rpcsrv_qk_avx2 = {"AVX2 (vpmaddwd, 16-bit products)", 2, 1, 0, tile_avx2, has_avx2, NULL, NULL};
#endif
