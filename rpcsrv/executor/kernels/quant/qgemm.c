/* The int8 GEMM (qgemm.h): weights packed once per plan, activations packed (or read in place) per block of
 * rows, the machine's micro-kernel chosen once per process by what the CPU has (cpuid / AT_HWCAP, so that a
 * library built for the generic target still runs vpdpbusd or sdot where they exist), and the requantization
 * fused into the store of each tile: int32 sum + the zero points' corrections + bias, times the float32
 * multiplier, clamped to the output range (a fused Relu/Clip's), rounded half to even, plus the output zero
 * point, as onnxruntime computes it.  Exact integer sums: every kernel accumulates in int32 (the AVX2 and plain
 * NEON kernels through 16-bit products that cannot saturate), so the result does not depend on the kernel. */
#include <stdlib.h>
#include <string.h>

#include "qgemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
/* the epilogue in generic C, vectorised for each x86 level and picked at load (ifunc) */
#define QCLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QCLONES
#endif

/* -- the plain C micro-kernel: every machine has it ------------------------------------------------------- */
static void tile_generic(const uint8_t *const *a, const int8_t *b, long kp, long nv, int32_t *acc)
{
    for (long r = 0; r < 4; r++)
        for (long s = 0; s < nv; s++) {
            const int8_t *bs = b + s * kp * QSTRIP;
            int32_t c[QSTRIP] = {0};
            for (long k = 0; k < kp; k += 4)
                for (long j = 0; j < QSTRIP; j++)
                    for (long t = 0; t < 4; t++)
                        c[j] += (int32_t)a[r][k + t] * bs[k * QSTRIP + j * 4 + t];
            memcpy(acc + r * QACC + s * QSTRIP, c, sizeof c);
        }
}

static int always(void) { return 1; }

static const qkernel generic = {"generic C", 4, 4, 0, tile_generic, always, NULL, NULL};

#if defined(__x86_64__)
extern const qkernel rpcsrv_qk_vnni512, rpcsrv_qk_avxvnni, rpcsrv_qk_vnni256, rpcsrv_qk_avx2;
#endif
#if defined(__aarch64__)
extern const qkernel rpcsrv_qk_dotprod;
#endif
#if defined(__aarch64__) || (defined(__arm__) && defined(__ARM_NEON))
extern const qkernel rpcsrv_qk_neon;
#endif

const qkernel *const rpcsrv_qkernels_machine[] = {
#if defined(__x86_64__)
    &rpcsrv_qk_vnni512, &rpcsrv_qk_avxvnni, &rpcsrv_qk_vnni256, &rpcsrv_qk_avx2,
#endif
#if defined(__aarch64__)
    &rpcsrv_qk_dotprod,
#endif
#if defined(__aarch64__) || (defined(__arm__) && defined(__ARM_NEON))
    &rpcsrv_qk_neon,
#endif
    &generic, NULL};

static const qkernel *chosen;

const qkernel *rpcsrv_qkernel(void)
{
    const qkernel *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (k)
        return k;
    for (long i = 0; rpcsrv_qkernels_machine[i]; i++)
        if (rpcsrv_qkernels_machine[i]->supported()) {
            k = rpcsrv_qkernels_machine[i];
            break;
        }
    __atomic_store_n(&chosen, k, __ATOMIC_RELEASE);
    return k;
}

/* the name of the i-th kernel of this build (NULL past the last) and whether this CPU runs it */
const char *rpcsrv_qgemm_kernel_name(long i, long *supported)
{
    long n = 0;
    while (rpcsrv_qkernels_machine[n])
        n++;
    if (i < 0 || i >= n)
        return NULL;
    if (supported)
        *supported = rpcsrv_qkernels_machine[i]->supported();
    return rpcsrv_qkernels_machine[i]->name;
}

/* use the i-th kernel from now on (tests run each one the CPU has); -1 when it cannot run here */
long rpcsrv_qgemm_select(long i)
{
    const char *name = rpcsrv_qgemm_kernel_name(i, NULL);
    if (!name || !rpcsrv_qkernels_machine[i]->supported())
        return -1;
    __atomic_store_n(&chosen, rpcsrv_qkernels_machine[i], __ATOMIC_RELEASE);
    return 0;
}

const char *rpcsrv_qgemm_isa(void) { return rpcsrv_qkernel()->name; }

int rpcsrv_qflip(int asigned) { return asigned != rpcsrv_qkernel()->asigned ? 0x80 : 0; }

/* the zero point of flipped activations: x ^ 0x80 is x - 128 read as int8, or x + 128 read as uint8 */
static long native_zero_point(long za, int asigned, int flip) { return flip ? (asigned ? za + 128 : za - 128) : za; }

long rpcsrv_qgemm_packed_size(long k, long n) { return ((k + 3) / 4 * 4) * ((n + QSTRIP - 1) / QSTRIP * QSTRIP); }

/* B (k x n), element (kk, j) at w[kk * sk + j * sn], into strips (qgemm.h); flip 0x80 makes uint8 weights int8 */
void rpcsrv_qgemm_pack(const int8_t *w, long k, long n, long sk, long sn, long flip, int8_t *out)
{
    long kp = (k + 3) / 4 * 4, strips = (n + QSTRIP - 1) / QSTRIP;
    memset(out, 0, (size_t)(kp * strips * QSTRIP));
    for (long s = 0; s < strips; s++)
        for (long j = 0; j < QSTRIP && s * QSTRIP + j < n; j++)
            for (long kk = 0; kk < k; kk++)
                out[s * kp * QSTRIP + (kk / 4) * QSTRIP * 4 + j * 4 + kk % 4] =
                    (int8_t)(w[kk * sk + (s * QSTRIP + j) * sn] ^ (int8_t)flip);
}

QCLONES
static void epilogue(const int32_t *acc, long rows, const qepi *e, char *y, long ldy)
{
    const long cols = e->cols;
    const float magic = 12582912.0f;
    for (long r = 0; r < rows; r++) {
        const int32_t *ar = acc + r * QACC;
        int32_t t[QACC];
        for (long j = 0; j < cols; j++)
            t[j] = ar[j] + e->corr[j] - (e->bzp ? e->bzp[j] * e->rowsum[r] : 0);
        if (e->out == QOUT_I32) {
            memcpy(y + r * ldy * 4, t, (size_t)cols * 4);
        } else if (e->out == QOUT_F32) {
            float *yr = (float *)(y + r * ldy * 4);
            for (long j = 0; j < cols; j++)
                yr[j] = (float)t[j] * e->mult[j] + (e->fbias ? e->fbias[j] : 0.0f);
            if (e->sat)  /* a fused Relu (a NaN stays one) */
                for (long j = 0; j < cols; j++)
                    yr[j] = yr[j] < 0.0f ? 0.0f : yr[j];
        } else {
            /* clamped first (exact: the bounds are integers), so |f| < 2^22 and adding and taking away 1.5 * 2^23
             * rounds it to the nearest integer, ties to even, in the default rounding mode (cvtps2dq's, lrintf's) */
            uint8_t *yr = (uint8_t *)(y + r * ldy);
            for (long j = 0; j < cols; j++) {
                float f = (float)t[j] * e->mult[j];
                f = f < e->flo ? e->flo : f > e->fhi ? e->fhi : f;
                yr[j] = (uint8_t)((int32_t)((f + magic) - magic) + e->yzp);
            }
        }
    }
}

/* the store's parameters for the columns [n0, n0 + cols) (the activation zero point's terms and the bias in corr) */
static void chunk(const long *g, long n0, long cols, long zan, float ascale, qepi *e)
{
    const int32_t *bias = (const int32_t *)g[QG_BIAS], *colsum = (const int32_t *)g[QG_COLSUM];
    const int32_t *bzp = (const int32_t *)g[QG_BZP];
    const float *mult = (const float *)g[QG_MULT], *fbias = (const float *)g[QG_FBIAS];
    for (long j = 0; j < cols; j++) {
        e->corr[j] = (bias ? bias[n0 + j] : 0) - (int32_t)zan * colsum[n0 + j] +
                     (bzp ? (int32_t)(g[QG_K] * zan) * bzp[n0 + j] : 0);
        e->mult[j] = ascale * mult[n0 + j];
    }
    e->cols = cols, e->bzp = bzp ? bzp + n0 : NULL, e->fbias = fbias ? fbias + n0 : NULL;
    e->out = g[QG_OUT], e->yzp = (int32_t)g[QG_YZP];
    e->flo = (float)(g[QG_LO] - g[QG_YZP]), e->fhi = (float)(g[QG_HI] - g[QG_YZP]), e->sat = g[QG_SAT];
}

void rpcsrv_qgemm_rows(const long *g, const uint8_t *const *rows, long m, const int32_t *rowsum, long zan,
                       float ascale, void *y, long ldy)
{
    const qkernel *kn = rpcsrv_qkernel();
    const long n = g[QG_N], kp = g[QG_KP], mr = kn->mr, esize = g[QG_OUT] >= QOUT_I32 ? 4 : 1;
    const int8_t *b = (const int8_t *)g[QG_B];
    int32_t acc[QMR_MAX * QACC] __attribute__((aligned(64)));
    qepi e;
    for (long n0 = 0; n0 < n; n0 += QSTRIP * kn->nvmax) {
        const long cols = n - n0 < QSTRIP * kn->nvmax ? n - n0 : QSTRIP * kn->nvmax, nv = (cols + QSTRIP - 1) / QSTRIP;
        chunk(g, n0, cols, zan, ascale, &e);
        const int8_t *bchunk = b + (n0 / QSTRIP) * kp * QSTRIP;
        char *ychunk = (char *)y + n0 * esize;
        if (kn->panel) {
            e.rowsum = rowsum;
            kn->panel(rows, m, bchunk, kp, nv, &e, ychunk, ldy);
            continue;
        }
        for (long r0 = 0; r0 < m; r0 += mr) {
            const uint8_t *ptrs[QMR_MAX];
            long nrows = m - r0 < mr ? m - r0 : mr;
            for (long r = 0; r < mr; r++)
                ptrs[r] = rows[r0 + (r < nrows ? r : nrows - 1)];
            kn->tile(ptrs, bchunk, kp, nv, acc);
            e.rowsum = rowsum ? rowsum + r0 : NULL;
            epilogue(acc, nrows, &e, ychunk + r0 * ldy * esize, ldy);
        }
    }
}

void rpcsrv_qgemm_taps(const long *g, const uint8_t *const *ptrs, long m, long taps, long c, long zan, void *y,
                       long ldy)
{
    const qkernel *kn = rpcsrv_qkernel();
    const long n = g[QG_N], kp = g[QG_KP], esize = g[QG_OUT] >= QOUT_I32 ? 4 : 1;
    qepi e;
    e.rowsum = NULL;
    for (long n0 = 0; n0 < n; n0 += QSTRIP * kn->nvmax) {
        const long cols = n - n0 < QSTRIP * kn->nvmax ? n - n0 : QSTRIP * kn->nvmax, nv = (cols + QSTRIP - 1) / QSTRIP;
        chunk(g, n0, cols, zan, 1.0f, &e);
        kn->ipanel(ptrs, m, taps, c, (const int8_t *)g[QG_B] + (n0 / QSTRIP) * kp * QSTRIP, kp, nv, &e,
                   (char *)y + n0 * esize, ldy);
    }
}

/* the rows per block of packed activations: about 128 KB of them (they are read once per strip of columns) */
static long block_rows(long kp, long mr) { long r = (131072 / kp) / mr * mr; return r < mr ? mr : r; }

/* A (m x k, row r at a + r * lda) of type asigned with zero point za, times the plan's B, into y (row pitch ldy
 * elements); ascale multiplies the plan's multipliers (a dynamic activation scale; 1 otherwise).  0, or -1 when
 * the scratch cannot be allocated. */
int rpcsrv_qgemm(const long *g, const uint8_t *a, long m, long lda, long asigned, long za, float ascale, void *y,
                 long ldy)
{
    const qkernel *kn = rpcsrv_qkernel();
    const long k = g[QG_K], kp = g[QG_KP], esize = g[QG_OUT] >= QOUT_I32 ? 4 : 1;
    const int flip = rpcsrv_qflip((int)asigned), direct = !flip && kp == k, sums = g[QG_BZP] != 0;
    const long zan = native_zero_point(za, (int)asigned, flip), mb = block_rows(kp, kn->mr);
    const uint8_t **rows = malloc(sizeof *rows * (size_t)mb);
    int32_t *rowsum = sums ? malloc(sizeof *rowsum * (size_t)mb) : NULL;
    uint8_t *pack = direct ? NULL : malloc((size_t)(mb * kp));
    if (!rows || (sums && !rowsum) || (!direct && !pack)) {
        free(rows), free(rowsum), free(pack);
        return -1;
    }
    const int native_signed = kn->asigned;
    for (long r0 = 0; r0 < m; r0 += mb) {
        long nrows = m - r0 < mb ? m - r0 : mb;
        for (long r = 0; r < nrows; r++) {
            const uint8_t *src = a + (r0 + r) * lda;
            if (direct) {
                rows[r] = src;
            } else {
                uint8_t *dst = pack + r * kp;
                for (long kk = 0; kk < k; kk++)
                    dst[kk] = src[kk] ^ (uint8_t)flip;
                memset(dst + k, 0, (size_t)(kp - k));
                rows[r] = dst;
            }
            if (sums) {
                int32_t s = 0;
                for (long kk = 0; kk < k; kk++)
                    s += native_signed ? (int32_t)(int8_t)rows[r][kk] : (int32_t)rows[r][kk];
                rowsum[r] = s;
            }
        }
        rpcsrv_qgemm_rows(g, rows, nrows, rowsum, zan, ascale, (char *)y + r0 * ldy * esize, ldy);
    }
    free(rows), free(rowsum), free(pack);
    return 0;
}
