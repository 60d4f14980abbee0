"""Depthwise convolution (one input channel per group, any channel multiplier) for 1-D and 2-D inputs.

A depthwise conv has no reduction over channels, so it is no GEMM: it is ``kernel_size`` multiply-adds
per output, done here as whole-array numpy passes, one product and one sum per kernel tap.  What decides
the speed is the shape of those passes (numpy 2.x, measured on this project's machine, 1 thread):

* numpy runs an elementwise op whose operands are not all one contiguous run (a broadcast weight, a
  strided view) in rows; rows of up to ``np.getbufsize() // 2`` elements (4096) cost about twice
  as much per element as longer ones (0.22 against 0.14 ns per float32 product).  NCHW depthwise
  passes have one row per channel plane (49-3136 elements), so every pass was in the slow regime,
  plus the per-row cost of a short window view: 0.7-2 GFLOP/s, 0.5-1.3 ms per ShuffleNet layer.
* so the input is copied once (the pad copy every conv makes anyway) into a *rows* layout:
  ``buf[n, row phase, column phase, row, channel, column]``, padded, split by the strides into phases.
  In that layout every kernel tap of every output row is one contiguous run of ``C * QW`` values
  (all channels of one padded input row, ``QW`` the padded row width of a phase), and the runs of
  consecutive output rows follow each other: tap ``t`` of the whole output is one contiguous slice.
  Its weight varies along the run (the tap's weight of channel c, repeated QW times), so the product
  is that slice times a weight vector broadcast over "super rows" of ``R`` output rows, with ``R``
  chosen so that a row is long enough for the fast regime (the vector is prepared once per weight
  array and geometry, ``R * C * QW`` values per tap).
* the output is computed over the padded row width (the extra columns read the neighbouring channel's
  row and are cropped, like im2col's "flat" columns) and over ``R``-rounded rows; the bias is added in
  the rows layout (long rows again), then the result is copied once into NCHW (where a fused relu, run
  by the caller, is one contiguous pass).

By default (``EINSUM``) all taps are summed by one ``einsum`` over strided views of the layout instead
(``_einsum_conv``; rows at any stride, read in place): no product buffer, and each output is written once
rather than twice per tap (1.2-1.35x faster per layer, the taps alone 1.7x).  Everything that depends on
the geometry alone (the copies' offsets, the views' strides) is worked out once (``_einsum_plan``).

Strides split the input into phases (``sh * sw`` planes) in the layout copy, so each tap reads a
stride-1 slice of one phase; ``COLUMN_PHASES`` chooses, per column stride, between splitting columns
into phases (a strided gather in the copy) and computing every column and keeping every sw-th (twice
the tap work at stride 2).  Dilations only move the taps' offsets.  ``bench/depthwise_bench.py`` times
each variant per ShuffleNet layer against a plain copy of its input.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np

from ..prepared import prepared

#: column strides for which the layout copy splits columns into phases, on inputs at least
#: ``PHASE_MIN_WIDTH`` wide; other convs compute every column and keep every sw-th.  Measured (1 thread,
#: 3x3, best of 100, rotating order): phases win at stride 2 on wide images (ShuffleNet's 56x56: 0.44
#: against 0.51 ms; 64 channels at 56x56: 15%; 28x28: 4%) and lose on narrow ones (14x14: 4-14%: the
#: strided gather copies rows of W/2 values, the other copy whole rows) and at strides 3 and 4
COLUMN_PHASES = frozenset({2})
PHASE_MIN_WIDTH = 20
#: all taps summed in one einsum (``_einsum_conv``); False: a product and a sum per tap (``_products_conv``)
EINSUM = True


def depthwise_conv(x: np.ndarray, w: np.ndarray, bias, strides, dilations, begin, end, out,
                   shuffle: int = 1) -> np.ndarray:
    """Depthwise conv of x (N, C, [H,] W) with w (C * mult, 1, [KH,] KW): (N, C * mult, [OH,] OW), a fresh
    C-contiguous array (bias added; the caller applies any activation).

    ``shuffle`` > 1: the conv reads x's channels shuffled in that many groups (``channel_shuffle``);
    2-D convs without a channel multiplier read them so in the layout copy they make anyway.

    ``begin``/``end``/``out`` are the resolved pads and output sizes (``windows.resolve_pads``).  The result
    may be a view of a slightly larger buffer (the products' scratch space).
    """
    if shuffle > 1 and (x.ndim == 3 or w.shape[0] != x.shape[1]):
        x, shuffle = channel_shuffle(x, shuffle), 1
    if x.ndim == 3:  # 1-D: one row of a 2-D conv
        y = depthwise_conv(x[:, :, None, :], w[:, :, None, :], bias, [1, strides[0]], [1, dilations[0]],
                           [0, begin[0]], [0, end[0]], [1, out[0]])
        return y.reshape(y.shape[:2] + (out[0],))
    n, c = x.shape[:2]
    m = w.shape[0]
    if n == 0:
        return np.empty((0, m) + tuple(out), x.dtype)
    if m != c:  # channel multiplier: each input channel feeds m // c consecutive output channels
        x = np.repeat(x, m // c, axis=1)
    return _conv2d(x, w, bias, strides, dilations, begin, end, out, shuffle)


def channel_shuffle(x: np.ndarray, groups: int) -> np.ndarray:
    """x (N, C, ...) with its channels shuffled in ``groups`` (ShuffleNet): channel ``j * groups + i`` of
    the result is channel ``i * C / groups + j`` of x; a fresh C-contiguous array."""
    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"input_shuffle={groups} does not divide C={c}")
    return np.ascontiguousarray(x.reshape((n, groups, c // groups) + x.shape[2:]).swapaxes(1, 2)).reshape(x.shape)


def _conv2d(x, w, bias, strides, dilations, begin, end, out, shuffle=1):
    geometry = (x.shape[1:], w.shape[2:], tuple(strides), tuple(dilations), tuple(begin), tuple(end), tuple(out),
                np.getbufsize(), (COLUMN_PHASES, PHASE_MIN_WIDTH, EINSUM))
    if EINSUM:
        return _einsum_conv(x, w, bias, _einsum_plan(x.shape, x.strides, x.itemsize, shuffle, *geometry))
    return _products_conv(x, w, bias, out, shuffle, begin, geometry)


def _products_conv(x, w, bias, out, shuffle, begin, geometry):
    """All taps as a product and a sum each over contiguous slices of the rows layout (row and column
    phases for strides; ``EINSUM`` False: the variant ``bench/depthwise_bench.py`` compares)."""
    n, c = x.shape[:2]
    oh, ow = out
    sh, cs, step, qw, rows, oh_r, hq, starts, slack, rstep = _plan(*geometry)
    cq = c * qw
    image = sh * cs * hq * cq
    wvec, bvec = prepared(w, ("depthwise", qw, rows), bias, lambda: _vectors(w, bias, qw, rows))
    it = x.itemsize
    shape = (n, oh_r // rows, rows * cq)
    y = np.empty(shape, x.dtype)
    # the products' scratch, later the result (never larger): one allocation less per call
    scratch = np.empty(max(n * oh_r * cq, n * c * oh * ow), x.dtype)
    flat = np.zeros(n * image + slack, x.dtype)
    _fill(flat[:n * image].reshape(n, sh, cs, hq, c, qw), x, begin, sh, cs, shuffle)
    tmp = scratch[:y.size].reshape(shape)
    for k, start in enumerate(starts):
        src = np.ndarray(shape, x.dtype, flat, start * it, (image * it, rows * cq * it, it))
        if k == 0:
            np.multiply(src, wvec[0], out=y)
        else:
            np.multiply(src, wvec[k], out=tmp)
            y += tmp
    if bvec is not None:
        y += bvec
    # (N, rows, C, QW) -> (N, C, OH, OW): the only copy out, cropping the extra rows and columns
    res = scratch[:n * c * oh * ow].reshape(n, c, oh, ow)
    grid = y.reshape(n, oh_r, c, qw)[:, :oh, :, 0:(ow - 1) * step + 1:step].transpose(0, 2, 1, 3)
    if step == 1:
        np.copyto(_as_rows(res), _as_rows(grid))
    else:
        np.copyto(res, grid)
    return res


class _EinsumPlan(NamedTuple):
    """Everything ``_einsum_conv`` derives from one geometry (``_einsum_plan``), so that a call only
    allocates, copies and computes: the per-call Python work of a layer went from 40-50 us to ~15 us."""

    qw: int
    rows: int
    size: int  # values of one copy of the layout (all images)
    copies: int  # values of the buffer holding the kw copies
    split: tuple  # x reshaped to (N, g, C/g, H, W) for the fill's channel shuffle
    fills: tuple  # (start, end of the zeroed span, layout shape, ((layout index, source index), ...))
    whole_rows: bool  # the fills copy rows as single opaque elements (``_as_rows``), else value by value
    shifts: tuple  # (start, start of the earlier copy it is shifted from)
    taps: tuple  # (shape, byte strides) of the (KH, KW, N, R, L) view of the copies einsum reads
    weights: tuple  # the weight vectors' (KH, KW, L) shape
    y: tuple  # einsum's output shape (N, R, L)
    out: tuple  # the result's shape (N, C, OH, OW)
    crop: tuple  # (shape, byte strides) of the result's values in y, as (N, C, OH, OW) or rows of OW values
    row: Optional[np.dtype]  # the crop copies rows of this opaque dtype, or values


def _einsum_conv(x: np.ndarray, w: np.ndarray, bias, p: _EinsumPlan) -> np.ndarray:
    """All taps as one ``einsum`` (rows read ``rstep`` layout rows apart): no product buffer, each output
    written once instead of twice per tap.

    einsum walks its operands along their smallest stride; a tap's column offset (1 value) would tie
    with the run's own stride and make the inner loop 3 values long, so the layout is copied once per
    kernel column, each copy starting at that column: tap (i, j) then sits at row offset ``i * dh`` of
    copy j, both large strides.  With ``cs`` column phases (stride-2 columns), copy j holds the columns
    ``j * dw``, ``j * dw + cs``, ... only: the einsum computes the kept columns alone.  A copy is a shifted
    memcpy of an earlier one of the same phase, or else filled from x (a strided gather when cs > 1).
    Measured against a product and a sum per tap (1 thread): 28x28x136 1.7x faster for the taps alone,
    1.35x with the two extra copies; stride 2 on 56x56x112: 1.15x (``bench/depthwise_bench.py``).
    """
    wvec, bvec = prepared(w, ("depthwise", p.qw, p.rows), bias, lambda: _vectors(w, bias, p.qw, p.rows))
    copies = np.empty(p.copies, x.dtype)
    xt = x.reshape(p.split).transpose(0, 3, 2, 1, 4)  # (N, H, C/g, g, W): see ``_fill``
    for start, stop, shape, pieces in p.fills:
        copies[start:stop] = 0
        layout = copies[start:start + p.size].reshape(shape)
        for dst, src in pieces:
            if p.whole_rows:
                np.copyto(_as_rows(layout[dst]), _as_rows(xt[src]))
            else:
                layout[dst] = xt[src]
    for start, source in p.shifts:
        copies[start:start + p.size] = copies[source:source + p.size]
    y = np.empty(p.y, x.dtype)
    np.einsum("ijnrl,ijl->nrl", np.ndarray(p.taps[0], x.dtype, copies, 0, p.taps[1]), wvec.reshape(p.weights),
              out=y)
    if bvec is not None:
        y += bvec
    # (N, R, C, QW) -> (N, C, OH, OW): the only copy out, cropping the extra rows and columns
    res = np.empty(p.out, x.dtype)
    if p.row is None:
        np.copyto(res, np.ndarray(p.crop[0], x.dtype, y, 0, p.crop[1]))
    else:
        np.copyto(res.view(p.row)[..., 0], np.ndarray(p.crop[0], p.row, y, 0, p.crop[1]))
    return res


@functools.lru_cache(maxsize=256)
def _einsum_plan(xshape, xstrides, itemsize, shuffle, chw, kernel, strides, dilations, begin, end, out, bufsize,
                 choices) -> _EinsumPlan:
    """The :class:`_EinsumPlan` of one geometry (``_plan``'s layout; x's shape and strides, for the fill)."""
    _, cs, step, qw, rows, oh_r, hq, _, _, rstep = _plan(chw, kernel, strides, dilations, begin, end, out, bufsize,
                                                         choices)
    n, c, h, wd = xshape
    kh, kw = kernel
    dh, dw = dilations
    oh, ow = out
    cq, it = c * qw, itemsize
    image = hq * cq
    size = n * image
    cols = [divmod(j * dw, cs) for j in range(kw)]  # (offset in the phase, phase) of each kernel column
    slack = max(u for u, _ in cols)  # a shifted copy reads this far past its source's last image
    pitch = _unaliased(size + slack, it)
    g = shuffle
    whole = cs == 1 and xstrides[3] == itemsize  # the fill copies whole rows (``_as_rows``)
    fills, shifts = [], []
    for j, (u, r) in enumerate(cols):
        src = next((k for k in range(j) if cols[k][1] == r and cols[k][0] <= u), None)
        if src is None:
            pieces = _fill_pieces((n, c, h, wd), begin, 1, cs, (u * cs + r,))
            fills.append((j * pitch, j * pitch + size + slack, (n, hq, c // g, g, qw),
                          tuple((d[:1] + d[3:], s) for d, s in pieces)))
        else:
            shifts.append((j * pitch, src * pitch + u - cols[src][0]))
    y = (n, oh_r // rows, rows * cq)
    if step == 1:  # rows of OW values, each copied as one opaque element
        row = _void(ow * it)
        crop = ((n, c, oh), (oh_r * cq * it, qw * it, cq * it))
    else:
        row = None
        crop = ((n, c, oh, ow), (oh_r * cq * it, qw * it, cq * it, step * it))
    return _EinsumPlan(qw, rows, size, kw * pitch, (n, g, c // g, h, wd), tuple(fills), whole, tuple(shifts),
                       ((kh, kw) + y, (dh * cq * it, pitch * it, image * it, rstep * y[2] * it, it)), (kh, kw, -1),
                       y, (n, c, oh, ow), crop, row)


def _unaliased(count: int, itemsize: int) -> int:
    """``count`` rounded up so that copies ``count`` values apart sit half a 4 KiB page apart modulo 4 KiB.

    Loads and stores whose addresses differ by a multiple of 4 KiB (give or take a few bytes) stall on
    x86 ("4K aliasing"): the shifted copies of a 14x14x272 layout (an exact multiple of 4 KiB long) took
    190 us to copy and slowed the einsum reading them by 20%, against 10 us unpadded elsewhere.
    """
    page = 4096 // itemsize
    return count + (page // 2 - count % page) % page


def _as_rows(a: np.ndarray) -> np.ndarray:
    """``a`` (..., L), its last axis contiguous, as an (...) array of L-value opaque elements.

    Copying between the NCHW and rows layouts moves rows of W values (7-56 here), one numpy inner loop
    per row; copied as single elements, each row is one memcpy in a loop over all of them: 1.5-2.2x
    faster (ShuffleNet's layers, 9-12 us against 18-25 us per copy).
    """
    return a.view(_void(a.shape[-1] * a.itemsize))[..., 0]


@functools.lru_cache(maxsize=None)
def _void(nbytes: int) -> np.dtype:
    """The opaque dtype of ``nbytes`` bytes (built once: building one per call cost 2-3 us)."""
    return np.dtype((np.void, nbytes))


@functools.lru_cache(maxsize=256)
def _plan(chw, kernel, strides, dilations, begin, end, out, bufsize, choices):
    """The layout of one geometry (computed once per geometry): row phases ``sh``, column phases ``cs``,
    output column step, phase width ``QW``, output rows per weight vector and the rounded output rows,
    rows per phase ``HQ``, each tap's start in an image's layout, the zeros after the last image, and the
    layout rows from one output row to the next.  ``choices``: (COLUMN_PHASES, PHASE_MIN_WIDTH, EINSUM).

    einsum reads strided rows directly (no row phases; column phases are its copies' starts, see
    ``_einsum_conv``); its output rows are then not adjacent in the layout, so each weight vector covers
    one row."""
    c, h, wd = chw
    kh, kw = kernel
    (sh, sw), (dh, dw), (oh, _) = strides, dilations, out
    cs = sw if sw in choices[0] and wd >= choices[1] else 1  # column phases in the layout
    rstep = sh if choices[2] else 1  # output row -> layout rows (einsum: strided rows)
    sh //= rstep
    ph, pw = h + begin[0] + end[0], wd + begin[1] + end[1]
    qw = -(-pw // cs)
    cq = c * qw
    rows = max(1, min(oh, -(-(bufsize // 2 + 1) // cq)))  # output rows per weight vector: > bufsize / 2 values
    rows = 1 if rstep > 1 else rows
    oh_r = -(-oh // rows) * rows
    # taps: (row phase, row offset, column phase, column offset) in the layout
    taps = [((i * dh) % sh, (i * dh) // sh, (j * dw) % cs, (j * dw) // cs) for i in range(kh) for j in range(kw)]
    hq = max(-(-ph // sh), (oh_r - 1) * rstep + 1 + max(t[1] for t in taps))
    starts = tuple(((a * cs + r) * hq + ui) * cq + uj for a, ui, r, uj in taps)
    slack = max(t[3] for t in taps)  # the last tap's run may end past the last plane: zeros
    return sh, cs, sw // cs, qw, rows, oh_r, hq, starts, slack, rstep


def _fill(buf: np.ndarray, x: np.ndarray, begin, sh: int, cs: int, shuffle: int = 1) -> None:
    """Copy x (N, C, H, W) into the zeroed layout buf (N, sh, cs, HQ, C, QW) at padded position
    (row hq * sh + a, column q * cs + r) = (input row + begin[0], input column + begin[1]); with
    ``shuffle`` > 1, x's channels shuffled in that many groups (``channel_shuffle``) on the way.

    The channel axis is split as (C / g, g) on both sides for a shuffle, so the copy moves the same rows
    from a permuted source: the shuffle costs no pass of its own."""
    n, c, h, wd = x.shape
    g = shuffle  # a divisor of c (``conv`` checks it)
    # (N, H, C/g, g, W): layout channel j * g + i <- x channel i * C/g + j
    xt = x.reshape(n, g, c // g, h, wd).transpose(0, 3, 2, 1, 4)
    buf = buf.reshape(buf.shape[:4] + (c // g, g, buf.shape[5]))
    whole_rows = cs == 1 and x.strides[3] == x.itemsize  # rows copied as single elements (``_as_rows``)
    for dst, src in _fill_pieces(x.shape, tuple(begin), sh, cs, tuple(range(cs))):
        if whole_rows:
            np.copyto(_as_rows(buf[dst]), _as_rows(xt[src]))
        else:
            buf[dst] = xt[src]


@functools.lru_cache(maxsize=256)
def _fill_pieces(xshape, begin, sh: int, cs: int, starts: tuple) -> tuple:
    """The copies of x into a rows layout, computed once per geometry: (layout index into (N, sh, P, HQ, C/g,
    g, QW), source index into x as (N, H, C/g, g, W)) for each row phase and each of the P
    column phases, phase p holding padded columns ``q * cs + starts[p]`` (``_fill``; ``_einsum_plan``'s
    copies start at a kernel column each)."""
    _, _, h, wd = xshape
    pieces = []
    for a in range(sh):
        # padded rows hq * sh + a holding input rows h0, h0 + sh, ...
        q0 = -(-(begin[0] - a) // sh) if begin[0] > a else 0
        h0 = q0 * sh + a - begin[0]
        if h0 >= h:
            continue
        nh = (h - 1 - h0) // sh + 1
        for phase, r in enumerate(starts):
            p0 = -(-(begin[1] - r) // cs) if begin[1] > r else 0
            w0 = p0 * cs + r - begin[1]
            if w0 >= wd:
                continue
            nw = (wd - 1 - w0) // cs + 1
            every = slice(None)
            pieces.append(((every, a, phase, slice(q0, q0 + nh), every, every, slice(p0, p0 + nw)),
                           (every, slice(h0, h0 + (nh - 1) * sh + 1, sh), every, every,
                            slice(w0, w0 + (nw - 1) * cs + 1, cs))))
    return tuple(pieces)


def _vectors(w: np.ndarray, bias, qw: int, rows: int):
    """(T, rows * C * QW) per-tap weight vectors and the (rows * C * QW) bias vector (or None) for
    weights w (C, 1, KH, KW): channel c's value repeated QW times, the whole repeated ``rows`` times."""
    c = w.shape[0]
    wvec = np.tile(np.repeat(w.reshape(c, -1).T, qw, axis=1), (1, rows))
    return wvec, None if bias is None else np.tile(np.repeat(bias, qw), rows)
