/* Vectors, selects and fused activations shared by the compiled kernels (dwconv.c, dwchan.c, pools.c, winograd.c,
 * epilogue.c): GCC's and clang's generic vector extension, so one source builds for x86_64 (SSE/AVX), aarch64
 * and armv7 (NEON, or scalar code where there is no SIMD).  kernels/clib/compiled.py hashes this header with the
 * sources.  On x86 it includes immintrin.h (for max/min): it declares select() and the rest of stdlib.h. */
#ifndef RPCSRV_VEC_H
#define RPCSRV_VEC_H

#include "armfloat.h"

/* Vectors in GCC/clang's generic vector extension: 8 floats where the target has AVX, else 4 (SSE, NEON),
 * unless the source defines VW first (gemm.c: 16 with AVX-512; the shuffles below are for 8 and 4 only);
 * (Plain loops left this to the
 * auto-vectoriser, whose choices varied 3.6x with the flags.) */
#if !defined(VW) && defined(__AVX__)
#define VW 8
#elif !defined(VW)
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef int vmask __attribute__((vector_size(VW * 4)));

static inline vf loadv(const float *p) { return *(const vfu *)p; }
/* the even lanes of a then b (a stride-2 column phase): one shuffle, not VW scalar moves */
#if defined(__clang__)
#if VW == 8
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#else
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6)
#endif
#else
#if VW == 8
#define EVENS(a, b) __builtin_shuffle(a, b, (vmask){0, 2, 4, 6, 8, 10, 12, 14})
#else
#define EVENS(a, b) __builtin_shuffle(a, b, (vmask){0, 2, 4, 6})
#endif
#endif
static inline void storev(float *p, vf v) { *(vfu *)p = v; }

/* the odd lanes of a then b, and the lanes of a and b interleaved (low halves, high halves) */
#if defined(__clang__)
#if VW == 8
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
#define ZIPLO(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11)
#define ZIPHI(a, b) __builtin_shufflevector(a, b, 4, 12, 5, 13, 6, 14, 7, 15)
#else
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7)
#define ZIPLO(a, b) __builtin_shufflevector(a, b, 0, 4, 1, 5)
#define ZIPHI(a, b) __builtin_shufflevector(a, b, 2, 6, 3, 7)
#endif
#else
#if VW == 8
#define ODDS(a, b) __builtin_shuffle(a, b, (vmask){1, 3, 5, 7, 9, 11, 13, 15})
#define ZIPLO(a, b) __builtin_shuffle(a, b, (vmask){0, 8, 1, 9, 2, 10, 3, 11})
#define ZIPHI(a, b) __builtin_shuffle(a, b, (vmask){4, 12, 5, 13, 6, 14, 7, 15})
#else
#define ODDS(a, b) __builtin_shuffle(a, b, (vmask){1, 3, 5, 7})
#define ZIPLO(a, b) __builtin_shuffle(a, b, (vmask){0, 4, 1, 5})
#define ZIPHI(a, b) __builtin_shuffle(a, b, (vmask){2, 6, 3, 7})
#endif
#endif

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2, ACT_HARDSWISH = 3, ACT_SWISH = 4 };

/* sigmoid.c: y = x * sigmoid(x) (times_x 1), in place when y == x */
void rpcsrv_sigmoid_f32(const float *x, float *y, long count, int times_x);

static inline float act1(float v, int act, float lo, float hi) {
    if (act == ACT_RELU) return v < 0.f ? 0.f : v;
    if (act == ACT_CLIP) { v = v < lo ? lo : v; return v > hi ? hi : v; }
    if (act == ACT_HARDSWISH) {
        float g = v * (1.f / 6.f) + 0.5f;
        g = g < 0.f ? 0.f : g;
        return v * (g > 1.f ? 1.f : g);
    }
    return v;
}

/* s in every lane: -0 + s is s for every s (0 + s is not, for s = -0), so the compiler makes this one
 * broadcast, where (vf){0} + s costs a scalar add before it (in the multiply-add loops' every tap) */
static inline vf splat(float s) { return -(vf){0} + s; }

/* v where the mask is false, u where it is true (branch-free selects; NaN compares false, so stays) */
static inline vf vselect(vmask m, vf u, vf v) { return (vf)(((vmask)u & m) | ((vmask)v & ~m)); }

/* max(a, u), u where u is NaN (and a NaN in a stays: u > a is false): a max pool's, NaN wins as in numpy */
static inline vf vmaxnan(vf a, vf u) { return vselect((u > a) | (u != u), u, a); }

/* max(l, a) and min(h, a), a where a is NaN: one instruction where the target has one (the selects
 * below took 2-3 each, a fifth of the channels-side-by-side depthwise kernel's time), else the selects */
#if defined(__AVX__) || defined(__SSE__)
#include <immintrin.h>
#endif
static inline vf vmaxl(vf l, vf a) {
#if VW == 8 && defined(__AVX__)
    return (vf)_mm256_max_ps((__m256)l, (__m256)a);  /* a when either is NaN */
#elif VW == 4 && defined(__SSE__)
    return (vf)_mm_max_ps((__m128)l, (__m128)a);
#else
    return vselect(a < l, l, a);
#endif
}
static inline vf vminh(vf h, vf a) {
#if VW == 8 && defined(__AVX__)
    return (vf)_mm256_min_ps((__m256)h, (__m256)a);
#elif VW == 4 && defined(__SSE__)
    return (vf)_mm_min_ps((__m128)h, (__m128)a);
#else
    return vselect(a > h, h, a);
#endif
}

/* the fused activation on a vector of finished outputs (swish runs after, over the plane) */
static inline vf actv(vf a, int act, float lo, float hi) {
    const vf zero = {0}, one = splat(1.f);
    if (act == ACT_RELU) return vmaxl(zero, a);
    if (act == ACT_CLIP) return vminh(splat(hi), vmaxl(splat(lo), a));
    if (act == ACT_HARDSWISH) {
        vf g = a * splat(1.f / 6.f) + splat(0.5f);
        return a * vminh(one, vmaxl(zero, g));
    }
    return a;
}

#endif
