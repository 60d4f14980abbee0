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

static inline __attribute__((always_inline)) T512 void vnni512(const uint8_t *const *a, const int8_t *b, long kp,
                                                               int32_t *acc, const int nv)
{
    const uint8_t *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    const long strip = kp * QSTRIP;
    ZERO4(0) ZERO4(1) ZERO4(2) ZERO4(3) ZERO4(4) ZERO4(5)
    for (long k = 0; k < kp; k += 4) {
        const int8_t *bk = b + k * QSTRIP;
        __m512i b0 = _mm512_loadu_si512((const void *)bk), b1 = b0, b2 = b0, b3 = b0;
        if (nv > 1) b1 = _mm512_loadu_si512((const void *)(bk + strip));
        if (nv > 2) b2 = _mm512_loadu_si512((const void *)(bk + 2 * strip));
        if (nv > 3) b3 = _mm512_loadu_si512((const void *)(bk + 3 * strip));
        DOT4(0) DOT4(1) DOT4(2) DOT4(3) DOT4(4) DOT4(5)
    }
    STORE4(0) STORE4(1) STORE4(2) STORE4(3) STORE4(4) STORE4(5)
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
static int has_avxvnni(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni"); }
static int has_vnni256(void) { return __builtin_cpu_supports("avx2") && has_vnni512(); }
static int has_avx2(void) { return __builtin_cpu_supports("avx2"); }

const qkernel rpcsrv_qk_vnni512 = {"AVX-512 VNNI (vpdpbusd, 16 lanes)", 6, 4, 0, tile_vnni512, has_vnni512};
const qkernel rpcsrv_qk_avxvnni = {"AVX-VNNI (vpdpbusd, 8 lanes)", 6, 1, 0, tile_avxvnni, has_avxvnni};
const qkernel rpcsrv_qk_vnni256 = {"AVX-512VL VNNI (vpdpbusd, 8 lanes)", 6, 1, 0, tile_vnni256, has_vnni256};
const qkernel rpcsrv_qk_avx2 = {"AVX2 (vpmaddwd, 16-bit products)", 2, 1, 0, tile_avx2, has_avx2};
#endif
