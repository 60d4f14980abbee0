/* A run of int8 steps in one call (``quant/qchain.py`` makes the program, ``examplejson/qchain_fold.py`` the runs):
 * each step is a function of one signature, (parameter block, operand a, operand b, result), called in order, its
 * operands and result either in one arena the caller allocates per call (non-negative offsets) or among the run's
 * inputs (offset -1 - i: the i-th input's address).  A step's non-zero return ends the run with that value.
 *
 * The step functions below adapt the int8 kernels (qconv.c, qops.c) to that signature; their blocks are long
 * arrays (a float as the bit pattern of its float32 in the low 32 bits). */
#include <stdint.h>
#include <string.h>

#include "qgemm.h"

typedef int (*qstep_fn)(const long *blk, const void *a, const void *b, void *y);
enum { QS_FN, QS_BLK, QS_A, QS_B, QS_Y, QS_SIZE };

void rpcsrv_quantize_f32(const float *x, long n, long c, long hw, float scale, long zp, long lo, long hi,
                         long nhwc, uint8_t *y);
void rpcsrv_qadd(const uint8_t *a, const uint8_t *b, uint8_t *y, long count, long signed_, float sa, long za,
                 float sb, long zb, float sc, long yzp, long lo, long hi);
void rpcsrv_qgap(const uint8_t *x, long n, long hw, long c, long xsigned, long zp, float mult, long yzp, long lo,
                 long hi, uint8_t *y);
void rpcsrv_qmaxpool(const uint8_t *x, long n, long h, long w, long c, long xsigned, const long *geom, uint8_t *y);
int rpcsrv_qconv(const long *g, const long *geom, const uint8_t *x, void *y);
int rpcsrv_qdwconv(const long *dg, const long *geom, const uint8_t *x, uint8_t *y);
int rpcsrv_qconv_s2d(const long *s, const uint8_t *x, void *y);

static float bits_f32(long v)
{
    const int32_t i = (int32_t)v;
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static char *operand(long v, char *arena, void *const *inputs) { return v >= 0 ? arena + v : (char *)inputs[-1 - v]; }

int rpcsrv_qchain(const long *prog, long steps, char *arena, void *const *inputs)
{
    for (long k = 0; k < steps; k++) {
        const long *s = prog + k * QS_SIZE;
        const int r = ((qstep_fn)s[QS_FN])((const long *)s[QS_BLK], operand(s[QS_A], arena, inputs),
                                           operand(s[QS_B], arena, inputs), operand(s[QS_Y], arena, inputs));
        if (r != 0)
            return r;
    }
    return 0;
}

/* blk: the GEMM block, the geometry block */
int rpcsrv_qstep_conv(const long *blk, const void *a, const void *b, void *y)
{
    (void)b;
    return rpcsrv_qconv((const long *)blk[0], (const long *)blk[1], a, y);
}

/* blk: the depthwise block, the geometry block */
int rpcsrv_qstep_dwconv(const long *blk, const void *a, const void *b, void *y)
{
    (void)b;
    return rpcsrv_qdwconv((const long *)blk[0], (const long *)blk[1], a, y);
}

/* blk: qconv_s2d.c's block */
int rpcsrv_qstep_s2dconv(const long *blk, const void *a, const void *b, void *y)
{
    (void)b;
    return rpcsrv_qconv_s2d(blk, a, y);
}

/* blk: count, signed, a scale, a zero point, b scale, b zero point, y scale, y zero point, lo, hi */
int rpcsrv_qstep_add(const long *blk, const void *a, const void *b, void *y)
{
    rpcsrv_qadd(a, b, y, blk[0], blk[1], bits_f32(blk[2]), blk[3], bits_f32(blk[4]), blk[5], bits_f32(blk[6]),
                blk[7], blk[8], blk[9]);
    return 0;
}

/* blk: n, c, hw, scale, zero point, lo, hi, channels-last out */
int rpcsrv_qstep_quantize(const long *blk, const void *a, const void *b, void *y)
{
    (void)b;
    rpcsrv_quantize_f32(a, blk[0], blk[1], blk[2], bits_f32(blk[3]), blk[4], blk[5], blk[6], blk[7], y);
    return 0;
}

/* blk: n, hw, c, signed, x zero point, multiplier, y zero point, lo, hi */
int rpcsrv_qstep_gap(const long *blk, const void *a, const void *b, void *y)
{
    (void)b;
    rpcsrv_qgap(a, blk[0], blk[1], blk[2], blk[3], blk[4], bits_f32(blk[5]), blk[6], blk[7], blk[8], y);
    return 0;
}

/* blk: n, h, w, c, signed, the pool's geometry block */
int rpcsrv_qstep_maxpool(const long *blk, const void *a, const void *b, void *y)
{
    (void)b;
    rpcsrv_qmaxpool(a, blk[0], blk[1], blk[2], blk[3], blk[4], (const long *)blk[5], y);
    return 0;
}
