"""Compiled kernels: the C files of the kernels' family folders built with the board's C compiler at first use
(cached), or prebuilt in the wheel for boards without one, loaded by ctypes.

(``conv/``: ``dwconv.c`` (depthwise convs by rows, also the stem convolution and the pools on their phase
planes), ``dwchan.c`` (depthwise convs VW channels side by side), ``epilogue.c`` (a GEMM conv's (or MatMul's)
bias and fused activation in one pass), ``winograd.c``, ``winograd4.c`` (Winograd's input and output
transforms, F(2x2, 3x3), F(4x4, 3x3)), ``im2col.c`` (a dense conv's column matrix), ``gemm.c`` (the GEMM of
1x1 convs and MatMuls by constant weights with that epilogue in its tiles, ``gemm.py``); ``pool/pools.c``: max
and average pools by rows; ``elementwise/sigmoid.c``: sigmoid, SiLU, GELU and softmax; ``norm/norm.c``:
LayerNormalization; this folder's ``vec.h``: their shared vector helpers.)

Why: a depthwise conv is ``kernel_size`` multiply-adds per output with no reduction over channels, so
numpy runs it as whole-array passes at memory speed (about 5 GFLOP/s here; ``depthwise.py``), while
onnxruntime's blocked kernels keep the taps in registers.  In MobileNetV2 that was 8.2 ms of numpy
against ~1.5 ms; a plain C loop the compiler vectorises closes most of it (see docs/executor.md).
Depthwise networks are what boards run, and a C compiler is what the native layer already asks of a
board (its shim is built the same way).

Where the library comes from, first found wins (``kbuild.py`` builds it; docs/executor.md, "Compiled kernels"):

1. ``RPCSRV_KERNELS_LIB=/path/libkernels.so``: this one (built elsewhere, e.g. with
   ``python rpcsrv/executor/kernels/clib/kbuild.py OUT --cc <cross gcc>``);
2. the cache (``--cache-dir``, ``$RPCSRV_CACHE_DIR``, default ``~/.cache/rpcsrv``), keyed by the sources' hash,
   the machine and the CPU's features (``kcache.py``; a compiler removed after the build leaves it in use);
3. built now with ``$RPCSRV_CC``, ``$CC``, ``cc``, ``gcc`` or ``clang`` (-O3 with ``-march=native`` where the
   compiler takes it): 3-5 s on this 2-core x86_64, over a minute on a slow board.  Only where
   :data:`POLICY` says so: a script or ``rpcsrv check`` (``inline``); a server never builds at first use: it
   builds in the background from its start (``rpcsrv.native.builds``) and installs the result (:func:`install`),
   and its native workers load the file it gave them (``given``), never compiling;
4. prebuilt in the wheel, ``prebuilt/<target>/libkernels.so`` (x86_64 generic and x86-64-v3, aarch64, armv7
   hard-float: -O3, for boards without a compiler), if its ELF machine is this board's (``rpcsrv.loader.machine``, as
   the native shim is chosen) and its stamp matches the sources' hash (a stale one is passed over).

``RPCSRV_COMPILED_KERNELS=0`` turns them off (the numpy kernels run).  Without a library every kernel
runs on numpy, as before; :func:`status` says which and why (``rpcsrv check`` reports it).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path
from typing import Optional

import numpy as np

from ....config import environment
from ....config.toolchain import BuildPolicy
from . import kbuild, kcache

SOURCES, HEADERS = kbuild.SOURCES, kbuild.HEADERS  # every C file of the family folders; vec.h (hashed with them)
PREBUILT = Path(__file__).with_name("prebuilt")
ENV_SWITCH = "RPCSRV_COMPILED_KERNELS"
_lock = threading.Lock()
#: "lib": the loaded library or None, "reason": why not, "path": where from, "epoch": a token that
#: :func:`reset` renews (a plan's library stays valid while it is the same: ``plan_support.in_use``)
_state: dict = {}
#: how this process gets its library: built at first use, or (a server) in the background, or (a worker) given
POLICY = BuildPolicy()


# the C functions' signatures, declared once: name -> (return type, argument types).  _P a pointer, _L a long,
# _I an int, _F a float; _ACT the fused activation's code and bounds
_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
_ACT = [_I, _F, _F]
_CONV = [_P] * 4 + [_L] * 15 + _ACT  # x, w, bias, y; n, c, h, w, ..., oh, ow; act, lo, hi
SIGNATURES: dict = {
    "rpcsrv_dwconv2d_f32": (_I, _CONV + [_L]),  # + the input shuffle (1: none)
    "rpcsrv_conv2d_rows_f32": (_I, _CONV),
    "rpcsrv_dwconv2d_chan_f32": (_I, _CONV + [_L]),
    **{name: (_I, [_P] * 2 + [_L] * 14) for name in ("rpcsrv_maxpool2d_f32", "rpcsrv_maxpool_rows_f32")},
    **{name: (_I, [_P] * 3 + [_L] * 14)
       for name in ("rpcsrv_avgpool2d_f32", "rpcsrv_avgpool_rows_f32", "rpcsrv_pool_chan_f32")},
    **{name: (_I, [_P] * 2 + [_L] * 8) for name in ("rpcsrv_wino_in_f32", "rpcsrv_wino4_in_f32")},
    **{name: (_I, [_P] * 3 + [_L] * 6 + _ACT) for name in ("rpcsrv_wino_out_f32", "rpcsrv_wino4_out_f32")},
    "rpcsrv_im2col_f32": (None, [_P] * 3),
    "rpcsrv_layernorm_f32": (None, [_P] * 4 + [_L] * 2 + [_F]),
    "rpcsrv_add_act_f32": (None, [_P] * 4 + [_L] * 2 + _ACT),
    "rpcsrv_rows_block": (_I, [_P] * 4),
    "rpcsrv_chan_block": (_I, [_P] * 4),
    "rpcsrv_pool_block": (_I, [_P] * 3),
    "rpcsrv_bias_act_block": (None, [_P] * 3),
    "rpcsrv_add_act_block": (None, [_P] * 5),
    "rpcsrv_row_mean_f32": (None, [_P] * 2 + [_L] * 2),
    "rpcsrv_softmax_f32": (None, [_P] * 2 + [_L] * 2),
    "rpcsrv_col_bias_act_f32": (None, [_P] * 2 + [_L] * 2 + _ACT),
    "rpcsrv_affine_clip_f32": (None, [_P] * 2 + [_L] + [_F] * 4),
    "rpcsrv_sigmoid_f32": (None, [_P, _P, _L, _I]),
    "rpcsrv_gelu_f32": (None, [_P, _P, _L]),
    "rpcsrv_bias_act_f32": (None, [_P] * 2 + [_L] * 3 + _ACT),
    "rpcsrv_gemm_mr": (_L, []),
    "rpcsrv_gemm_nr": (_L, []),
    "rpcsrv_gemm_pack_w": (None, [_P] * 2 + [_L] * 2),
    "rpcsrv_gemm_pack_b": (None, [_P] * 2 + [_L] * 2),
    "rpcsrv_gemm_f32": (_I, [_P] * 6 + [_L] * 3 + _ACT),
    "rpcsrv_gemm_block": (_I, [_P] * 6),
    "rpcsrv_matmul_f32": (_I, [_P] * 4 + [_L] * 3 + _ACT),
    "rpcsrv_matmul_block": (_I, [_P] * 4),
    "rpcsrv_gemm_band": (_I, [_P] * 2 + [_L] + [_P] * 2),  # (the im2col plan's bands)
    "rpcsrv_gemm_conv": (_I, [_P] * 5),
    # int8 (quant/qgemm.c, qconv.c, qops.c; their Python side is quant/qpack.py)
    "rpcsrv_qgemm_isa": (ctypes.c_char_p, []),
    "rpcsrv_qgemm_kernel_name": (ctypes.c_char_p, [_L, _P]),
    "rpcsrv_qgemm_select": (_L, [_L]),
    "rpcsrv_qgemm_packed_size": (_L, [_L, _L]),
    "rpcsrv_qgemm_pack": (None, [_P] + [_L] * 5 + [_P]),
    "rpcsrv_qgemm": (_I, [_P, _P] + [_L] * 4 + [_F, _P, _L]),
    "rpcsrv_qconv": (_I, [_P] * 4),
    "rpcsrv_qdwconv": (_I, [_P] * 4),
    "rpcsrv_q_nchw_to_nhwc": (None, [_P] + [_L] * 3 + [_P]),
    "rpcsrv_quantize_f32": (None, [_P] + [_L] * 3 + [_F] + [_L] * 4 + [_P]),
    "rpcsrv_dequantize_q8": (None, [_P] + [_L] * 4 + [_F, _L, _L, _P]),
    "rpcsrv_qadd": (None, [_P] * 3 + [_L] * 2 + [_F, _L, _F, _L, _F] + [_L] * 3),
    "rpcsrv_qgap": (None, [_P] + [_L] * 5 + [_F] + [_L] * 3 + [_P]),
    "rpcsrv_qmaxpool": (None, [_P] + [_L] * 5 + [_P] * 2),
    "rpcsrv_qlut": (None, [_P, _L, _L, _P, _P]),
    "rpcsrv_dynamic_quantize": (None, [_P, _L, _P, _P]),
    "rpcsrv_qchain": (_I, [_P, _L, _P, _P]),  # (quant/qchain.c: a run of int8 steps; the steps' own functions:)
    **{f"rpcsrv_qstep_{name}": (_I, [_P] * 4) for name in ("conv", "dwconv", "s2dconv", "add", "quantize", "gap",
                                                            "maxpool")},
    "rpcsrv_qconv_s2d": (_I, [_P] * 3),  # (quant/qconv_s2d.c: a stride-2 stem over its space-to-depth copy)
    "rpcsrv_qconv_in_place": (_L, [_L]),
}


def enabled() -> bool:
    """Whether the settings allow compiled kernels (``RPCSRV_COMPILED_KERNELS`` not 0/off/no/false)."""
    return environment.flag(ENV_SWITCH)


#: the CPU's feature line (the cache key's, and what a prebuilt variant needs): ``kcache.cpu_features``
_cpu_features = kcache.cpu_features


# --- where the library comes from: RPCSRV_KERNELS_LIB, the cache, built now, prebuilt in the wheel ---------
def prebuilt() -> list[tuple[str, Path, str]]:
    """The wheel's prebuilt libraries: ("<target>, <variant>", path, why not usable here or "" when it is),
    a target's variants (``kbuild.VARIANTS``) before its generic library."""
    from ....loader.machine import board, machine_of

    found, digest = [], None
    cpu = set(_cpu_features().decode(errors="replace").partition(":")[2].split())
    for path in sorted(PREBUILT.glob(f"*/{kbuild.LIBRARY}")):
        target = path.parent.name
        try:
            with open(path, "rb") as f:
                fits = board().runs(machine_of(f))
            stamp = (path.parent / kbuild.STAMP).read_text().strip()
        except (OSError, ValueError, RuntimeError) as exc:
            found.append((target, path, f"unreadable ({exc})"))
            continue
        digest = digest or kbuild.source_hash()
        why = "other machine" if not fits else "built from other sources (stale)" if stamp != digest else ""
        for name, _, needs in kbuild.VARIANTS.get(target, ()):
            variant = path.with_name(kbuild.variant_name(name))
            if variant.is_file():
                found.append((f"{target}, {name}", variant, why or (
                    f"the CPU lacks {' '.join(sorted(needs - cpu))}" if needs - cpu else "")))
        found.append((f"{target}, generic {' '.join(kbuild.GENERIC[0])}", path, why))
    return found


def _build() -> Path:
    """The library's path, first found of the four (the module docstring) as this process's :data:`POLICY`
    allows (a worker: the one its server gave; a server: never built here, its background build installs
    one); sets ``_state["origin"]``."""
    if POLICY.mode == "given":
        if not POLICY.given:
            raise OSError("the server had no compiled kernels when it started this process")
        _state["origin"] = "given by the server"
        return Path(POLICY.given)
    explicit = environment.text("RPCSRV_KERNELS_LIB")
    if explicit:
        if not os.path.isfile(explicit):
            raise OSError(f"RPCSRV_KERNELS_LIB={explicit} does not exist")
        _state["origin"] = "RPCSRV_KERNELS_LIB"
        return Path(explicit)
    target = kcache.cache_path(POLICY.settings.folder())
    if target.is_file():
        _state["origin"] = f"built for this CPU, cached in {target.parent}"
        return target
    tried = []
    if POLICY.builds_inline:
        try:  # (the compiler failed, or no cache to build into: a read-only home)
            path, _state["origin"] = kcache.build(POLICY.settings)
            return path
        except OSError as exc:
            tried.append(str(exc))
    elif POLICY.mode == "background":
        tried.append(POLICY.failure or ("not built for this CPU yet (being built in the background)"
                                        if POLICY.settings.build else "not built for this CPU (--build off)"))
    else:
        tried.append("not built for this CPU (building is turned off)")
    found = prebuilt()
    for name, path, why in found:
        if not why:
            _state["origin"] = f"prebuilt for {name}"
            return path
    tried.append("prebuilt in the package: " + (", ".join(f"{n}: {w}" for n, _, w in found) or "none"))
    raise OSError("; ".join(tried))
# --- end of where the library comes from ------------------------------------------------------------------


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def library() -> Optional[ctypes.CDLL]:
    """The compiled kernels, or None (then :func:`status` says why); found (or built) and loaded once per process,
    until a background build installs its own (:func:`install`)."""
    if not enabled():
        return None
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" not in _state:
            _state.setdefault("epoch", object())
            try:
                path = _build()
                _state.update(lib=_load(path), path=str(path), reason="")
            except (OSError, subprocess.SubprocessError, AttributeError) as exc:
                _state.update(lib=None, path=None, reason=str(exc))
    return _state["lib"]


def install(path: Path, origin: str) -> None:
    """From now on the library in use is ``path`` (a background build's, for this CPU): new plans and calls
    take it; plans made with the one before keep theirs (both stay loaded).  OSError when it does not load."""
    try:
        lib = _load(path)
    except AttributeError as exc:
        raise OSError(f"{path}: {exc}") from None
    with _lock:
        _state.setdefault("epoch", object())
        _state.update(lib=lib, path=str(path), reason="", origin=origin)


def in_use_path() -> Optional[str]:
    """The file of the library this process uses now (found, not built, when its policy says so), or None:
    what a native worker it starts is given (``rpcsrv.native.process.worker_config``)."""
    return _state.get("path") if library() is not None else None


def status() -> dict:
    """Whether the compiled kernels are in use, and why not: ``{"in_use": bool, "reason": str,
    "library": path or None, "origin": how it was found (RPCSRV_KERNELS_LIB, cached or built for this CPU,
    prebuilt for a target) or None}`` (builds them if need be, as the first depthwise conv would)."""
    if not enabled():
        return {"in_use": False, "reason": f"turned off by {ENV_SWITCH}={environment.text(ENV_SWITCH)}",
                "library": None, "origin": None}
    lib = library()
    return {"in_use": lib is not None, "reason": POLICY.failure or _state.get("reason", "") if lib is None else
            "compiled kernels in use (depthwise convolution, sigmoid, swish, conv epilogue, "
            "stem convolution, max and average pooling, winograd transforms)",
            "library": _state.get("path"), "origin": _state.get("origin") if lib is not None else None}


def report() -> dict:
    """The ``kernels`` section of ``rpcsrv check``: never a failure (numpy is the fallback every board
    has), but it says which path the board takes and why."""
    s = status()
    summary = (f"compiled kernels in use ({s['origin']}: {s['library']})" if s["in_use"]
               else f"numpy fallback (no compiled kernels: {s['reason']})")
    if POLICY.mode == "background" and not POLICY.idle.is_set():
        summary += "; this CPU's build is under way in the background"
    return {"ok": True, "required": False, "summary": summary, **s}


def reset() -> None:
    """Forget the loaded library and the reason (tests that change the environment); plans made before run
    their numpy kernels from now on."""
    with _lock:
        _state.clear()


#: depthwise convs whose padded input plane has at most this many positions run the channels-side-by-side
#: kernel (``dwchan.c``, VW channels interleaved in a scratch of that many vectors), others dwconv.c's
#: per-channel rows kernel.  Measured (bench/dwchan_bench.py, 1 thread, us, rows / chan, ReLU6): it wins on
#: every MobileNetV2/V3, EfficientNet-B0 and ShuffleNet layer, most at small maps and stride 2: 14x14x576 s1
#: 90 / 58, s2 96 / 26, 7x7x960 63 / 27, 7x7x1152 5x5 129 / 63, 28x28x192 s2 79 / 36; 56x56x144 249 / 192,
#: 112x112x32 213 / 156 (MobileNetV2's depthwise convs in all: 1908 / 1238).  Larger planes (a scratch
#: past the L2 cache) were not measured: rows.  0 turns it off (tests run both).
CHAN_MAX_PLANE = 130 * 130


def takes_chan(h, wd, kernel, strides, dilations, begin, out) -> bool:
    """Whether a 2-D depthwise conv of this geometry runs the channels-side-by-side kernel (``dwchan.c``:
    padded planes up to ``CHAN_MAX_PLANE`` positions, at least 8 inputs and 8 outputs per plane, no
    negative pads)."""
    ph = (out[0] - 1) * strides[0] + (kernel[0] - 1) * dilations[0] + 1
    pw = (out[1] - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1
    return ph * pw <= CHAN_MAX_PLANE and h * wd >= 8 and out[0] * out[1] >= 8 and min(begin) >= 0


#: fused activations the C kernel applies itself (others run after it, from the kernel table)
ACTIVATIONS = {"relu": 1, "clip": 2, "hard_swish": 3, "swish": 4}


def _activation(activation, attrs) -> tuple:
    """(code, low, high) of the C kernel for a fused activation; code 0: none, or applied afterwards."""
    code = ACTIVATIONS.get(activation, 0)
    if code == 2:  # clip: float bounds only (``min``/``max``, either may be absent)
        if not attrs or not set(attrs) <= {"min", "max"}:
            return 0, 0.0, 0.0
        try:
            lo, hi = float(attrs.get("min", float("-inf"))), float(attrs.get("max", float("inf")))
        except (TypeError, ValueError):
            return 0, 0.0, 0.0
        return code, lo, hi
    return (0 if attrs else code), 0.0, 0.0  # (swish: alpha 1 only, no attrs)


def fuses(activation, attrs) -> bool:
    """Whether the compiled depthwise kernel applies this fused activation itself."""
    return bool(_activation(activation, attrs)[0])


def depthwise_conv2d(x, w, bias, strides, dilations, begin, out, activation=None, activation_attrs=None,
                     lib=None):
    """Depthwise conv of float32 x (N, C, H, W) with w (C * mult, 1, KH, KW) by the compiled kernel, the
    bias and the activation included when the kernel has it (:func:`fuses`: relu, clip, hard_swish, swish;
    the caller applies any other): a fresh (N, C * mult, OH, OW) array, or None when the kernel is
    unavailable or does not take this case (then ``depthwise.py`` runs).  ``lib``: the library when the
    caller has it already."""
    lib = lib or library()
    if lib is None or x.dtype != np.float32 or x.ndim != 4 or w.dtype != np.float32:
        return None
    act, lo, hi = _activation(activation, activation_attrs)
    n, c, h, wd = x.shape
    m = w.shape[0]
    x = np.ascontiguousarray(x)
    w = np.ascontiguousarray(w)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    y = np.empty((n, m) + tuple(out), np.float32)
    if y.size == 0:
        return y
    chan = takes_chan(h, wd, w.shape[2:], strides, dilations, begin, out)
    fn = lib.rpcsrv_dwconv2d_chan_f32 if chan else lib.rpcsrv_dwconv2d_f32
    rc = fn(x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data,
            n, c, h, wd, m // c, w.shape[2], w.shape[3], strides[0], strides[1],
            dilations[0], dilations[1], begin[0], begin[1], out[0], out[1], act, lo, hi, 1)
    if rc != 0:
        raise MemoryError("depthwise conv: the compiled kernel could not allocate its scratch plane")
    return y


def sigmoid(x, times_x: bool = False, out=None):
    """sigmoid(x), or x * sigmoid(x) (SiLU) with ``times_x``, of float32 x in one pass (``sigmoid.c``): a
    fresh array (``out``: into x itself, C-contiguous), or None when the compiled kernels are unavailable
    or x is not float32."""
    if x.dtype != np.float32:
        return None
    lib = library()
    if lib is None:
        return None
    if out is not None:  # in place: one address (each ``.ctypes.data`` costs ~1 us)
        if out is not x or not x.flags.c_contiguous or not x.flags.writeable:
            return None
        address = x.ctypes.data
        lib.rpcsrv_sigmoid_f32(address, address, x.size, int(times_x))
        return x
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    lib.rpcsrv_sigmoid_f32(x.ctypes.data, y.ctypes.data, x.size, int(times_x))
    return y


def epilogue_library(y, activation, activation_attrs) -> Optional[ctypes.CDLL]:
    """The library when :func:`bias_activation` can finish float32 ``y`` with this activation (none, or one
    the C code has), else None (hand it to ``bias_activation``: one environment check per conv, not two)."""
    if y.dtype != np.float32:
        return None
    lib = library()
    if lib is None or not (activation is None and not activation_attrs or _activation(activation,
                                                                                     activation_attrs)[0]):
        return None
    return lib


def bias_activation(y, bias, activation=None, activation_attrs=None, lib=None):
    """``y`` (M, Q) float32, C-contiguous and writeable (a GEMM's fresh result) plus ``bias`` (M,) per row,
    through the fused activation, in place in one pass (``epilogue.c``); True when done, False when the C
    code cannot (no library, other dtype or layout: the caller's numpy epilogue runs).  ``lib``: the
    library, as ``epilogue_library`` gave it."""
    lib = lib or library()
    if lib is None or y.dtype != np.float32 or y.ndim != 2 or not y.flags.c_contiguous or not y.flags.writeable:
        return False
    act, lo, hi = _activation(activation, activation_attrs)
    if act == 0 and (activation is not None or activation_attrs):
        return False
    b = None
    if bias is not None:
        b = np.ascontiguousarray(bias, np.float32)
        if b.size != y.shape[0]:
            return False
    lib.rpcsrv_bias_act_f32(y.ctypes.data, None if b is None else b.ctypes.data, y.shape[0], y.shape[1],
                            y.shape[1], act, lo, hi)
    return True
