/* ARM micro-kernels of the int8 GEMM (qgemm.h); their native activation type is int8 (uint8 activations are
 * flipped as they are packed):
 *
 * - aarch64 with the dot product extension (ARMv8.2 dotprod, taken where AT_HWCAP has ASIMDDP): sdot, four
 *   int8 products summed into each int32 lane, 4 rows x 16 columns, compiled by a function attribute so that the
 *   generic aarch64 library has it too;
 * - NEON (aarch64, and armv7 built with NEON): vmull.s8 (16-bit products, at most 128 x 128) and vpadal.s16
 *   (pairs added into int32 lanes), 2 rows x 16 columns, each column's two lanes added at the end. */
#if defined(__aarch64__) || (defined(__arm__) && defined(__ARM_NEON))
#include <arm_neon.h>
#include <string.h>

#include "qgemm.h"

static inline int8x8_t dup4(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return vreinterpret_s8_u32(vdup_n_u32(v));
}

/* (c0 c0 c1 c1), (c2 c2 c3 c3) -> c0 c1 c2 c3 */
static inline int32x4_t pair_sums(int32x4_t lo, int32x4_t hi)
{
    return vcombine_s32(vpadd_s32(vget_low_s32(lo), vget_high_s32(lo)), vpadd_s32(vget_low_s32(hi), vget_high_s32(hi)));
}

static void tile_neon(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc)
{
    (void)nv;
    int32x4_t c[2][8];
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 8; q++)
            c[r][q] = vdupq_n_s32(0);
    for (long k = 0; k < kp; k += 4) {
        int8x16_t bq[4];
        for (int q = 0; q < 4; q++)
            bq[q] = vld1q_s8(b + k * QSTRIP + q * 16);
        for (int r = 0; r < 2; r++) {
            int8x8_t av = dup4(a[r] + k);
            for (int q = 0; q < 4; q++) {
                c[r][2 * q] = vpadalq_s16(c[r][2 * q], vmull_s8(vget_low_s8(bq[q]), av));
                c[r][2 * q + 1] = vpadalq_s16(c[r][2 * q + 1], vmull_s8(vget_high_s8(bq[q]), av));
            }
        }
    }
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 4; q++)
            vst1q_s32(acc + r * QACC + q * 4, pair_sums(c[r][2 * q], c[r][2 * q + 1]));
}

static int always(void) { return 1; }

const qkernel rpcsrv_qk_neon = {"NEON (vmull.s8, vpadal.s16)", 2, 1, 1, tile_neon, always, NULL, NULL};

#if defined(__aarch64__)
#include <sys/auxv.h>

#define TDOT __attribute__((target("arch=armv8.2-a+dotprod")))

TDOT static void tile_dotprod(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc)
{
    (void)nv;
    int32x4_t c[4][4];
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++)
            c[r][q] = vdupq_n_s32(0);
    for (long k = 0; k < kp; k += 4) {
        int8x16_t bq[4];
        for (int q = 0; q < 4; q++)
            bq[q] = vld1q_s8(b + k * QSTRIP + q * 16);
        for (int r = 0; r < 4; r++) {
            uint32_t v;
            memcpy(&v, a[r] + k, 4);
            int8x16_t av = vreinterpretq_s8_u32(vdupq_n_u32(v));
            for (int q = 0; q < 4; q++)
                c[r][q] = vdotq_s32(c[r][q], bq[q], av);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++)
            vst1q_s32(acc + r * QACC + q * 4, c[r][q]);
}

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
static int has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

const qkernel rpcsrv_qk_dotprod = {"aarch64 dotprod (sdot)", 4, 1, 1, tile_dotprod, has_dotprod, NULL, NULL};
#endif
#endif
