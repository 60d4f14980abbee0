"""``compile_onnx``: ONNX model → partitioned BYOC library contents, ready to export.

The result, :class:`CompiledModel`, holds what TVM's ``relay.build`` with a BYOC codegen produces
(``codegens.py``; ExampleJSON by default): the graph JSON, the params, one module per external
function (the codegen's payload under its type key) and the constants those functions need (the
const loader's arrays, listed per symbol).  ``module_tree()``
lays them out as TVM does, ``export_library()`` writes the file.  A const loader is written only when
some function takes constants from one (TVM's build adds an empty one too; it would bind nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rpcsrv.loader import ConstLoaderModule, GraphExecutorFactoryModule, HostLibraryModule, ModuleNode
from rpcsrv.loader.node import PAYLOADS
from rpcsrv.loader.opset import OPS, onnx_op_to_kernel
from rpcsrv.loader.plugins import add_codec

from .codegen import graph_json
from .codegens import Codegen, External, get_codegen
from .hostgen import host_reason, host_source
from .errors import CompileError, UnsupportedNodesError
from .onnx_import import Graph, import_onnx
from .partition import Op, Partition, partition
from .quantize import OP_DOMAINS, quantize_graph, with_int8_forms
from .simplify import remove_noops, simplify_inference


@dataclass
class Subgraph:
    """One external function: its symbol, its text form (the ExampleJSON text; a codegen's listing),
    constants (name → array, for the const loader) and its module (the loader node the codegen made);
    ``weights``: the model's constant tensors it reads (ONNX name → array), which the const loader or
    the module itself carries."""

    symbol: str
    code: str
    constants: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]
    ops: list[str]  # kernel names, in order
    patterns: list[str]  # composite patterns used ("" entries omitted)
    node: ModuleNode | None = None
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def constants_line(self) -> str:
        """``N constant(s) (B bytes)``, and where they are: the const loader's or the module's own."""
        if self.constants:
            return (f"{len(self.constants)} constant(s) ({sum(a.nbytes for a in self.constants.values())} bytes, "
                    f"in the const loader)")
        if self.weights:
            key = self.node.type_key if self.node is not None else "its"
            return (f"{len(self.weights)} constant(s) ({sum(a.nbytes for a in self.weights.values())} bytes, "
                    f"in the {key} module)")
        return "0 constant(s)"


@dataclass
class CompiledModel:
    """A compiled model: graph JSON + params + the codegen's external functions."""

    graph_json: str
    params: dict[str, np.ndarray]
    subgraphs: list[Subgraph]
    input_names: list[str]
    output_names: list[str]
    module_name: str = "default"
    graph: Graph | None = field(default=None, repr=False)
    host_code: str = ""  # C source of the host functions (partial offload), compiled into the .so
    host_functions: list[str] = field(default_factory=list)  # their symbols, in execution order
    codegen: str = "examplejson"
    codegen_title: str = "ExampleJSON"  # how messages name the codegen

    def external_modules(self) -> list[ModuleNode]:
        """What the host library (or the Relax VM executable) imports: a const loader importing the
        codegen's modules when some function takes constants from it, else those modules themselves."""
        externals = [sg.node for sg in self.subgraphs]
        if not any(sg.constants for sg in self.subgraphs):
            return externals
        arrays = {name: arr for sg in self.subgraphs for name, arr in sg.constants.items()}
        return [ConstLoaderModule(arrays, {sg.symbol: list(sg.constants) for sg in self.subgraphs},
                                  imports=externals)]

    def module_tree(self) -> GraphExecutorFactoryModule:
        """TVM's module tree: factory → host library → const loader (if needed) → the codegen's modules."""
        host = HostLibraryModule([], imports=self.external_modules())
        return GraphExecutorFactoryModule(self.graph_json, dict(self.params), self.module_name,
                                          imports=[host])

    def export_library(self, path, fmt: str | None = None, layout: str = "classic",
                       cc: str | None = None, executor: str = "graph") -> str:
        """Write the library (``.so``/``.tar``/raw blob, see ``rpcsrv.client.export``); returns the path.

        ``executor="relax"``: a Relax VM executable (TVM >= 0.21 clients), always the tvm-ffi layout."""
        from ..export import export_library

        if executor == "relax":
            from .relax_vm import relax_module_tree

            return export_library(relax_module_tree(self), path, fmt=fmt, layout="ffi", cc=cc)
        return export_library(self.module_tree(), path, fmt=fmt, layout=layout, cc=cc, host_source=self.host_code)

    def summary(self) -> str:
        """Human-readable: the subgraphs, their ops and constants."""
        lines = [f"{len(self.subgraphs)} {self.codegen_title} subgraph(s); inputs {', '.join(self.input_names)}; "
                 f"outputs {', '.join(self.output_names)}"]
        if self.host_functions:
            lines.append(f"{len(self.host_functions)} host function(s) (C, run by the board's CPU): "
                         f"{', '.join(self.host_functions)}")
        for sg in self.subgraphs:
            lines.append(f"  {sg.symbol}: {len(sg.ops)} op(s) [{', '.join(sg.ops)}], {sg.constants_line()}"
                         + (f", composites {', '.join(sg.patterns)}" if sg.patterns else ""))
        return "\n".join(lines)


def resolve_ops(ops, codegen: Codegen | None = None) -> frozenset:
    """The op set from ``--ops``: op names or ONNX op types, as a list or ``"add,sub"``; each must be in
    ``codegen``'s op set (default: all its ops; without a codegen, every kernel of the board).  A float
    op's name covers its int8 forms where the codegen has them (``conv``: ``q_linear_conv`` too;
    ``quantize.with_int8_forms``)."""
    have = frozenset(OPS) if codegen is None else frozenset(codegen.ops)
    if ops is None:
        return have
    if isinstance(ops, str):
        ops = ops.split(",")
    chosen = set()
    for raw in ops:
        name = str(raw).strip()
        if not name:
            continue
        kernel = name if name in OPS else onnx_op_to_kernel(name)
        if kernel not in OPS:
            raise CompileError(f"unknown op {name!r} in --ops; the board's kernels are: "
                               f"{', '.join(sorted(OPS))}")
        if kernel not in have:
            raise CompileError(f"op {name!r} in --ops is not in codegen {codegen.name!r}'s op set: "
                               f"{', '.join(sorted(have))}")
        chosen.add(kernel)
    if not chosen:
        raise CompileError("--ops is empty; name at least one op (e.g. --ops add,sub,mul)")
    return with_int8_forms(chosen, have)


def _describe(op: Op, graph: Graph) -> str:
    types = "+".join(n.op_type for n in op.nodes)
    ins = ", ".join(graph.describe(t) for t in op.inputs if t) or "none"
    outs = ", ".join(graph.describe(t) for t in op.outputs if t)
    return f"  - {op.name!r} ({types}) inputs: {ins} -> outputs: {outs}: {op.reason}"


def _advice(unsupported: list[Op], chosen: frozenset) -> list[str]:
    """What the user can do, for the kinds of reasons at hand: each line fits some of the nodes.

    (Ops left out by ``--ops`` can only be the reason when ``--ops`` was given.)
    """
    unchosen = sorted({k for op in unsupported for k in op.requires - chosen if k in OPS})
    foreign = sorted({"+".join(n.op_type for n in op.nodes) for op in unsupported
                      if op.kernel not in OPS or op.nodes[0].domain not in OP_DOMAINS})
    refused = [op.name for op in unsupported if op.kernel in OPS and not op.requires - chosen
               and op.nodes[0].domain in OP_DOMAINS]
    lines = []
    if unchosen:
        lines.append(f"add {', '.join(unchosen)} to --ops (or leave --ops out to use every op of the board)")
    if foreign:
        lines.append(f"the board has no kernel for {', '.join(foreign)}: replace these nodes in the model "
                     f"with supported ops, or run that part of the model outside the library")
    if refused:
        lines.append("change the attribute values or input types named above in the model "
                     "(the board implements only the values it lists)")
    return lines


def _unsupported_error(part: Partition, graph: Graph, partial: "CompiledModel",
                       chosen: frozenset) -> UnsupportedNodesError:
    compiler = partial.codegen
    listed = "\n".join(_describe(op, graph) for op in part.unsupported)
    subgraphs = "; ".join(f"{sg.symbol} ({', '.join(sg.ops)})" for sg in partial.subgraphs) or "none"
    advice = _advice(part.unsupported, chosen)
    message = (f"{len(part.unsupported)} node(s) cannot run on the {compiler} accelerator and have no "
               f"host fallback:\n{listed}\n"
               f"The supported part forms {len(partial.subgraphs)} subgraph(s): {subgraphs}.\n"
               f"What to do: " + ";\n  ".join(advice) + ".")
    nodes = [(op.name, "+".join(n.op_type for n in op.nodes),
              [graph.tensors[t].shape for t in op.inputs if t in graph.tensors],
              [graph.tensors[t].shape for t in op.outputs if t in graph.tensors]) for op in part.unsupported]
    return UnsupportedNodesError(message, nodes, partial)


def build(graph: Graph, part: Partition, module_name: str = "default", codegen: Codegen | None = None) -> CompiledModel:
    """Codegen for a partition: the codegen's module per function, C per host function, graph JSON, params."""
    codegen = codegen or get_codegen()
    subgraphs = []
    host = [fn for fn in part.functions if fn.kind == "host"]
    owners: dict[str, str] = {}  # const loader name -> symbol
    for fn in part.functions:
        if fn.kind == "host":
            continue
        ext = codegen.generate(fn, graph)
        if not isinstance(ext, External) or not isinstance(ext.node, ModuleNode):
            raise CompileError(f"codegen {codegen.name!r}: generate() must return an External whose node is a "
                               f"rpcsrv.loader.node.ModuleNode, got {type(ext).__name__} for {fn.symbol}")
        key = ext.node.type_key
        if key in ("", "module", "_lib", "_import_tree"):
            raise CompileError(f"codegen {codegen.name!r} made a module without a type key of its own for {fn.symbol}")
        for name in ext.constants:
            if owners.setdefault(name, fn.symbol) != fn.symbol:
                raise CompileError(f"codegen {codegen.name!r}: constant name {name!r} given by {owners[name]} and "
                                   f"{fn.symbol} (the const loader's names are one namespace: prefix the symbol)")
        if codegen.codec is not None:
            add_codec(key, codegen.codec)
        elif key not in PAYLOADS:
            raise CompileError(f"codegen {codegen.name!r} made a {key!r} module, whose payload no codec writes "
                               f"(set the codegen's codec)")
        subgraphs.append(Subgraph(fn.symbol, ext.text, dict(ext.constants), fn.inputs, fn.outputs,
                                  [op.kernel for op in fn.ops], [op.pattern for op in fn.ops if op.pattern],
                                  ext.node, {t: graph.constants[t] for t in fn.constants}))
    # constants the model returns directly are the only params: everything else is offloaded
    # (and the constants host functions read: TVM passes those as params too)
    wanted = list(graph.outputs) + [t for fn in host for t in fn.inputs]
    params = {t: np.asarray(graph.constants[t], order="C") for t in dict.fromkeys(wanted) if t in graph.constants}
    # with unsupported nodes left over there is no complete graph to describe (partial result, for messages)
    complete = all(any(op in fn.ops for fn in host) for op in part.unsupported)
    text = graph_json(graph, part.functions, params) if complete else ""
    code = host_source([(fn.symbol, fn.ops[0]) for fn in host], graph) if host and complete else ""
    return CompiledModel(text, params, subgraphs, list(graph.inputs), list(graph.outputs),
                         module_name, graph, code, [fn.symbol for fn in host], codegen.name,
                         codegen.title or codegen.name)


def compile_onnx(model_or_path, input_shapes: dict | None = None, ops=None, *,
                 module_name: str = "default", bind_inputs: dict | None = None,
                 fold_batchnorm: bool = True, host_fallback: bool = True, codegen: str | None = None) -> CompiledModel:
    """Compile an ONNX model (``ModelProto``, path or bytes) for a BYOC accelerator: ``codegen`` names it
    (``codegens.get_codegen``: the built-in ``examplejson`` by default, or an installed plugin's).

    ``input_shapes``: ``{input name: shape}`` for inputs with dynamic dimensions.  ``ops``: restrict
    the accelerator to these ops (kernel names such as ``add`` or ONNX types such as ``Add``);
    default: every kernel of the board.  ``bind_inputs``: ``{input name: array}`` to make inputs
    constants (e.g. a Reshape target shape).  ``fold_batchnorm``: compose per-channel affine chains
    (BatchNormalization, Mul, Add by constants) into one BatchNormalization and fold it into the Conv
    before it, or its scale through a Relu into the Conv after it, where only rounding can differ
    (``simplify``; TVM and onnxruntime fold the first too).
    Raises ``CompileError`` for anything wrong with the input, ``UnsupportedNodesError`` when some
    nodes cannot be offloaded.
    """
    if not module_name.isidentifier():
        raise CompileError(f"module name {module_name!r} must be an identifier")
    gen = get_codegen(codegen)
    chosen = resolve_ops(ops, gen)
    graph = import_onnx(model_or_path, input_shapes, bind_inputs)
    remove_noops(graph)  # Dropout, Identity, ...: nothing to run at inference (TVM's SimplifyInference)
    quantize_graph(graph)  # QDQ chains -> int8 ops with their scales and zero points (TVM's QNN ops)
    if fold_batchnorm:
        simplify_inference(graph, chosen)
    part = partition(graph, chosen, module_name, host=host_fallback, codegen=gen)
    if host_fallback:
        for op in part.unsupported:
            why = host_reason(op, graph)
            op.reason = f"{op.reason}; on the host: {why}" if why else ""
        part.unsupported = [op for op in part.unsupported if op.reason]
        part.functions = [fn for fn in part.functions if fn.kind != "host" or not fn.ops[0].reason]
    compiled = build(graph, part, module_name, gen)
    if part.unsupported:
        raise _unsupported_error(part, graph, compiled, chosen)
    missing = [o for o in graph.outputs if o not in graph.inputs and o not in compiled.params
               and not any(o in fn.outputs for fn in part.functions)]
    if missing:
        raise CompileError(f"model output(s) {', '.join(missing)} are computed by no subgraph")
    return compiled
