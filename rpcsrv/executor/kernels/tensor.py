"""Shape and data-movement kernels: reshape/transpose/concat/split/slice/gather/pad/resize/...

Tensor-valued parameters (Reshape's shape, Slice's starts, Pad's pads, ...) arrive as inputs, as in
ONNX; for ops whose parameter moved from attribute to input across opsets (Split, Squeeze,
Unsqueeze, Pad), both forms are accepted.
"""

from __future__ import annotations

import numpy as np

from . import register


def _ints(v) -> list[int]:
    return [int(i) for i in np.asarray(v).reshape(-1)]


@register("reshape")
def reshape(x, shape, allowzero=0):
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@register("transpose")
def transpose(x, perm=None):
    return np.transpose(x, perm)


@register("flatten")
def flatten(x, axis=1):
    axis %= max(x.ndim, 1) if axis < 0 else x.ndim + 1
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


@register("squeeze")
def squeeze(x, axes=None):
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(a % x.ndim for a in _ints(axes)))


@register("unsqueeze")
def unsqueeze(x, axes):
    axes = _ints(axes)
    out_rank = x.ndim + len(axes)
    return np.expand_dims(x, tuple(sorted(a % out_rank for a in axes)))


@register("concat")
def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


@register("split")
def split(x, split=None, axis=0, num_outputs=None):
    axis %= x.ndim
    if split is not None and np.asarray(split).size:
        points = np.cumsum(_ints(split))[:-1]
    else:
        parts = num_outputs or 2
        size = -(-x.shape[axis] // parts)
        points = list(range(size, x.shape[axis], size))
    return tuple(np.split(x, points, axis=axis))


@register("slice")
def slice_(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        dim = x.shape[a % x.ndim]
        if st > 0:
            s = max(0, min(dim, s + dim if s < 0 else s))
            e = max(0, min(dim, e + dim if e < 0 else e))
        else:
            s = max(-1, min(dim - 1, s + dim if s < 0 else s))
            e = max(-1, min(dim - 1, e + dim if e < 0 else e))
            if e == -1:
                e = None
        idx[a % x.ndim] = slice(s, e, st)
    return x[tuple(idx)]


@register("gather")
def gather(x, indices, axis=0):
    axis %= x.ndim
    idx = np.where(indices < 0, indices + x.shape[axis], indices)
    return np.take(x, idx, axis=axis)


@register("gather_elements")
def gather_elements(x, indices, axis=0):
    axis %= x.ndim
    idx = np.where(indices < 0, indices + x.shape[axis], indices)
    return np.take_along_axis(x, idx, axis=axis)


@register("gather_nd")
def gather_nd(x, indices, batch_dims=0):
    if batch_dims:
        raise ValueError("gather_nd: batch_dims > 0 is not supported")
    k = indices.shape[-1]
    flat = indices.reshape(-1, k)
    out = np.stack([x[tuple(i)] for i in flat]) if len(flat) else np.zeros((0,) + x.shape[k:], x.dtype)
    return out.reshape(indices.shape[:-1] + x.shape[k:])


@register("scatter_elements")
def scatter_elements(x, indices, updates, axis=0, reduction="none"):
    out = x.copy()
    axis %= x.ndim
    idx = np.where(indices < 0, indices + x.shape[axis], indices)
    if reduction == "none":
        np.put_along_axis(out, idx, updates, axis=axis)
        return out
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    grid = list(np.indices(idx.shape))
    grid[axis] = idx
    ufunc.at(out, tuple(grid), updates)
    return out


@register("pad")
def pad(x, pads=None, constant_value=None, axes=None, mode="constant", value=None):
    p = _ints(pads)
    axes = _ints(axes) if axes is not None else list(range(x.ndim))
    n = len(axes)
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a % x.ndim] = (p[i], p[i + n])
    if any(b < 0 or e < 0 for b, e in width):  # negative pads crop
        idx = tuple(slice(-b if b < 0 else 0, x.shape[i] + e if e < 0 else None) for i, (b, e) in enumerate(width))
        x = x[idx]
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        cv = constant_value if constant_value is not None else (value if value is not None else 0)
        cv = np.asarray(cv).reshape(-1)[0] if np.asarray(cv).size else 0
        return np.pad(x, width, mode="constant", constant_values=cv)
    return np.pad(x, width, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])


@register("expand")
def expand(x, shape):
    return x * np.ones(_ints(shape), dtype=x.dtype) if x.dtype != np.bool_ else \
        np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(_ints(shape)))).copy()


@register("tile")
def tile(x, repeats):
    return np.tile(x, _ints(repeats))


@register("shape")
def shape(x, start=0, end=None):
    return np.array(x.shape[start:end], dtype=np.int64)


@register("size")
def size(x):
    return np.array(x.size, dtype=np.int64)


@register("constant_of_shape")
def constant_of_shape(shape, value=None):
    v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(_ints(shape), v[0], dtype=v.dtype)


@register("range")
def range_(start, limit, delta):
    s, lim, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    n = max(int(np.ceil((lim - s) / d)), 0)
    return (s + np.arange(n) * d).astype(np.asarray(start).dtype)


@register("depth_to_space")
def depth_to_space(x, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("space_to_depth")
def space_to_depth(x, blocksize):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@register("trilu")
def trilu(x, k=None, upper=1):
    kk = int(np.asarray(k).reshape(-1)[0]) if k is not None else 0
    return np.triu(x, kk) if upper else np.tril(x, kk)


@register("einsum")
def einsum(*xs, equation):
    return np.einsum(equation.replace(" ", ""), *xs)


@register("top_k")
def top_k(x, k, axis=-1, largest=1, sorted=1):  # noqa: A002 - ONNX's attribute name
    kk = int(np.asarray(k).reshape(-1)[0])
    axis %= x.ndim
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, range(kk), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


@register("one_hot")
def one_hot(indices, depth, values, axis=-1):
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = np.where(indices < 0, indices + d, indices).astype(np.int64)
    eye = (np.arange(d) == idx[..., None])
    out = np.where(eye, values[1], values[0])
    return np.moveaxis(out, -1, axis if axis >= 0 else out.ndim + axis)


def _source_coords(out_len, in_len, scale, mode, roi=None):
    x = np.arange(out_len, dtype=np.float64)
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return x * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros_like(x)
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            return start * (in_len - 1) + x * (end - start) * (in_len - 1) / (out_len - 1)
        return np.full_like(x, 0.5 * (start + end) * (in_len - 1))
    if mode == "half_pixel_symmetric":
        adj = out_len / (scale * in_len)
        offset = in_len / 2 * (1 - adj)
        return offset + (x + 0.5) / scale - 0.5
    return (x + 0.5) / scale - 0.5  # half_pixel


def _nearest(c, nearest_mode):
    if nearest_mode == "floor":
        return np.floor(c)
    if nearest_mode == "ceil":
        return np.ceil(c)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(c + 0.5)
    return np.ceil(c - 0.5)  # round_prefer_floor


@register("resize")
def resize(x, roi=None, scales=None, sizes=None, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    if mode not in ("nearest", "linear") or antialias:
        raise ValueError(f"resize: mode {mode!r} (antialias={antialias}) is not supported")
    axes = _ints(axes) if axes is not None else list(range(x.ndim))
    have_sizes = sizes is not None and np.asarray(sizes).size
    if have_sizes:
        out = _ints(sizes)
        sc = [o / x.shape[a] for o, a in zip(out, axes)]
        if keep_aspect_ratio_policy != "stretch":
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            s = pick(sc)
            sc = [s] * len(axes)
            out = [int(round(s * x.shape[a])) for a in axes]
    else:
        sc = [float(v) for v in np.asarray(scales).reshape(-1)]
        out = [int(np.floor(x.shape[a] * s)) for a, s in zip(axes, sc)]
    roi_v = np.asarray(roi, dtype=np.float64).reshape(-1) if roi is not None and np.asarray(roi).size else None
    y = x.astype(np.float64) if mode == "linear" else x
    for i, a in enumerate(axes):
        in_len = x.shape[a]
        r = (roi_v[i], roi_v[i + len(axes)]) if roi_v is not None else (0.0, 1.0)
        c = _source_coords(out[i], in_len, sc[i], coordinate_transformation_mode, r)
        outside = (c < 0) | (c > in_len - 1)
        if mode == "nearest":
            idx = np.clip(_nearest(c, nearest_mode), 0, in_len - 1).astype(np.int64)
            y = np.take(y, idx, axis=a)
        else:
            c = np.clip(c, 0, in_len - 1)
            lo = np.floor(c).astype(np.int64)
            hi = np.minimum(lo + 1, in_len - 1)
            frac = (c - lo).reshape([-1 if d == a else 1 for d in range(y.ndim)])
            y = np.take(y, lo, axis=a) * (1 - frac) + np.take(y, hi, axis=a) * frac
        if coordinate_transformation_mode == "tf_crop_and_resize" and outside.any():
            mask = outside.reshape([-1 if d == a else 1 for d in range(y.ndim)])
            y = np.where(mask, extrapolation_value, y)
    return y.astype(x.dtype)
