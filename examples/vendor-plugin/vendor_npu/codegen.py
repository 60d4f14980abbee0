"""The compiler side of vendor_npu: what ``byoc compile --codegen vendor_npu`` uses.

:data:`CODEGEN` is what the entry point ``byoc.codegens: vendor_npu`` names.  It declares

* the op set, in rpcsrv's op vocabulary: ``conv``, ``relu``, ``add``, ``max_pool``, ``gemm``,
  ``flatten`` and ``reshape`` (the byoc partitioner checks each op's attributes against rpcsrv's op
  catalogue first; :meth:`VendorNPUCodegen.check` then refuses what this accelerator lacks: float32
  only, 2-D convolutions and pools without dilation, Gemm without scaling or transposed inputs);
* the composite patterns (TVM's ``MergeComposite``): Conv → Relu, Gemm → Relu and Add → Relu become
  one op record with the relu flag;
* ``generate``: one partitioned region → one program (``program.py``), the weights in its constant
  pool (a Gemm's weights transposed to K x N here, once, as a vendor's compiler lays out weights for
  its hardware), under the type key ``vendor_npu``.

What the accelerator refuses, byoc leaves to the board's CPU as host C functions.
"""

from __future__ import annotations

import numpy as np

from rpcsrv.client.compiler.codegens import Codegen, External, Pattern
from rpcsrv.client.compiler.onnx_import import Graph
from rpcsrv.client.compiler.partition import Function, Op

from . import TYPE_KEY
from .program import ALIGN, MAX_RANK, Program, Payload
from .runtime import KIND, VendorProgramModule

#: the board's op name -> this accelerator's opcode
OPCODE = {"conv": "conv2d", "relu": "relu", "add": "add", "max_pool": "maxpool", "gemm": "dense",
          "flatten": "reshape", "reshape": "reshape"}


def _ints(value, n: int, default: int) -> list[int]:
    return [int(v) for v in value] if value else [default] * n


class VendorNPUCodegen(Codegen):
    name = TYPE_KEY
    ops = frozenset(OPCODE)
    codec = KIND.codec  # byoc writes the program with the payload declaration the board reads
    patterns = (
        Pattern(f"{TYPE_KEY}.conv2d_relu", ("Conv", "Relu"), attrs={"activation": "relu"}),
        Pattern(f"{TYPE_KEY}.dense_relu", ("Gemm", "Relu"), attrs={"activation": "relu"}),
        Pattern(f"{TYPE_KEY}.add_relu", ("Add", "Relu"), attrs={"activation": "relu"}),
    )

    def check(self, op: Op, graph: Graph) -> str:
        tensors = [graph.tensors.get(t) for t in op.inputs + op.outputs if t]
        if any(t is None or t.dtype != "float32" or not 1 <= len(t.shape) <= MAX_RANK for t in tensors):
            return "vendor_npu runs float32 tensors of rank 1-4 only"
        a = op.attrs
        if op.kernel in ("conv", "max_pool"):
            if len(graph.tensors[op.inputs[0]].shape) != 4 or a.get("auto_pad", "NOTSET") != "NOTSET":
                return "vendor_npu: 2-D only, explicit pads"
            if any(d != 1 for d in a.get("dilations") or []) or a.get("ceil_mode", 0) or a.get("storage_order", 0):
                return "vendor_npu: no dilation, ceil_mode or storage_order"
            if op.kernel == "max_pool" and len([o for o in op.outputs if o]) > 1:
                return "vendor_npu: no MaxPool indices"
        if op.kernel == "gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 \
                    or op.inputs[1] not in graph.constants:
                return "vendor_npu: dense needs constant weights, no transA, alpha or beta"
        if op.kernel in ("flatten", "reshape") and op.inputs[0] not in graph.tensors:
            return "vendor_npu: unknown input shape"
        return ""

    def generate(self, fn: Function, graph: Graph) -> External:
        tensors: list[dict] = []
        ids: dict[str, int] = {}
        pool = bytearray()

        def tensor(name: str, kind: str, data: np.ndarray | None = None) -> int:
            shape = graph.tensors[name].shape if data is None else data.shape
            offset = 0
            if data is not None:
                pool.extend(b"\0" * (-len(pool) % ALIGN))
                offset = len(pool)
                pool.extend(np.ascontiguousarray(data, np.float32).tobytes())
            tensors.append(dict(kind=kind, dtype="float32", rank=len(shape),
                                shape=list(shape) + [0] * (MAX_RANK - len(shape)), offset=offset))
            ids[name] = len(tensors) - 1
            return ids[name]

        for name in fn.inputs:
            tensor(name, "input")
        records = []
        for op in fn.ops:
            ins = []
            for k, name in enumerate(op.inputs):
                if not name or (op.kernel in ("reshape",) and k > 0):
                    continue  # a Reshape's target shape is the output's shape
                if name not in ids:
                    value = graph.constants[name]
                    if op.kernel == "gemm" and k == 1 and op.attrs.get("transB", 0):
                        value = value.T  # stored K x N
                    tensor(name, "const", value)
                ins.append(ids[name])
            out = tensor(op.outputs[0], "temp")
            records.append(dict(opcode=OPCODE[op.kernel], inputs=(ins + [-1, -1, -1])[:3], output=out,
                                flags=dict(relu=op.kernel == "relu" or op.attrs.get("activation") == "relu",
                                           bias=len(ins) > 2),
                                params=self._params(op, graph)))
        program = dict(symbol=fn.symbol, num_inputs=len(fn.inputs), num_outputs=len(fn.outputs),
                       tensors=tensors, ops=records, inputs=[ids[t] for t in fn.inputs],
                       outputs=[ids[t] for t in fn.outputs], pool=bytes(pool))
        value = Payload.parse(Payload.build(program))  # the same object the board decodes
        return External(VendorProgramModule(value), {}, listing(value, Program.build(program)))

    @staticmethod
    def _params(op: Op, graph: Graph) -> list[int]:
        if op.kernel not in ("conv", "max_pool"):
            return [0] * 10
        a = op.attrs
        strides, pads = _ints(a.get("strides"), 2, 1), _ints(a.get("pads"), 4, 0)
        kernel = _ints(a.get("kernel_shape"), 2, 0) if op.kernel == "max_pool" else [0, 0]
        return strides + [pads[0], pads[1], pads[2], pads[3]] + kernel + [int(a.get("group", 1)), 0]


def listing(value, raw: bytes) -> str:
    """A program as text, for ``byoc compile -v``."""
    lines = [f"vendor_npu program {value.symbol}: {len(raw)} bytes, {len(value.tensors)} tensors, "
             f"{len(value.ops)} ops, {len(value.pool)} bytes of constants"]
    for k, t in enumerate(value.tensors):
        lines.append(f"  t{k}: {t.kind} {list(t.shape[:t.rank])}" + (f" @ {t.offset}" if t.kind == "const" else ""))
    for op in value.ops:
        flags = "+relu" if op.flags.relu else ""
        lines.append(f"  {op.opcode}{flags} {[f't{i}' for i in op.inputs if i != -1]} -> t{op.output} "
                     f"params {list(op.params)}")
    return "\n".join(lines) + "\n"


CODEGEN = VendorNPUCodegen()
