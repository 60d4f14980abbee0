/* The int8 GEMM's shared declarations (qgemm.c: the driver, packing, dispatch and epilogue; qgemm_x86.c and
 * qgemm_arm.c: the machine's micro-kernels; qconv.c: the convolutions built on it).
 *
 * C (m x n) = requantize(A (m x k) * B (k x n)): A rows of uint8 or int8 activations with one zero point, B int8
 * weights (a uint8 weight is made int8 when it is packed: w - 128, its zero point too), exact int32 sums.
 * B is packed once per plan in strips of QSTRIP columns: strip s holds, for each group of 4 consecutive k, the
 * 4 bytes of each of its 16 columns ([kp / 4][16][4], kp = k rounded up to 4, zero-padded), the layout of
 * x86's vpdpbusd and ARM's sdot with one activation group broadcast; the AVX2 and plain NEON kernels widen the
 * same bytes to 16-bit pairs.  Each micro-kernel has a native activation type (x86: uint8 for vpdpbusd; ARM:
 * int8 for sdot): activations of the other type are flipped (x ^ 0x80, the zero point moved by 128) as A is
 * packed, which changes no product of zero-point-centred values. */
#ifndef RPCSRV_QGEMM_H
#define RPCSRV_QGEMM_H
#include <stdint.h>

#define QSTRIP 16   /* columns per packed strip */
#define QMR_MAX 6   /* the most rows a micro-kernel computes at once */
#define QACC 64     /* the accumulator tile's row pitch: up to 4 strips */

/* acc[r * QACC + j] = sum over kp of a[r][k] * B[k][strip j / 16] for r < mr, j < 16 * nv; a[r]: kp bytes each
 * (rows past the real ones point at a real row: computed, not stored) */
typedef void (*qtile_fn)(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc);

/* the store of one chunk of up to QACC columns: y = int32 sum + corr[j] - bzp[j] * rowsum[r], then as ``out`` says:
 * int32; float32 times mult[j] plus fbias[j]; or uint8/int8 saturate(round(sum * mult[j]) + yzp) with the sum's
 * product clamped to [flo, fhi] first (the output range less the zero point: a fused Relu/Clip's) */
typedef struct {
    int32_t corr[QACC];
    float mult[QACC];     /* the multipliers times the activation scale */
    const int32_t *bzp;   /* per column, or NULL (all 0) */
    const int32_t *rowsum;  /* per row of the block (when bzp) */
    const float *fbias;   /* per column, or NULL */
    long out, cols;
    int32_t yzp;
    float flo, fhi;
    long sat;  /* the clamp is the output type's range and |sum * mult| < 2^30: a saturating narrowing does it; with
                * a float32 output: a fused Relu (max(0, y) after the bias) */
} qepi;

/* rows [0, m) of A (row pointers) times a chunk of nv strips, stored through e into y (row pitch ldy) */
typedef void (*qpanel_fn)(const uint8_t *const *rows, long m, const int8_t *b, long kp, long nv, const qepi *e,
                          char *y, long ldy);

typedef struct {
    const char *name;   /* the instruction set, for reports */
    long mr;            /* rows per tile */
    long nvmax;         /* strips per tile at most */
    int asigned;        /* native activation type: 0 uint8, 1 int8 */
    qtile_fn tile;
    int (*supported)(void);  /* whether this CPU has its instructions */
    qpanel_fn panel;    /* the tiles of a whole block with the store in registers, or NULL: tile + qgemm.c's store */
    /* the same, each row's depth read as taps of c bytes from a pointer per (row, tap); NULL: patches gathered */
    void (*ipanel)(const uint8_t *const *ptrs, long m, long taps, long c, const int8_t *b, long kp, long nv,
                   const qepi *e, char *y, long ldy);
} qkernel;

/* the block a plan prepares (a long array; pointers as longs), read by rpcsrv_qgemm* */
enum {
    QG_N, QG_K, QG_KP, QG_B, QG_BIAS, QG_COLSUM, QG_BZP, QG_MULT, QG_FBIAS, QG_OUT, QG_YZP, QG_LO, QG_HI,
    QG_SAT, QG_SIZE
};
enum { QOUT_U8, QOUT_S8, QOUT_I32, QOUT_F32 };

/* qconv.c's geometry block: input N H W C, kernel KH KW, strides, dilations, pads top/left, output OH OW, the
 * input's type (0 uint8, 1 int8) and zero point, and whether it is channels-first (then it is transposed first) */
enum { CG_N, CG_H, CG_W, CG_C, CG_KH, CG_KW, CG_SH, CG_SW, CG_DH, CG_DW, CG_PT, CG_PL, CG_OH, CG_OW, CG_SIGNED,
       CG_ZA, CG_NCHW, CG_SIZE };

/* the depthwise plan's block: weights (KH * KW, C) int32 with their zero points taken away, int32 bias (C),
 * float multipliers (C), output type, zero point and clamp; then the AVX-512 kernel's own: int16 pairs of taps,
 * bias and multipliers over CP channels (C padded to 32) in its register order (qpack.PackedDepthwise) */
enum { DG_W, DG_BIAS, DG_MULT, DG_OUT, DG_YZP, DG_LO, DG_HI, DG_W16, DG_BIAS16, DG_MULT16, DG_CP, DG_SIZE };

/* the micro-kernels this build has, best first (qgemm_x86.c / qgemm_arm.c); NULL-terminated */
extern const qkernel *const rpcsrv_qkernels_machine[];
/* the kernel in use: the best whose instructions this CPU has (or the one rpcsrv_qgemm_select chose) */
const qkernel *rpcsrv_qkernel(void);

/* one block of A rows (already packed or read in place) times every column of B, requantized into y */
void rpcsrv_qgemm_rows(const long *g, const uint8_t *const *rows, long m, const int32_t *rowsum, long za_native,
                       float ascale, void *y, long ldy);
/* rows [0, m) given as m x taps pointers of c bytes each (qkernel.ipanel); the zero point of the activations */
void rpcsrv_qgemm_taps(const long *g, const uint8_t *const *ptrs, long m, long taps, long c, long zan, void *y,
                       long ldy);
/* the flip of activations of type ``asigned`` to the kernel's native type (0 or 0x80), and the zero point's move */
int rpcsrv_qflip(int asigned);
#endif
