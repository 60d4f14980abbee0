"""Runs of int8 steps as one call (``qchain.c``): what a plan says of its step for that (:class:`Link`, made by
the plan's ``link``), and the program of a run (:class:`Chain`).

A planned int8 step costs a few microseconds of Python around its kernel (the step loop, the plan's checks, the
result's allocation, the ctypes call), and more inside a model run, where the interpreter's code and data are
cold: in MobileNetV2's 65 int8 steps, about a tenth of the run.  A run of consecutive int8 steps whose
intermediate results nobody else reads is one step instead (``examplejson/qchain_fold.py`` finds them): its
inputs are checked once, its intermediates live in one arena allocated per call (offsets planned once, a buffer
reused as soon as its last reader ran, as onnxruntime's memory patterns do), and ``rpcsrv_qchain`` calls each
step's kernel with the blocks its plan prepared, the same kernels with the same blocks, so the results are the
same integers.

A plan's ``link(layouts)`` (``layouts``: per tensor operand, ``"nhwc"`` for the channels-last view of an int8
plan's 4-D result, ``"c"`` for C-contiguous as declared) gives the :class:`Link` of its step for operands in those
layouts, or None when it takes no such operand in place.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

from ..plan_support import address, block
from .qpack import channels_last, data, nhwc_strides

#: a step's entries in the program (qchain.c: QS_*): function, block, operand a, operand b, result
QS_SIZE = 5
ALIGN = 64


@dataclasses.dataclass(frozen=True)
class Link:
    """One step as a run calls it: ``fn`` (a ``rpcsrv_qstep_*`` of ``qchain.c``) with the block at ``blk``, its
    tensor operands the node's inputs at ``operands`` (one or two), its result of the node's shape and dtype in
    layout ``out``."""

    fn: int
    blk: int
    operands: tuple
    out: str


def step_fn(lib, name: str) -> int:
    """The address of ``qchain.c``'s step function ``rpcsrv_qstep_<name>``."""
    return ctypes.cast(getattr(lib, f"rpcsrv_qstep_{name}"), ctypes.c_void_p).value


def f32_bits(x) -> int:
    """A float32's bit pattern as a block entry (``qchain.c`` reads it back)."""
    return int(np.asarray(x, np.float32).reshape(()).view(np.int32))


def long_block(values: Sequence[int]):
    """A step's block: (ctypes array, address)."""
    return block(ctypes.c_long, [int(v) for v in values])


def memory_shape(shape: tuple, layout: str) -> tuple:
    """The C-contiguous shape of a tensor of declared ``shape`` held in ``layout``."""
    return (shape[0], shape[2], shape[3], shape[1]) if layout == "nhwc" else tuple(shape)


def fits(x, shape: tuple, dtype: np.dtype, layout: str) -> bool:
    """Whether ``x`` is a tensor of ``shape`` and ``dtype`` in ``layout`` (its memory where a step reads it)."""
    if type(x) is not np.ndarray or x.shape != shape or x.dtype != dtype:
        return False
    if layout == "c":
        return x.flags.c_contiguous
    base = x.base
    return x.strides == nhwc_strides(shape, x.itemsize) and type(base) is np.ndarray and \
        base.shape == memory_shape(shape, "nhwc") and base.flags.c_contiguous


class Chain:
    """The program of one run: ``links`` in order, ``reads[k]``/``writes[k]``: the tensors (keys) step k reads and
    writes; ``inputs``: the keys of the run's inputs with their (shape, dtype, layout); ``out``: the key of its result,
    with ``shapes`` (key -> (shape, dtype, layout)) for every tensor.  The result has its own array, intermediates
    share an arena."""

    def __init__(self, lib, links: list[Link], reads: list[tuple], writes: list, inputs: list, out, shapes: dict):
        last: dict = {}
        for k, keys in enumerate(reads):
            for key in keys:
                last[key] = k
        offsets, size = _offsets(writes, last, out, {key: _nbytes(*shapes[key][:2]) for key in writes})
        where = dict(offsets)
        where.update({key: -1 - k for k, key in enumerate(inputs)})
        where[out] = -1 - len(inputs)
        prog = []
        for link, keys, key in zip(links, reads, writes):
            a = where[keys[0]]
            prog += [link.fn, link.blk, a, where[keys[1]] if len(keys) > 1 else a, where[key]]
        self._prog, self.prog_ptr = long_block(prog)
        self.steps, self.arena, self.inputs = len(links), size, [shapes[key] for key in inputs]
        shape, dtype, layout = shapes[out]
        self.out_shape, self.out_dtype, self.out_last = memory_shape(shape, layout), dtype, layout == "nhwc"
        self._ptrs = ctypes.c_void_p * (len(inputs) + 1)
        self._run = lib.rpcsrv_qchain

    def fits(self, xs: tuple) -> bool:
        return len(xs) == len(self.inputs) and all(fits(x, *spec) for x, spec in zip(xs, self.inputs))

    def __call__(self, *xs):
        """The run's result from its inputs (each as :meth:`fits` says)."""
        y = np.empty(self.out_shape, self.out_dtype)
        arena = np.empty(self.arena, np.uint8) if self.arena else None
        ptrs = self._ptrs(*[data(x) for x in xs], address(y))
        if self._run(self.prog_ptr, self.steps, 0 if arena is None else address(arena), ptrs) != 0:
            raise MemoryError("int8 run: a compiled kernel could not allocate its scratch")
        return channels_last(y) if self.out_last else y


def _nbytes(shape: tuple, dtype: np.dtype) -> int:
    return (int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + ALIGN - 1) // ALIGN * ALIGN


def _offsets(writes: list, last: dict, out, sizes: dict) -> tuple[dict, int]:
    """Arena offsets of the intermediates (first fit among the buffers freed so far; a buffer is free after the
    step that last reads it, not during it) and the arena's size."""
    free: list[list[int]] = []  # [offset, size], by offset
    live: dict = {}
    offsets, top = {}, 0
    for k, key in enumerate(writes):
        if key != out:
            need = sizes[key]
            for slot in free:
                if slot[1] >= need:
                    offsets[key] = slot[0]
                    slot[0] += need
                    slot[1] -= need
                    break
            else:
                offsets[key], top = top, top + need
            live[key] = need
        for done in [held for held in live if last.get(held, -1) <= k]:
            free.append([offsets[done], live.pop(done)])
        free = _merge([s for s in free if s[1] > 0])
    return offsets, top


def _merge(free: list) -> list:
    free.sort()
    merged: list = []
    for off, size in free:
        if merged and merged[-1][0] + merged[-1][1] == off:
            merged[-1][1] += size
        else:
            merged.append([off, size])
    return merged


LinkFn = Callable[[tuple], Optional[Link]]
