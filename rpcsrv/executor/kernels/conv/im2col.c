/* im2col of one float32 image for a band of output rows, in one pass, for rpcsrv's numpy executor (plans_conv.py's
 * im2col plan does the rest: the GEMM through numpy's BLAS, then the bias and activation in epilogue.c; or
 * gemm.c with them in its tiles, from these bands, or from rpcsrv_im2col_row's rows as it packs).
 *
 * numpy builds the column matrix as a copy of a 5-D strided window view of a padded copy of the input: two
 * passes, and one inner loop per output row (7-28 values for ResNet-50's and Inception's stride-2 and late
 * 3x3 convs), which measured 0.2-0.6 ms per layer against 2.3-3 ms of GEMM.  Here each column row (one
 * input channel and kernel tap) is written output row by output row straight from the input: the padding
 * as zeros at both ends of the row, the rest a contiguous copy (stride 1) or a strided gather (the
 * compiler vectorises the stride-2 loop).  Built with the other kernels by kernels/clib/compiled.py.
 */
#include <string.h>

/* p: c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ow, r0, r1.  cols (c * kh * kw, (r1 - r0) * ow): row
 * (ci * kh + i) * kw + j holds x[ci, r * sh + i * dh - pt, q * sw + j * dw - pl] for output rows r0 <= r < r1
 * and columns 0 <= q < ow, zero outside x (pads >= 0 or < 0 alike). */
void rpcsrv_im2col_f32(const float *x, float *cols, const long *p) {
    const long c = p[0], h = p[1], w = p[2], kh = p[3], kw = p[4], sh = p[5], sw = p[6], dh = p[7], dw = p[8];
    const long pt = p[9], pl = p[10], ow = p[11], r0 = p[12], r1 = p[13], q = (r1 - r0) * ow;
    float *dst = cols;
    for (long ci = 0; ci < c; ci++) {
        const float *plane = x + ci * h * w;
        for (long i = 0; i < kh; i++)
            for (long j = 0; j < kw; j++, dst += q) {
                const long x0 = j * dw - pl;  /* input column of output column 0 */
                /* output columns [lo, hi) read inside the row */
                long lo = x0 >= 0 ? 0 : (-x0 + sw - 1) / sw, hi = x0 > w - 1 ? 0 : (w - 1 - x0) / sw + 1;
                lo = lo < ow ? lo : ow;
                hi = hi < ow ? hi : ow;
                hi = hi > lo ? hi : lo;
                float *d = dst;
                for (long r = r0; r < r1; r++, d += ow) {
                    const long y = r * sh + i * dh - pt;
                    if (y < 0 || y >= h) {
                        memset(d, 0, sizeof(float) * (size_t)ow);
                        continue;
                    }
                    const float *row = plane + y * w + x0 + lo * sw;  /* output column lo's input */
                    float *dd = d + lo;
                    const long n = hi - lo;
                    for (long o = 0; o < lo; o++) d[o] = 0.f;
                    if (sw == 1) {
                        memcpy(dd, row, sizeof(float) * (size_t)n);
                    } else if (sw == 2) {
                        for (long o = 0; o < n; o++) dd[o] = row[2 * o];
                    } else {
                        for (long o = 0; o < n; o++) dd[o] = row[o * sw];
                    }
                    for (long o = hi; o < ow; o++) d[o] = 0.f;
                }
            }
    }
}

/* one column row, for gemm.c's packing straight from the input (rpcsrv_gemm_conv): dst[0 .. n) = the column
 * matrix's row tap (= (ci * kh + i) * kw + j) at output positions q0 .. q0 + n (q = r * ow + o), p as above
 * (r0, r1 unused): a band of one output row's values at a time, zeros outside x */
void rpcsrv_im2col_row(const float *x, const long *p, long tap, long q0, long n, float *dst) {
    const long h = p[1], w = p[2], kh = p[3], kw = p[4], sh = p[5], sw = p[6], dh = p[7], dw = p[8];
    const long pt = p[9], pl = p[10], ow = p[11];
    const long ci = tap / (kh * kw), i = tap / kw % kh, j = tap % kw, x0 = j * dw - pl;
    const float *plane = x + ci * h * w;
    long lo = x0 >= 0 ? 0 : (-x0 + sw - 1) / sw, hi = x0 > w - 1 ? 0 : (w - 1 - x0) / sw + 1;
    for (long done = 0, r = q0 / ow, o0 = q0 % ow; done < n; done += ow - o0, r++, o0 = 0) {
        const long o1 = ow - o0 < n - done ? ow : o0 + n - done, y = r * sh + i * dh - pt; /* [o0, o1) */
        float *d = dst + done - o0; /* d[o]: output column o of row r */
        long a = lo > o0 ? lo : o0, b = hi < o1 ? hi : o1;
        if (y < 0 || y >= h || a > o1) a = b = o1;
        b = b > a ? b : a;
        for (long o = o0; o < a; o++) d[o] = 0.f;
        const float *row = plane + y * w + x0;
        if (sw == 1) {
            if (b > a) memcpy(d + a, row + a, sizeof(float) * (size_t)(b - a));
        } else if (sw == 2) { /* (vectorised: two loads and a shuffle per vector) */
            for (long o = a; o < b; o++) d[o] = row[2 * o];
        } else {
            for (long o = a; o < b; o++) d[o] = row[o * sw];
        }
        for (long o = b; o < o1; o++) d[o] = 0.f;
    }
}
