"""The board side of vendor_npu: decode a program, check it, run it with numpy.

:data:`PLUGIN` is what the entry point ``rpcsrv.runtimes: vendor_npu`` names.  For the type key
``vendor_npu`` it gives rpcsrv

* the payload codec: ``program.Payload`` → :class:`VendorProgramModule` (checked: tensor ids, ranks,
  constants inside the pool) and back;
* the runtime factory: :class:`VendorNPURuntime`, one packed function named by the program's symbol,
  called as TVM calls an external function: the inputs, then the outputs, written in place;
* what ``rpcsrv inspect`` prints: the symbol, the tensors, the op records.

On a real board the runtime would hand the program to the vendor's driver; here each op record is a
small numpy function (:data:`KERNELS`; the int8 convolution, ``qconv2d``, is :func:`qconv2d`: integer
accumulation, then the requantize the program's per-channel table says).  Nothing of rpcsrv's own
kernels is used.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rpcsrv.executor import ExecutorError, RuntimeModule
from rpcsrv.loader.node import ModuleNode, PayloadCodec
from rpcsrv.loader.plugins import ModuleKind, RuntimePlugin

from . import TYPE_KEY
from .program import MAX_RANK, ZP_BIAS, Payload


@dataclass(eq=False, repr=False)
class VendorProgramModule(ModuleNode):
    """A decoded vendor_npu program (the construct value of ``program.Program``)."""

    program: Any = None
    type_key: str = field(default=TYPE_KEY, kw_only=True)


def tensor_shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape[:t.rank])


def tensor_dtype(t) -> np.dtype:
    return np.dtype(str(t.dtype))


def constant(program, t) -> np.ndarray:
    """A const tensor of ``program`` as a read-only view of its pool."""
    count = int(np.prod(tensor_shape(t), dtype=np.int64))
    return np.frombuffer(program.pool, tensor_dtype(t), count, t.offset).reshape(tensor_shape(t))


def _decode(value, key: str) -> VendorProgramModule:
    n = len(value.tensors)
    for k, t in enumerate(value.tensors):
        if not 1 <= t.rank <= MAX_RANK:
            raise ValueError(f"tensor {k}: rank {t.rank} (1-{MAX_RANK})")
        if not isinstance(t.dtype, str):
            raise ValueError(f"tensor {k}: unknown dtype {int(t.dtype)}")
        if t.kind == "const":
            size = tensor_dtype(t).itemsize
            nbytes = size * int(np.prod(tensor_shape(t), dtype=np.int64))
            if t.offset % size or t.offset + nbytes > len(value.pool):
                raise ValueError(f"tensor {k}: constant of {nbytes} bytes at {t.offset} is outside the "
                                 f"{len(value.pool)}-byte pool")
    for k, op in enumerate(value.ops):
        if not isinstance(op.opcode, str):
            raise ValueError(f"op {k}: unknown opcode {int(op.opcode)}")
        ids = [i for i in op.inputs if i != -1] + [op.output]
        if any(not 0 <= i < n for i in ids):
            raise ValueError(f"op {k} ({op.opcode}): tensor id out of range (the program has {n} tensors)")
    for i in list(value.inputs) + list(value.outputs):
        if not 0 <= i < n:
            raise ValueError(f"input/output tensor id {i} out of range (the program has {n} tensors)")
    return VendorProgramModule(value, type_key=key)


def _encode(node: VendorProgramModule):
    return node.program


# ------------------------------------------------------------------------------------- the kernels

def _pad(x: np.ndarray, p, value: float) -> np.ndarray:
    top, left, bottom, right = p[2], p[3], p[4], p[5]
    if not (top or left or bottom or right):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def conv2d(x, w, b, p):
    """NCHW conv, OIHW weights, ``p``: strides (0, 1), pads (2-5), groups (8)."""
    sh, sw, groups = p[0], p[1], max(p[8], 1)
    x = _pad(x, p, 0.0)
    kh, kw = w.shape[2], w.shape[3]
    win = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]  # N C OH OW KH KW
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    outs = [np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og], optimize=True)
            for g in range(groups)]
    y = outs[0] if groups == 1 else np.concatenate(outs, axis=1)
    return y + b.reshape(1, -1, 1, 1) if b is not None else y


def maxpool(x, _unused, _b, p):
    win = sliding_window_view(_pad(x, p, -np.inf), (p[6], p[7]), axis=(2, 3))[:, :, ::p[0], ::p[1]]
    return win.max(axis=(4, 5))


def qconv2d(x, w, chan, p, relu: bool, dtype: np.dtype):
    """The int8 convolution: ``x`` int8/uint8 NCHW, ``w`` int8 OIHW (zero point 0), ``chan`` int32 (M, 2): the bias
    with x's zero point folded in, the float32 multiplier's bits; ``p``: strides, pads, zero points + 128, groups."""
    x_zp, y_zp = p[6] - ZP_BIAS, p[7] - ZP_BIAS
    padded = _pad(x.astype(np.int64), p, x_zp)  # padding holds the zero point: a real 0
    acc = conv2d(padded, w.astype(np.int64), None, [p[0], p[1], 0, 0, 0, 0, 0, 0, p[8]])
    acc = (acc + chan[:, 0].reshape(1, -1, 1, 1)).astype(np.int32)
    mult = np.ascontiguousarray(chan[:, 1]).view(np.float32).reshape(1, -1, 1, 1)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    q = np.rint(acc.astype(np.float32) * mult) + y_zp
    return np.clip(q, max(lo, y_zp) if relu else lo, hi)


#: opcodes whose kernel saturates to its output's type itself (and reads the relu flag)
INTEGER = {"qconv2d": qconv2d}

KERNELS = {
    "conv2d": conv2d,
    "maxpool": maxpool,
    "add": lambda a, b, _c, _p: a + b,
    "relu": lambda x, _b, _c, _p: x,  # the relu flag does the work
    "dense": lambda x, w, b, _p: x @ w + (b if b is not None else 0),  # weights stored K x N by the codegen
    "reshape": lambda x, _b, _c, _p: x,  # the output's shape does the work
}


class VendorNPURuntime(RuntimeModule):
    """One program: the packed function ``symbol(*inputs, *outputs)``."""

    type_key = TYPE_KEY

    def __init__(self, program, imports=None):
        super().__init__(imports)
        self.program = program
        self.symbol = program.symbol
        self.tensors = list(program.tensors)
        self.shapes = [tensor_shape(t) for t in self.tensors]
        self.consts = {k: constant(program, t) for k, t in enumerate(self.tensors) if t.kind == "const"}
        for k, op in enumerate(program.ops):  # what can be checked before data arrives is checked now
            if op.opcode not in KERNELS and op.opcode not in INTEGER:
                raise ExecutorError(f"vendor_npu {self.symbol}: op {k} has opcode {op.opcode}, which this "
                                    f"runtime does not run")

    def get_function(self, name: str):
        return self.run if name == self.symbol else None

    def run(self, *args) -> None:
        ins, outs = list(self.program.inputs), list(self.program.outputs)
        if len(args) != len(ins) + len(outs):
            raise ExecutorError(f"{self.symbol} takes {len(ins)} input(s) and {len(outs)} output(s), got "
                                f"{len(args)} arguments")
        values = dict(self.consts)
        for tid, arr in zip(ins + outs, args):
            want = tensor_dtype(self.tensors[tid])
            if not isinstance(arr, np.ndarray) or arr.shape != self.shapes[tid] or arr.dtype != want:
                raise ExecutorError(f"{self.symbol}: tensor {tid} must be {want} {list(self.shapes[tid])}, got "
                                    f"{getattr(arr, 'dtype', type(arr).__name__)} {list(getattr(arr, 'shape', []))}")
        values.update(zip(ins, args[:len(ins)]))
        for k, op in enumerate(self.program.ops):
            a, b, c = (values[i] if i != -1 else None for i in op.inputs)
            dtype = tensor_dtype(self.tensors[op.output])
            try:
                if op.opcode in INTEGER:
                    y = INTEGER[op.opcode](a, b, c, op.params, bool(op.flags.relu), dtype)
                else:
                    y = KERNELS[op.opcode](a, b, c, op.params)
                    y = np.maximum(y, 0) if op.flags.relu else y
                values[op.output] = np.asarray(y).astype(dtype).reshape(self.shapes[op.output])
            except (ValueError, IndexError, TypeError) as exc:
                raise ExecutorError(f"vendor_npu {self.symbol}: op {k} ({op.opcode}) failed: {exc}") from exc
        for tid, out in zip(outs, args[len(ins):]):
            np.copyto(out, values[tid])


# ------------------------------------------------------------------------------------ for inspect

def summarize(node: VendorProgramModule) -> dict:
    p = node.program
    return {"vendor_npu": {
        "symbol": p.symbol, "pool_bytes": len(p.pool),
        "tensors": [{"id": k, "kind": str(t.kind), "dtype": str(t.dtype), "shape": list(tensor_shape(t))}
                    for k, t in enumerate(p.tensors)],
        "ops": [{"opcode": str(op.opcode), "relu": bool(op.flags.relu),
                 "inputs": [int(i) for i in op.inputs if i != -1], "output": int(op.output)} for op in p.ops]}}


def format_lines(head: str, info: dict) -> list[str]:
    v = info["vendor_npu"]
    counts = Counter(op["opcode"] + ("+relu" if op["relu"] else "") for op in v["ops"])
    out = [f"{head}: vendor_npu program {v['symbol']}: {len(v['ops'])} op(s) "
           f"({', '.join(f'{k} x{n}' for k, n in counts.items())}), {len(v['tensors'])} tensors, "
           f"{v['pool_bytes']} bytes of constants"]
    out += [f"  op {k}: {op['opcode']}{'+relu' if op['relu'] else ''} {op['inputs']} -> {op['output']}"
            for k, op in enumerate(v["ops"])]
    return out


KIND = ModuleKind(
    type_keys=(TYPE_KEY,),
    codec=PayloadCodec(Payload, _decode, _encode),
    runtime=lambda node, imports, _options: VendorNPURuntime(node.program, imports),
    summarize=summarize,
    format=format_lines,
    functions=lambda node: [node.program.symbol],
    label="vendor_npu program",
)

PLUGIN = RuntimePlugin("vendor_npu", (KIND,), "the vendor_npu example accelerator (numpy)")
