/* Included before any function by every kernel source with float vectors (through vec.h; sigmoid.c,
 * which has vectors of its own, itself). */
#ifndef RPCSRV_ARMFLOAT_H
#define RPCSRV_ARMFLOAT_H
/* 32-bit ARM: GCC lowers float vectors to NEON only under -funsafe-math-optimizations (NEON flushes
 * denormals to zero, which IEEE arithmetic does not); without it every vector of these kernels became scalar
 * VFP code, on the board's own -mcpu=native build too.  So the kernels ask for it here, per function, and
 * take back all it would also allow but that flush: reassociation, reciprocals, unsigned zeros.  Not a
 * command-line flag: linked with one, a shared library sets the flush mode of the whole process at load
 * (crtfastmath.o), numpy's arithmetic included.  aarch64's NEON is IEEE: nothing to ask there. */
#if defined(__arm__) && defined(__ARM_NEON) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("unsafe-math-optimizations", "no-associative-math", "no-reciprocal-math", "signed-zeros")
#endif
#endif
