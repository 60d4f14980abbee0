"""Resize (and the older Upsample) and Pad.

Resize is separable: each resized axis is interpolated on its own with index/weight vectors computed
once per axis (``np.take`` plus a weighted sum), so the cost is a few vectorised passes over the
data, never a loop over pixels.  Nearest, linear and cubic modes and every ONNX
coordinate_transformation_mode are supported; ``antialias=1`` is not.
"""

from __future__ import annotations

import numpy as np

from .registry import bad, ints, norm_axis, register

_ROUNDING = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _source_coords(mode, out_len, in_len, scale, roi_start, roi_end):
    """Input-space coordinate of each output index along one axis.

    As in ONNX's reference, the formulas use the unrounded resized length ``in_len * scale``.
    """
    x = np.arange(out_len, dtype=np.float64)
    out_int, out_len = out_len, in_len * scale
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjust = out_int / out_len
        return in_len / 2 * (1 - adjust) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_int)
    if mode == "align_corners":
        return x * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros(out_int)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        if out_len > 1:
            return roi_start * (in_len - 1) + x * (roi_end - roi_start) * (in_len - 1) / (out_len - 1)
        return np.full(out_int, 0.5 * (roi_start + roi_end) * (in_len - 1))
    raise bad("resize", f"unknown coordinate_transformation_mode {mode!r}")


def _cubic_weights(t, a):
    """Keys cubic-convolution weights of the four taps floor(x)-1 .. floor(x)+2 (t = frac(x))."""
    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def _resize_axis(x, axis, out_len, coords, mode, nearest_mode, a, exclude_outside, extrapolate):
    in_len = x.shape[axis]
    shape = [1] * x.ndim
    shape[axis] = out_len
    if mode == "nearest":
        idx = _ROUNDING[nearest_mode](coords).astype(np.int64)
        y = np.take(x, np.clip(idx, 0, in_len - 1), axis=axis)
    else:
        base = np.floor(coords)
        t = coords - base
        if mode == "linear":
            offsets, weights = np.array([0, 1]), np.stack([1 - t, t], axis=-1)
        else:
            offsets, weights = np.array([-1, 0, 1, 2]), _cubic_weights(t, a)
        taps = base.astype(np.int64)[:, None] + offsets
        if exclude_outside:
            weights = np.where((taps < 0) | (taps >= in_len), 0.0, weights)
            weights = weights / weights.sum(axis=1, keepdims=True)
        taps = np.clip(taps, 0, in_len - 1)
        y = 0
        for j in range(len(offsets)):
            w = weights[:, j].astype(x.dtype).reshape(shape)
            y = y + np.take(x, taps[:, j], axis=axis) * w
    if extrapolate is not None:
        outside = ((coords < 0) | (coords > in_len - 1)).reshape(shape)
        y = np.where(outside, x.dtype.type(extrapolate), y)
    return y


@register("resize")
def resize(x, roi=None, scales=None, sizes=None, *, antialias: int = 0, axes=None,
           coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75,
           exclude_outside: int = 0, extrapolation_value: float = 0.0,
           keep_aspect_ratio_policy: str = "stretch", mode: str = "nearest",
           nearest_mode: str = "round_prefer_floor"):
    """ONNX Resize (opsets 11-19): ``scales`` or ``sizes`` for all dims or for ``axes``."""
    x = np.asarray(x)
    if antialias:
        raise bad("resize", "antialias=1 is not supported")
    if mode not in ("nearest", "linear", "cubic"):
        raise bad("resize", f"unknown mode {mode!r}")
    if nearest_mode not in _ROUNDING:
        raise bad("resize", f"unknown nearest_mode {nearest_mode!r}")
    ax = list(range(x.ndim)) if axes is None else [norm_axis(int(a), x.ndim, "resize") for a in axes]
    in_lens = [x.shape[a] for a in ax]
    scales = None if scales is None or np.size(scales) == 0 else [float(s) for s in np.ravel(scales)]
    sizes = None if sizes is None or np.size(sizes) == 0 else ints(sizes, "resize", "sizes")
    if (scales is None) == (sizes is None):
        raise bad("resize", "exactly one of scales and sizes must be given")
    if scales is not None:
        if len(scales) != len(ax):
            raise bad("resize", f"{len(scales)} scales for {len(ax)} axes")
        out_lens = [int(np.floor(n * s)) for n, s in zip(in_lens, scales)]
    else:
        if len(sizes) != len(ax):
            raise bad("resize", f"{len(sizes)} sizes for {len(ax)} axes")
        out_lens = sizes
        scales = [o / n for o, n in zip(out_lens, in_lens)]
        if keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            s = pick(scales)
            scales = [s] * len(ax)
            out_lens = [int(np.floor(n * s + 0.5)) for n in in_lens]
        elif keep_aspect_ratio_policy != "stretch":
            raise bad("resize", f"unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}")
    roi_v = None if roi is None or np.size(roi) == 0 else np.ravel(roi).astype(np.float64)
    tf_crop = coordinate_transformation_mode == "tf_crop_and_resize"
    if tf_crop and (roi_v is None or len(roi_v) != 2 * len(ax)):
        raise bad("resize", "tf_crop_and_resize needs roi with 2 values per resized axis")
    ct = np.dtype(np.float32) if x.dtype.kind != "f" or x.dtype == np.float16 else x.dtype
    y = x if mode == "nearest" else x.astype(ct, copy=False)
    for i, (a, n, o, s) in enumerate(zip(ax, in_lens, out_lens, scales)):
        if o == n and s == 1.0 and not tf_crop:
            continue
        r0, r1 = (roi_v[i], roi_v[len(ax) + i]) if tf_crop else (0.0, 1.0)
        coords = _source_coords(coordinate_transformation_mode, o, n, s, r0, r1)
        y = _resize_axis(y, a, o, coords, mode, nearest_mode, cubic_coeff_a, exclude_outside,
                         extrapolation_value if tf_crop else None)
    if x.dtype.kind in "iu" and mode != "nearest":
        y = np.rint(y)
    return np.asarray(y).astype(x.dtype, copy=False)


@register("upsample")
def upsample(x, scales_input=None, *, mode: str = "nearest", scales=None):
    """ONNX Upsample (deprecated): asymmetric coordinates, nearest rounding down; scales as input or attr."""
    s = scales_input if scales_input is not None else scales
    if s is None:
        raise bad("upsample", "needs scales")
    return resize(x, None, np.asarray(s, dtype=np.float32), None, mode=mode,
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@register("pad")
def pad(data, pads_input=None, constant_value=None, axes_input=None, *, mode: str = "constant",
        pads=None, value: float = 0.0):
    """ONNX Pad: modes constant/reflect/edge/wrap; negative pads crop; pads as input or (opset < 11) attr."""
    x = np.asarray(data)
    raw = pads_input if pads_input is not None else pads
    if raw is None:
        raise bad("pad", "needs pads")
    p = ints(raw, "pad", "pads")
    ax = list(range(x.ndim)) if axes_input is None else [norm_axis(a, x.ndim, "pad") for a in ints(axes_input)]
    if len(p) != 2 * len(ax):
        raise bad("pad", f"{len(p)} pads for {len(ax)} axes")
    begin, end = [0] * x.ndim, [0] * x.ndim
    for i, a in enumerate(ax):
        begin[a], end[a] = p[i], p[len(ax) + i]
    # negative pads crop first, then the rest pads
    crop = tuple(slice(max(-b, 0), x.shape[d] - max(-e, 0)) for d, (b, e) in enumerate(zip(begin, end)))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if mode == "constant":
        fill = value if constant_value is None or np.size(constant_value) == 0 else np.ravel(constant_value)[0]
        return np.pad(x, widths, mode="constant", constant_values=np.asarray(fill).astype(x.dtype))
    if mode not in ("reflect", "edge", "wrap"):
        raise bad("pad", f"unknown mode {mode!r}")
    return np.pad(x, widths, mode=mode)
