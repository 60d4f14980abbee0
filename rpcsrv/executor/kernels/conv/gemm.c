/* A float32 GEMM for 1x1 convolutions with the epilogue fused: y[m, q] = act(w[m, k] @ s*x[k, q] + r[m, q] +
 * bias[m]), x, r and y row-major (NCHW: rows of q = H*W values), s an optional per-k scale (a
 * squeeze-and-excitation gate folded into the conv), r an optional residual.  numpy's matmul (OpenBLAS)
 * then the separate epilogue pass (epilogue.c) stream every output through memory twice, and the outputs
 * of MobileNetV2's expand 1x1s (up to 4.8 MB) no longer fit in cache.  Here the bias, residual and
 * activation are applied to each register tile as it is stored (swish: over a band of rows while in cache).
 *
 * The usual blocking (Goto/BLIS): w packed once at plan time into panels of MR rows interleaved along k
 * (rpcsrv_gemm_pack_w); per call, a block of KC rows x NC columns of x (XBLOCK bytes) is packed (and
 * scaled) into strips of NR columns that stay in L2 while every w panel passes over them; the micro-kernel
 * keeps an MR x NR tile of y in MR * NR / VW vector accumulators, one broadcast of w and NR / VW loads of
 * x per k step.  MR and NR come from the vector width and the register count of the target (no spills on
 * AVX2, AVX-512, NEON).  Built with the other kernels by kernels/clib/compiled.py; kernels/conv/gemm.py calls it.
 * The im2col convs (kernels/conv/plans_conv.py's im2col_plan) run here too: rpcsrv_gemm_band from a band of the
 * column matrix into a band of y (gemm_ld: x's and y's rows at their own pitches), rpcsrv_gemm_conv with
 * the x blocks packed straight from the input (pack_conv: no column matrix written). */

#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && !defined(VW)
#define VW 16 /* (Zen 4 splits them in two halves: the same FLOP rate, half the instructions) */
#endif
#include "vec.h"

#if defined(__AVX512F__) || defined(__aarch64__)
#define MR 8 /* 32 vector registers: 8 x 3 accumulators, 3 of x, 1 broadcast (a 7x7 map is one 48-wide tile */
#define NV 3 /* and a column; 8 x 2: 3-16% slower on the 7x7 layers, the same elsewhere) */
#else
#define MR 6 /* 16 registers (AVX2, SSE, armv7 NEON): 6 x 2 accumulators, 2 of x, 1 broadcast */
#define NV 2
#endif
#define NR (NV * VW)
#ifndef KC
#define KC 384 /* a w panel (MR x KC) and an x strip (KC x NR) together in L1 */
#endif
#ifndef XBLOCK /* bytes of the packed x block (kc x nc), to stay in L2: 1 MB measured best here (x86_64, 1 MB
                 * of L2 per core: 16 -> 96 at 112x112 then the next layer, 3% faster than 256 KB); ARM boards'
                 * L2 is often 256-512 KB per core (unmeasured) */
#if defined(__x86_64__)
#define XBLOCK (1024 * 1024)
#else
#define XBLOCK (256 * 1024)
#endif
#endif

long rpcsrv_gemm_mr(void) { return MR; }

/* w (m x k, row-major) into panels of MR rows, k-major within a panel (the last panel zero-padded):
 * wp must hold ceil(m / MR) * MR * k + 8 floats (the last 8 read, not used, by columns()) */
void rpcsrv_gemm_pack_w(const float *w, float *wp, long m, long k) {
    for (long i0 = 0; i0 < m; i0 += MR)
        for (long p = 0; p < k; p++)
            for (long i = 0; i < MR; i++) *wp++ = i0 + i < m ? w[(i0 + i) * k + p] : 0.f;
    for (int i = 0; i < 8; i++) *wp++ = 0.f;
}

/* x[p0 .. p0+kc, j0 .. j0+nc] (rows q apart (x's pitch), times s[p] when s) into strips of NR columns, kc x NR each,
 * the last zero-padded */
static void pack_x(const float *x, const float *s, float *xp, long q, long p0, long kc, long j0, long nc) {
    for (long j = 0; j < nc; j += NR, xp += kc * NR) {
        const long cols = nc - j < NR ? nc - j : NR;
        for (long p = 0; p < kc; p++) {
            const float *src = x + (p0 + p) * q + j0 + j;
            float *dst = xp + p * NR;
            if (cols == NR) {
                if (s) {
                    const vf g = splat(s[p0 + p]);
                    for (int v = 0; v < NV; v++) storev(dst + v * VW, loadv(src + v * VW) * g);
                } else {
                    for (int v = 0; v < NV; v++) storev(dst + v * VW, loadv(src + v * VW));
                }
            } else {
                const float g = s ? s[p0 + p] : 1.f;
                long c = 0;
                for (; c < cols; c++) dst[c] = s ? src[c] * g : src[c];
                for (; c < NR; c++) dst[c] = 0.f;
            }
        }
    }
}

void rpcsrv_im2col_row(const float *x, const long *p, long tap, long q0, long n, float *dst); /* im2col.c */

/* the same block of a conv's column matrix, straight from the input x (geometry g: im2col.c's), each of its
 * kc rows gathered into tmp (nc values, in L1) then dealt into the strips: the column matrix never written
 * out (rpcsrv_gemm_conv) */
static void pack_conv(const float *x, const long *g, float *xp, float *tmp, long p0, long kc, long j0, long nc) {
    for (long p = 0; p < kc; p++) {
        rpcsrv_im2col_row(x, g, p0 + p, j0, nc, tmp);
        for (long j = 0; j < nc; j += NR) {
            float *dst = xp + j * kc + p * NR;
            if (nc - j >= NR) {
                for (int v = 0; v < NV; v++) storev(dst + v * VW, loadv(tmp + j + v * VW));
            } else {
                long c = 0;
                for (; c < nc - j; c++) dst[c] = tmp[j + c];
                for (; c < NR; c++) dst[c] = 0.f;
            }
        }
    }
}

/* the tile's epilogue: v + r + bias through the activation (swish: the caller's pass after) */
struct epi { const float *bias, *r; long ldr; int act; float lo, hi; const float *cbias; };
/* (cbias: per column, the MatMul's bias: y = x @ w + cbias, below) */

/* c (rows <= MR rows of NR, ldc apart) = (first ? 0 : c) + a (kc x MR) @ b (kc x NR), then the epilogue when
 * e (a panel's last rows past m: computed on the zero padding, not stored) */
static inline void micro(long kc, const float *restrict a, const float *restrict b, float *restrict c, long ldc,
                         int first, const struct epi *e, long i0, long j0, long rows) {
    vf acc[MR][NV];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV; v++) acc[i][v] = first || i >= rows ? (vf){0} : loadv(c + i * ldc + v * VW);
    for (long p = 0; p < kc; p++, a += MR, b += NR) {
        vf bv[NV];
        for (int v = 0; v < NV; v++) bv[v] = loadv(b + v * VW);
        for (int i = 0; i < MR; i++) {
            const vf ai = splat(a[i]);
            for (int v = 0; v < NV; v++) acc[i][v] += ai * bv[v];
        }
    }
    for (int i = 0; i < MR && i < rows; i++) {
        for (int v = 0; v < NV; v++) {
            vf t = acc[i][v];
            if (e) {
                if (e->r) t += loadv(e->r + (i0 + i) * e->ldr + j0 + v * VW);
                if (e->bias) t += splat(e->bias[i0 + i]);
                if (e->cbias) t += loadv(e->cbias + j0 + v * VW);
                t = actv(t, e->act, e->lo, e->hi);
            }
            storev(c + i * ldc + v * VW, t);
        }
    }
}

/* a corner tile (rows < MR and cols < NR): through a full tile in a local buffer, the epilogue in scalars */
static void edge(long kc, const float *a, const float *b, float *y, long q /* y's pitch */, long i0, long j0, long rows,
                 long cols, int first, const struct epi *e) {
    float t[MR * NR];
    for (long i = 0; i < rows; i++)
        if (!first) memcpy(t + i * NR, y + (i0 + i) * q + j0, (size_t)cols * sizeof(float));
    micro(kc, a, b, t, NR, first, 0, 0, 0, MR);
    for (long i = 0; i < rows; i++)
        for (long j = 0; j < cols; j++) {
            float v = t[i * NR + j];
            if (e) {
                if (e->r) v += e->r[(i0 + i) * e->ldr + j0 + j];
                if (e->bias) v += e->bias[i0 + i];
                if (e->cbias) v += e->cbias[j0 + j];
                v = act1(v, e->act, e->lo, e->hi);
            }
            y[(i0 + i) * q + j0 + j] = v;
        }
}

/* the last columns of a row panel (cols < NR, rows == MR): one column at a time, its MR rows side by side in
 * one vector of 8 (a w panel's k step is MR contiguous values; lanes past MR are ignored, rpcsrv_gemm_pack_w
 * pads the panels by 8 values for them), where a full tile would compute NR columns: q = 49 (7x7) is
 * 32 + 17, q = 196 is 6 x 32 + 4 */
typedef float vr __attribute__((vector_size(32)));
typedef float vru __attribute__((vector_size(32), aligned(4), may_alias));

/* the fused activation on a column's vector, in place (actv's selects in vr; vectors by address and
 * macros: a 32-byte vector argument's ABI differs without AVX) */
typedef int vri __attribute__((vector_size(32)));
#define SELR(m, u, v) ((vr)(((vri)(u) & (m)) | ((vri)(v) & ~(m))))

static inline void actr(vr *a, int act, float lo, float hi) {
    const vr zero = {0}, one = -(vr){0} + 1.f;
    if (act == ACT_RELU) {
        *a = SELR(*a < zero, zero, *a);
    } else if (act == ACT_CLIP) {
        const vr l = -(vr){0} + lo, h = -(vr){0} + hi;
        *a = SELR(*a < l, l, *a);
        *a = SELR(*a > h, h, *a);
    } else if (act == ACT_HARDSWISH) {
        vr g = *a * (-(vr){0} + 1.f / 6.f) + (-(vr){0} + 0.5f);
        g = SELR(g < zero, zero, g);
        g = SELR(g > one, one, g);
        *a *= g;
    }
}

/* the finished column j's MR values, *acc, through the epilogue into y (the residual and y gathered, the
 * activation on the vector: a scalar activation per value had cost as much as the column's products) */
static inline void put_column(const vr *acc, float *y, long q, long i0, long j, int first, const struct epi *e) {
    vr v = *acc, t = {0};
    if (!first) {
        for (int i = 0; i < MR; i++) t[i] = y[(i0 + i) * q + j];
        v += t;
    }
    if (e) {
        if (e->r) {
            for (int i = 0; i < MR; i++) t[i] = e->r[(i0 + i) * e->ldr + j];
            v += t;
        }
        if (e->bias) {
            for (int i = 0; i < MR; i++) t[i] = e->bias[i0 + i];
            v += t;
        }
        if (e->cbias) v += -(vr){0} + e->cbias[j];
        actr(&v, e->act, e->lo, e->hi);
    }
    for (int i = 0; i < MR; i++) y[(i0 + i) * q + j] = v[i];
}

/* 8 columns at a time (8 independent multiply-add chains), then one at a time with k split in 4 */
static void columns(long kc, const float *restrict a, const float *restrict b, float *y, long q, long i0, long j0,
                    long cols, int first, const struct epi *e) {
    long j = 0;
    for (; j + 8 <= cols; j += 8) {
        vr acc[8] = {{0}};
        for (long p = 0; p < kc; p++) {
            const vr av = *(const vru *)(a + p * MR);
            for (int c = 0; c < 8; c++) acc[c] += av * (-(vr){0} + b[p * NR + j + c]);
        }
        for (int c = 0; c < 8; c++) put_column(&acc[c], y, q, i0, j0 + j + c, first, e);
    }
    for (; j < cols; j++) {
        vr acc[4] = {{0}};
        long p = 0;
        for (; p + 4 <= kc; p += 4)
            for (int u = 0; u < 4; u++) acc[u] += *(const vru *)(a + (p + u) * MR) * (-(vr){0} + b[(p + u) * NR + j]);
        for (; p < kc; p++) acc[0] += *(const vru *)(a + p * MR) * (-(vr){0} + b[p * NR + j]);
        acc[0] += acc[1] + (acc[2] + acc[3]);
        put_column(&acc[0], y, q, i0, j0 + j, first, e);
    }
}

/* the column block j0 .. j0+nc, k block p0 .. p0+kc of y (m rows, ldy apart) += a @ b: a packed by
 * rpcsrv_gemm_pack_w (all of its k), b the block's strips (kc x NR each, kc * NR apart); the epilogue with the
 * last k block */
static void block(const float *ap, const float *b, float *y, long m, long k, long ldy, long p0, long kc, long j0,
                  long nc, const struct epi *full, int swish) {
    const int first = p0 == 0, last = p0 + kc >= k;
    const struct epi *e = last ? full : 0;
    for (long i0 = 0; i0 < m; i0 += MR) {
        const float *a = ap + i0 * k + p0 * MR;
        const long rows = m - i0 < MR ? m - i0 : MR;
        for (long j = 0; j < nc; j += NR) {
            const float *bj = b + j * kc;
            if (nc - j >= NR)
                micro(kc, a, bj, y + i0 * ldy + j0 + j, ldy, first, e, i0, j0 + j, rows);
            else if (rows == MR)
                columns(kc, a, bj, y, ldy, i0, j0 + j, nc - j, first, e);
            else
                edge(kc, a, bj, y, ldy, i0, j0 + j, rows, nc - j < NR ? nc - j : NR, first, e);
        }
        if (last && swish) /* SiLU over the band's rows while they are in cache */
            for (float *row = y + i0 * ldy + j0; row < y + (i0 + rows) * ldy; row += ldy)
                rpcsrv_sigmoid_f32(row, row, nc, 1);
    }
}

/* the columns of a block, as wide as the L2 budget allows: y is written in long row runs (narrow blocks, all
 * rows of one then all rows of the next, left it in an order the next layer read 7% slower) */
static long block_columns(long k) {
    const long kcap = k < KC ? k : KC, nb = XBLOCK / (long)sizeof(float) / kcap / NR * NR;
    return nb > NR ? nb : NR;
}

/* y = act(wp @ (s * x) + r + bias) for q columns, wp packed by rpcsrv_gemm_pack_w; s, r, bias optional (0); x's
 * rows ldx apart, y's and r's ldy apart (a band of a wider output: the im2col plan); conv (im2col.c's geometry,
 * or 0): x is a conv's input, its column matrix packed from it; y may not alias x or r.  0, or -1 when the
 * packing buffer could not be allocated. */
static int gemm_ld(const float *wp, const float *x, long ldx, const float *s, const float *r, const float *bias,
                   float *y, long ldy, long m, long k, long q, int act, float lo, float hi, const long *conv) {
    const long kcap = k < KC ? k : KC, NC = block_columns(k), ncap = q < NC ? (q + NR - 1) / NR * NR : NC;
    float *xp = 0; /* on a cache line: its vector loads never straddle two */
    if (posix_memalign((void **)&xp, 64, (size_t)((kcap + 1) * ncap) * sizeof(float))) return -1; /* +1: tmp */
    const struct epi full = {bias, r, ldy, act == ACT_SWISH ? ACT_NONE : act, lo, hi, 0};
    for (long j0 = 0; j0 < q; j0 += NC) {
        const long nc = q - j0 < NC ? q - j0 : NC;
        for (long p0 = 0; p0 < k; p0 += KC) {
            const long kc = k - p0 < KC ? k - p0 : KC;
            if (conv)
                pack_conv(x, conv, xp, xp + kcap * ncap, p0, kc, j0, nc);
            else
                pack_x(x, s, xp, ldx, p0, kc, j0, nc);
            block(wp, xp, y, m, k, ldy, p0, kc, j0, nc, &full, act == ACT_SWISH);
        }
    }
    free(xp);
    return 0;
}

/* y = act(wp @ (s * x) + r + bias), x, r and y (m or k rows of q): see gemm_ld */
int rpcsrv_gemm_f32(const float *wp, const float *x, const float *s, const float *r, const float *bias, float *y,
                    long m, long k, long q, int act, float lo, float hi) {
    return gemm_ld(wp, x, q, s, r, bias, y, q, m, k, q, act, lo, hi, 0);
}

/* the above with its arguments in a block made once per plan (kernels/conv/plans_conv.py): p = wp, bias (0: none),
 * m, k, q, act; f = lo, hi; x, s (0: none), r (0: none) and y per call */
int rpcsrv_gemm_block(const float *x, const float *s, const float *r, float *y, const long *p, const float *f) {
    return rpcsrv_gemm_f32((const float *)p[0], x, s, r, (const float *)p[1], y, p[2], p[3], p[4], (int)p[5], f[0],
                           f[1]);
}

/* A MatMul by constant weights, y (rows x n) = act(x (rows x k) @ w (k x n) + bias[n]): the same blocks with
 * the roles swapped, the constant w as the strips (packed once, rpcsrv_gemm_pack_b) and x's rows as the
 * panels (packed per call, rpcsrv_gemm_pack_w), the bias per column; y row-major as numpy's.  (Computing
 * y^T = w^T @ x^T with w^T as the panels would need a transposing pack of x and a transposed store.) */
long rpcsrv_gemm_nr(void) { return NR; }

/* w (k x n) into bp: KC-row blocks of NR-column strips (kc x NR, the last zero-padded), block p0 at
 * p0 * ceil(n / NR) * NR, strip j at j * kc in it: bp holds ceil(n / NR) * NR * k floats */
void rpcsrv_gemm_pack_b(const float *w, float *bp, long k, long n) {
    const long np = (n + NR - 1) / NR * NR;
    for (long p0 = 0; p0 < k; p0 += KC) pack_x(w, 0, bp + p0 * np, n, p0, k - p0 < KC ? k - p0 : KC, 0, n);
}

/* y = act(x @ w + bias) with bp = rpcsrv_gemm_pack_b(w); bias optional (0).  0, or -1 when x's packed copy
 * could not be allocated. */
int rpcsrv_matmul_f32(const float *x, const float *bp, const float *bias, float *y, long rows, long k, long n,
                      int act, float lo, float hi) {
    const long NC = block_columns(k), np = (n + NR - 1) / NR * NR;
    float *xp = 0;
    if (posix_memalign((void **)&xp, 64, (size_t)((rows + MR - 1) / MR * MR * k + 8) * sizeof(float))) return -1;
    rpcsrv_gemm_pack_w(x, xp, rows, k);
    const struct epi full = {0, 0, 0, act == ACT_SWISH ? ACT_NONE : act, lo, hi, bias};
    for (long j0 = 0; j0 < n; j0 += NC)
        for (long p0 = 0; p0 < k; p0 += KC) {
            const long kc = k - p0 < KC ? k - p0 : KC;
            block(xp, bp + p0 * np + j0 * kc, y, rows, k, n, p0, kc, j0, n - j0 < NC ? n - j0 : NC, &full,
                  act == ACT_SWISH);
        }
    free(xp);
    return 0;
}

/* the above with a block made once per plan (kernels/conv/gemm.py): p = bp, bias (0: none), rows, k, n, act;
 * f = lo, hi */
int rpcsrv_matmul_block(const float *x, float *y, const long *p, const float *f) {
    return rpcsrv_matmul_f32(x, (const float *)p[0], (const float *)p[1], y, p[2], p[3], p[4], (int)p[5], f[0], f[1]);
}

/* a band of n columns of an im2col conv's output (kernels/conv/plans_conv.py's im2col_plan): y (the band's first
 * column, rows p[6] apart) = act(wp @ cols + bias), cols (k rows of n, contiguous); p = wp, bias (0: none),
 * m, k, (unused), act, the output's row pitch, per plan; f = lo, hi */
int rpcsrv_gemm_band(const float *cols, float *y, long n, const long *p, const float *f) {
    return gemm_ld((const float *)p[0], cols, n, 0, 0, (const float *)p[1], y, p[6], p[2], p[3], n, (int)p[5], f[0],
                   f[1], 0);
}

/* a whole conv of one image, its column matrix packed straight from x (pack_conv): y (m rows of q = p[6]) =
 * act(wp @ columns(x) + bias); p as rpcsrv_gemm_band's, g im2col.c's geometry; f = lo, hi */
int rpcsrv_gemm_conv(const float *x, float *y, const long *p, const long *g, const float *f) {
    return gemm_ld((const float *)p[0], x, 0, 0, 0, (const float *)p[1], y, p[6], p[2], p[3], p[6], (int)p[5], f[0],
                   f[1], g);
}
