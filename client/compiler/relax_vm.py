"""``byoc compile --executor relax``: the compiled graph as a Relax VM executable (tvm-ffi layout).

For TVM >= 0.21 clients (``relax.VirtualMachine(remote.load_module(...), remote.cpu())``) the
graph executor is gone; the same partitioned model is written as the bytecode Relax would produce
for it: ``main`` checks each input's rank, dtype and shape (with TVM's error-context strings),
allocates each external function's outputs in its own pooled storage, calls the ExampleJSON
subgraph by its symbol in destination-passing style (inputs, then outputs), drops intermediates
after their last use so the VM's pool recycles their buffers, and returns the output (a tuple for
several).  Graph params become constants of the executable.  The module tree is
``relax.VMExecutable -> const_loader (when a subgraph has constants) -> examplejson...``, so the VM
finds every subgraph through its imports, as TVM's VM finds an external codegen's functions.
"""

from __future__ import annotations

import json
import math

import numpy as np

from rpcsrv.loader.vm_assembler import Assembler
from rpcsrv.loader.vm_executable import ShapeTuple, VMExecutableModule
from rpcsrv.protocol.dtypes import DataType

from .errors import CompileError


def _annotation(shape, dtype: str) -> str:
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    return f'R.Tensor(({dims}), dtype="{dtype}")'


def vm_executable(compiled) -> VMExecutableModule:
    """The Relax VM executable of a ``CompiledModel`` (its graph JSON, params and subgraphs)."""
    g = json.loads(compiled.graph_json)
    nodes, row_ptr = g["nodes"], g["node_row_ptr"]
    shapes, dtypes = g["attrs"]["shape"][1], g["attrs"]["dltype"][1]
    asm = Assembler()
    f = asm.function("main", list(compiled.input_names))
    value: dict[int, int] = {}  # graph entry -> argument word (register or constant)
    temp: dict[int, int] = {}  # graph entry -> register of an op's output (freed after its last use)
    last_use: dict[int, int] = {}
    for nid, node in enumerate(nodes):
        for src, idx, *_ in node.get("inputs", []):
            last_use[row_ptr[src] + idx] = nid
    outputs = [row_ptr[h[0]] + h[1] for h in g["heads"]]
    for nid, node in enumerate(nodes):
        eid, name = row_ptr[nid], node["name"]
        if node["op"] == "null":
            if name in compiled.input_names:
                i = compiled.input_names.index(name)
                shape, dtype = shapes[eid], dtypes[eid]
                ctx = asm.const(f"ErrorContext(fn=main, loc=param[{i}], param={name}, "
                                f"annotation={_annotation(shape, dtype)}) ")
                f.call("vm.builtin.check_tensor_info", f.asm.reg(i), asm.imm(len(shape)),
                       asm.const(DataType.parse(dtype)), ctx)
                codes = [w for d in shape for w in (asm.imm(0), asm.imm(int(d)))]
                f.call("vm.builtin.match_shape", asm.reg(i), Assembler.VOID, asm.imm(len(shape)), *codes, ctx)
                value[eid] = asm.reg(i)
            elif name in compiled.params:
                value[eid] = asm.const(np.asarray(compiled.params[name]))
            else:
                raise CompileError(f"graph input {name!r} is neither a model input nor a param")
            continue
        if node["op"] != "tvm_op" or node.get("attrs", {}).get("func_name") in (None, "__nop", "__copy"):
            raise CompileError(f"graph node {name!r} ({node['op']}) has no Relax VM equivalent here")
        args = [value[row_ptr[src] + idx] for src, idx, *_ in node["inputs"]]
        outs = []
        for k in range(int(node.get("attrs", {}).get("num_outputs", 1))):
            shape, dtype = shapes[eid + k], DataType.parse(dtypes[eid + k])
            storage, tensor = f.new_reg(), f.new_reg()
            f.call("vm.builtin.alloc_storage", Assembler.VM, asm.const(ShapeTuple([math.prod(shape) * dtype.itemsize])),
                   asm.imm(0), asm.const(DataType.parse("uint8")), asm.const("global"), dst=storage)
            f.call("vm.builtin.alloc_tensor", asm.reg(storage), asm.imm(0), asm.const(ShapeTuple(shape)),
                   asm.const(dtype), dst=tensor)
            f.call("vm.builtin.null_value", dst=storage)
            value[eid + k] = asm.reg(tensor)
            temp[eid + k] = tensor
            outs.append(asm.reg(tensor))
        f.call(node["attrs"]["func_name"], *args, *outs)
        for e in {row_ptr[src] + idx for src, idx, *_ in node["inputs"]}:
            if last_use.get(e) == nid and e in temp and e not in outputs:
                f.call("vm.builtin.null_value", dst=temp.pop(e))  # its buffer goes back to the pool
    results = []
    for e in outputs:
        if e not in temp:  # an input or a param returned as is: a register of its own
            temp[e] = f.call("vm.builtin.copy", value[e], dst=f.new_reg())
        results.append(temp[e])
    if len(results) == 1:
        f.ret(results[0])
    else:
        out = f.new_reg()
        f.call("vm.builtin.make_tuple", *[asm.reg(r) for r in results], dst=out)
        f.ret(out)
    f.end()
    return asm.build()


def relax_module_tree(compiled) -> VMExecutableModule:
    """``relax.VMExecutable -> const_loader (if needed) -> examplejson...`` for a compiled model."""
    exe = vm_executable(compiled)
    exe.imports = compiled.external_modules()
    return exe
