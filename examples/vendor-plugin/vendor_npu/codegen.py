"""The compiler side of vendor_npu: what ``byoc compile --codegen vendor_npu`` uses.

:data:`CODEGEN` is what the entry point ``byoc.codegens: vendor_npu`` names.  It declares

* the op set, in rpcsrv's op vocabulary: ``conv``, ``relu``, ``add``, ``max_pool``, ``gemm``,
  ``flatten`` and ``reshape``, and the int8 convolution ``q_linear_conv`` (what byoc folds a quantized
  model's DQ -> Conv -> Q chains into; the byoc partitioner checks each op's attributes against rpcsrv's
  op catalogue first; :meth:`VendorNPUCodegen.check` then refuses what this accelerator lacks: float32
  only but for the int8 conv, 2-D convolutions and pools without dilation, Gemm without scaling or
  transposed inputs; int8 convs with per-tensor activations, symmetric weights and no activation but
  relu);
* the composite patterns (TVM's ``MergeComposite``): Conv → Relu, Gemm → Relu and Add → Relu become
  one op record with the relu flag;
* ``generate``: one partitioned region → one program (``program.py``), the weights in its constant
  pool (a Gemm's weights transposed to K x N here, once, as a vendor's compiler lays out weights for
  its hardware), under the type key ``vendor_npu``.  An int8 conv's quantization parameters arrive as
  ``op.quant`` (role -> ``QuantParams``: ``x``, ``w``, ``y``); they become its record's zero points and
  its per-channel table (the input zero point folded into the bias, the requantize multiplier).

What the accelerator refuses, byoc leaves to the board's CPU as host C functions.
"""

from __future__ import annotations

import numpy as np

from rpcsrv.client.compiler.codegens import Codegen, External, Pattern
from rpcsrv.client.compiler.onnx_import import Graph
from rpcsrv.client.compiler.partition import Function, Op

from . import TYPE_KEY
from rpcsrv.loader.opset.quant import multiplier

from .program import ALIGN, MAX_RANK, ZP_BIAS, Program, Payload
from .runtime import KIND, VendorProgramModule

#: the board's op name -> this accelerator's opcode
OPCODE = {"conv": "conv2d", "relu": "relu", "add": "add", "max_pool": "maxpool", "gemm": "dense",
          "flatten": "reshape", "reshape": "reshape", "q_linear_conv": "qconv2d"}


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
        if op.kernel == "q_linear_conv":
            return self._check_int8(op, graph)
        tensors = [graph.tensors.get(t) for t in op.inputs + op.outputs if t]
        if any(t is None or t.dtype != "float32" or not 1 <= len(t.shape) <= MAX_RANK for t in tensors):
            return "vendor_npu runs float32 tensors of rank 1-4 only (and int8 convolutions)"
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

    @staticmethod
    def _check_int8(op: Op, graph: Graph) -> str:
        q, a = op.quant, op.attrs
        if set(q) != {"x", "w", "y"} or op.inputs[3] not in graph.constants:
            return "vendor_npu: an int8 conv needs constant weights, scales and zero points"
        if q["x"].per_channel or q["y"].per_channel or np.any(q["w"].zero_point) or q["w"].dtype != np.int8:
            return "vendor_npu: int8 convs take per-tensor activations and int8 weights with zero point 0"
        if a.get("activation") not in (None, "relu"):
            return "vendor_npu: an int8 conv fuses relu only"
        if len(graph.tensors[op.inputs[0]].shape) != 4 or a.get("auto_pad", "NOTSET") != "NOTSET" or \
                any(d != 1 for d in a.get("dilations") or []):
            return "vendor_npu: 2-D int8 convs, explicit pads, no dilation"
        return ""

    def generate(self, fn: Function, graph: Graph) -> External:
        tensors: list[dict] = []
        ids: dict[str, int] = {}
        pool = bytearray()

        def tensor(name: str, kind: str, data: np.ndarray | None = None) -> int:
            shape = graph.tensors[name].shape if data is None else data.shape
            dtype = graph.tensors[name].dtype if data is None else data.dtype.name
            offset = 0
            if data is not None:
                pool.extend(b"\0" * (-len(pool) % ALIGN))
                offset = len(pool)
                pool.extend(np.ascontiguousarray(data).tobytes())
            tensors.append(dict(kind=kind, dtype=dtype, rank=len(shape),
                                shape=list(shape) + [0] * (MAX_RANK - len(shape)), offset=offset))
            ids[name] = len(tensors) - 1
            return ids[name]

        for name in fn.inputs:
            tensor(name, "input")
        records = []
        for op in fn.ops:
            if op.kernel == "q_linear_conv":
                records.append(self._qconv(op, graph, ids, tensor))
                continue
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

    def _qconv(self, op: Op, graph: Graph, ids: dict, tensor) -> dict:
        """The int8 conv's record: data, weights, and the per-channel table (bias with x's zero point folded
        in, the float32 multiplier's bits), from ``op.quant``."""
        q = op.quant
        w = np.asarray(graph.constants[op.inputs[3]])
        x_zp, y_zp = int(q["x"].zero_point), int(q["y"].zero_point)
        bias = np.asarray(graph.constants[op.inputs[8]], np.int64) if len(op.inputs) > 8 and op.inputs[8] \
            else np.zeros(w.shape[0], np.int64)
        folded = bias - x_zp * w.reshape(w.shape[0], -1).astype(np.int64).sum(axis=1)
        mult = np.broadcast_to(multiplier(q["x"].scale, q["w"].scale, q["y"].scale), (w.shape[0],))
        chan = np.stack([folded.astype(np.int32), np.ascontiguousarray(mult, np.float32).view(np.int32)], axis=1)
        ins = [ids[op.inputs[0]], tensor(op.inputs[3], "const", w), tensor(f"{op.name}__chan", "const", chan)]
        params = self._params(op, graph)[:6] + [x_zp + ZP_BIAS, y_zp + ZP_BIAS, int(op.attrs.get("group", 1)), 0]
        return dict(opcode="qconv2d", inputs=ins, output=tensor(op.outputs[0], "temp"),
                    flags=dict(relu=op.attrs.get("activation") == "relu", bias=True), params=params)

    @staticmethod
    def _params(op: Op, graph: Graph) -> list[int]:
        if op.kernel not in ("conv", "max_pool", "q_linear_conv"):
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
        at = f" @ {t.offset}" if t.kind == "const" else ""
        lines.append(f"  t{k}: {t.kind} {t.dtype} {list(t.shape[:t.rank])}{at}")
    for op in value.ops:
        flags = "+relu" if op.flags.relu else ""
        lines.append(f"  {op.opcode}{flags} {[f't{i}' for i in op.inputs if i != -1]} -> t{op.output} "
                     f"params {list(op.params)}")
    return "\n".join(lines) + "\n"


CODEGEN = VendorNPUCodegen()
