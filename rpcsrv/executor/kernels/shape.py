"""Shape and data-movement ops: reshape, transpose, concat, split, slice, gather, pad, ...

Most return numpy views (never written to).  Inputs that ONNX moved from attributes to tensor
inputs in some opset (Split's ``split``, Squeeze/Unsqueeze ``axes``, Slice's starts/ends/axes/steps,
Pad's ``pads``) are accepted both ways: the tensor input positionally, the attribute by its name.
"""

from __future__ import annotations

import math

import numpy as np

from .registry import bad, ints, norm_axis, register


def _one_way(op, name, tensor, attr):
    if tensor is not None and attr is not None:
        raise bad(op, f"{name} given both as input and attribute")
    return tensor if tensor is not None else attr


@register("reshape")
def reshape(data, shape, *, allowzero: int = 0):
    """ONNX Reshape: 0 copies the input dim (unless allowzero=1), -1 is inferred."""
    x = np.asarray(data)
    dims = ints(shape, "reshape", "shape")
    if not allowzero:
        dims = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(dims)]
    try:
        return x.reshape(dims)
    except ValueError as exc:
        raise bad("reshape", f"cannot reshape {x.shape} to {dims}: {exc}") from None


@register("transpose")
def transpose(data, *, perm=None):
    """ONNX Transpose (default: reverse the dims)."""
    x = np.asarray(data)
    p = list(reversed(range(x.ndim))) if perm is None else [int(v) for v in perm]
    if sorted(p) != list(range(x.ndim)):
        raise bad("transpose", f"perm {p} is not a permutation of {x.ndim} dims")
    return x.transpose(p)


@register("concat")
def concat(*inputs, axis: int):
    """ONNX Concat along ``axis``."""
    arrays = [np.asarray(x) for x in inputs if x is not None]
    if not arrays:
        raise bad("concat", "needs at least one input")
    return np.concatenate(arrays, axis=norm_axis(axis, arrays[0].ndim, "concat"))


@register("split")
def split(data, split_input=None, *, axis: int = 0, num_outputs=None, split=None):
    """ONNX Split: sizes from the ``split`` input/attribute, else ``num_outputs`` (last one smaller).

    Without either, there is no way for a kernel to know how many outputs the node has, so it is an
    error (ONNX infers it from the node's output count; the compiler passes ``num_outputs``).
    """
    x = np.asarray(data)
    a = norm_axis(axis, x.ndim, "split")
    sizes = _one_way("split", "split", split_input, split)
    n = x.shape[a]
    if sizes is not None:
        sizes = ints(sizes, "split", "split")
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise bad("split", f"sizes {sizes} do not add up to {n}")
    elif num_outputs is not None:
        step = -(-n // int(num_outputs))
        sizes = [min(step, n - i * step) for i in range(int(num_outputs))]
        if any(s < 0 for s in sizes):
            raise bad("split", f"cannot split {n} into {num_outputs} parts")
    else:
        raise bad("split", "needs the split sizes or num_outputs")
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=a))


@register("slice")
def slice_(data, starts_input=None, ends_input=None, axes_input=None, steps=None, *, starts=None, ends=None,
           axes=None):
    """ONNX Slice; opset-1 attributes ``starts``/``ends``/``axes`` are accepted too (no steps)."""
    x = np.asarray(data)
    return x[slice_index(x.shape, starts_input, ends_input, axes_input, steps, starts=starts, ends=ends, axes=axes)]


def slice_index(xshape, starts_input=None, ends_input=None, axes_input=None, steps=None, *, starts=None,
                ends=None, axes=None) -> tuple:
    """The numpy index of ONNX Slice (``slice_``'s arguments) on an input of shape ``xshape``."""
    ndim = len(xshape)
    st = ints(_one_way("slice", "starts", starts_input, starts), "slice", "starts")
    en = ints(_one_way("slice", "ends", ends_input, ends), "slice", "ends")
    ax_raw = _one_way("slice", "axes", axes_input, axes)
    ax = list(range(len(st))) if ax_raw is None else ints(ax_raw, "slice", "axes")
    sp = [1] * len(st) if steps is None else ints(steps, "slice", "steps")
    if not len(st) == len(en) == len(ax) == len(sp):
        raise bad("slice", "starts, ends, axes and steps must have the same length")
    index = [slice(None)] * ndim
    for s, e, a, p in zip(st, en, ax, sp):
        if p == 0:
            raise bad("slice", "steps must not be 0")
        a = norm_axis(a, ndim, "slice")
        dim = xshape[a]
        # python slicing clamps like ONNX, except that huge negative ends with negative steps mean "to the front"
        index[a] = slice(s, None if (p < 0 and e < -dim) else e, p)
    return tuple(index)


@register("gather")
def gather(data, indices, *, axis: int = 0):
    """ONNX Gather along ``axis`` (negative indices count from the end)."""
    x, idx = np.asarray(data), np.asarray(indices)
    a = norm_axis(axis, x.ndim, "gather")
    n = x.shape[a]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise bad("gather", f"indices out of range for axis of size {n}")
    if a == 0 and idx.ndim == 0 and idx.dtype.kind in "iu" and x.ndim > 1:
        return x[int(idx)]  # one index of the first axis (PyTorch's attention picks q, k, v so): a view, no copy
    return np.take(x, idx, axis=a)


@register("gather_elements")
def gather_elements(data, indices, *, axis: int = 0):
    """ONNX GatherElements: numpy take_along_axis with negative indices wrapped."""
    x, idx = np.asarray(data), np.asarray(indices).astype(np.int64)
    a = norm_axis(axis, x.ndim, "gather_elements")
    return np.take_along_axis(x, np.where(idx < 0, idx + x.shape[a], idx), axis=a)


@register("gather_nd")
def gather_nd(data, indices, *, batch_dims: int = 0):
    """ONNX GatherND: the last axis of ``indices`` addresses leading dims of ``data``."""
    x, idx = np.asarray(data), np.asarray(indices).astype(np.int64)
    b = int(batch_dims)
    batch = x.shape[:b]
    xb = x.reshape((-1,) + x.shape[b:])
    ib = idx.reshape((-1,) + idx.shape[b:])
    depth = idx.shape[-1]
    idx_wrapped = np.where(ib < 0, ib + np.array(x.shape[b:b + depth]), ib)
    out = [xb[i][tuple(np.moveaxis(idx_wrapped[i], -1, 0))] for i in range(xb.shape[0])]
    result = np.stack(out) if out else np.zeros((0,) + idx.shape[b:-1] + x.shape[b + depth:], x.dtype)
    return result.reshape(batch + idx.shape[b:-1] + x.shape[b + depth:])


@register("scatter_elements")
def scatter_elements(data, indices, updates, *, axis: int = 0, reduction: str = "none"):
    """ONNX ScatterElements (reduction none/add/mul/max/min) on a copy of ``data``."""
    x = np.array(data, copy=True)
    idx = np.asarray(indices).astype(np.int64)
    a = norm_axis(axis, x.ndim, "scatter_elements")
    idx = np.where(idx < 0, idx + x.shape[a], idx)
    # full index tuples: the axis from ``indices``, the other dims from their own positions
    grid = list(np.indices(idx.shape, sparse=True))
    grid[a] = idx
    where = tuple(np.broadcast_arrays(*grid))
    upd = np.asarray(updates)
    ufunc = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    if reduction not in ufunc:
        raise bad("scatter_elements", f"unknown reduction {reduction!r}")
    if ufunc[reduction] is None:
        x[where] = upd
    else:
        ufunc[reduction].at(x, where, upd)
    return x


@register("squeeze")
def squeeze(data, axes_input=None, *, axes=None):
    """ONNX Squeeze: drop the given size-1 dims (all size-1 dims when none are given)."""
    x = np.asarray(data)
    raw = _one_way("squeeze", "axes", axes_input, axes)
    if raw is None:
        return np.squeeze(x)
    ax = tuple(norm_axis(a, x.ndim, "squeeze") for a in ints(raw, "squeeze", "axes"))
    if any(x.shape[a] != 1 for a in ax):
        raise bad("squeeze", f"axes {ax} of shape {x.shape} are not all 1")
    return np.squeeze(x, axis=ax)


@register("unsqueeze")
def unsqueeze(data, axes_input=None, *, axes=None):
    """ONNX Unsqueeze: insert size-1 dims at ``axes`` (positions in the output)."""
    x = np.asarray(data)
    raw = _one_way("unsqueeze", "axes", axes_input, axes)
    if raw is None:
        raise bad("unsqueeze", "needs axes")
    out_rank = x.ndim + len(ints(raw))
    ax = sorted(norm_axis(a, out_rank, "unsqueeze") for a in ints(raw, "unsqueeze", "axes"))
    if len(set(ax)) != len(ax):
        raise bad("unsqueeze", f"repeated axes {ax}")
    return np.expand_dims(x, tuple(ax))


@register("flatten")
def flatten(data, *, axis: int = 1):
    """ONNX Flatten to 2-D: dims before ``axis`` make the rows."""
    x = np.asarray(data)
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a <= x.ndim:
        raise bad("flatten", f"axis {axis} out of range for rank {x.ndim}")
    # math.prod, not np.prod: a tuple through numpy's reduction machinery costs 7 us here, and 35-45 us
    # right after a large conv (numpy's code and data evicted from the caches), on a reshape's own ~1 us
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


@register("expand")
def expand(data, shape):
    """ONNX Expand: bidirectional broadcast of ``data`` with ``shape`` (a read-only view)."""
    x = np.asarray(data)
    try:
        target = np.broadcast_shapes(x.shape, tuple(ints(shape, "expand", "shape")))
    except ValueError as exc:
        raise bad("expand", str(exc)) from None
    return np.broadcast_to(x, target)


@register("tile")
def tile(data, repeats):
    """ONNX Tile: repeat the input ``repeats[i]`` times along dim i."""
    x = np.asarray(data)
    reps = ints(repeats, "tile", "repeats")
    if len(reps) != x.ndim:
        raise bad("tile", f"repeats has {len(reps)} entries for rank {x.ndim}")
    return np.tile(x, reps)


@register("shape")
def shape(data, *, start: int = 0, end=None):
    """ONNX Shape: the int64 shape, optionally the slice [start:end] of it (clamped)."""
    return np.array(np.shape(data)[start:end], dtype=np.int64)


@register("size")
def size(data):
    """ONNX Size: the element count as an int64 scalar."""
    return np.array(np.size(data), dtype=np.int64)


@register("constant_of_shape")
def constant_of_shape(shape, *, value=None, dtype=None):
    """ONNX ConstantOfShape: ``value`` is a one-element tensor (or a JSON number; default float 0);
    ``dtype`` (an rpcsrv attribute: JSON numbers carry no element type) names the fill's type."""
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if fill.size != 1:
        raise bad("constant_of_shape", "value must have exactly one element")
    if dtype is not None:
        try:
            fill = fill.astype(np.dtype(dtype))
        except TypeError:
            raise bad("constant_of_shape", f"unknown dtype {dtype!r}") from None
    elif fill.dtype == np.float64 and not isinstance(value, np.ndarray):
        fill = fill.astype(np.float32)  # a bare JSON number means ONNX's float default
    return np.full(ints(shape, "constant_of_shape", "shape"), fill[0], dtype=fill.dtype)


@register("range")
def range_(start, limit, delta):
    """ONNX Range: ceil((limit-start)/delta) elements, in the inputs' dtype."""
    s, lim, d = np.asarray(start), np.asarray(limit), np.asarray(delta)
    if d == 0:
        raise bad("range", "delta must not be 0")
    n = max(int(np.ceil((lim - s) / d)), 0)
    return (s + np.arange(n, dtype=s.dtype) * d).astype(s.dtype)


@register("depth_to_space")
def depth_to_space(x, *, blocksize: int, mode: str = "DCR"):
    """ONNX DepthToSpace, ``mode`` 'DCR' (depth-column-row) or 'CRD'."""
    x = np.asarray(x)
    n, c, h, w = x.shape
    b = int(blocksize)
    if c % (b * b):
        raise bad("depth_to_space", f"{c} channels not divisible by blocksize^2={b * b}")
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise bad("depth_to_space", f"mode must be 'DCR' or 'CRD', got {mode!r}")
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("space_to_depth")
def space_to_depth(x, *, blocksize: int, mode: str = "DCR"):
    """ONNX SpaceToDepth: the inverse of DepthToSpace (``mode`` 'DCR' or 'CRD')."""
    x = np.asarray(x)
    n, c, h, w = x.shape
    b = int(blocksize)
    if h % b or w % b:
        raise bad("space_to_depth", f"spatial dims {h}x{w} not divisible by blocksize {b}")
    if mode not in ("DCR", "CRD"):
        raise bad("space_to_depth", f"mode must be 'DCR' or 'CRD', got {mode!r}")
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(order)
    return y.reshape(n, c * b * b, h // b, w // b)


@register("trilu")
def trilu(x, k=None, *, upper: int = 1):
    """ONNX Trilu: keep the upper (or lower) triangle of the last two dims, diagonal offset ``k``."""
    x = np.asarray(x)
    kk = 0 if k is None else ints(k, "trilu", "k")[0]
    return np.triu(x, kk) if upper else np.tril(x, kk)
