"""The runtime module of one JSON-runtime BYOC module: its symbol as a packed function.

``f(*inputs, *outputs)``, as TVM's ``JSONRuntimeBase`` (and ExampleJSON) call it: the inputs are the
outputs of the graph's ``input`` nodes in ``arg_nodes`` order, the outputs the graph's ``heads``;
the outputs are written in place.  Each ``kernel`` node runs the factory the op table (``table.py``)
gives for its name, prepared once here, when the library is loaded: a name the table lacks, or an
attribute it cannot honour, refuses the module at ``load_module`` naming the node and the op.

Constants arrive by name, in the order of the module's constant names, through ``__init_<symbol>``
(TVM's initializer, which the const loader calls when the tree is built; ``ConstLoaderRuntime``
binds them so) or :meth:`JSONRuntime.bind`.  Each is checked against its ``const`` node's shape and
dtype, kept read-only and aligned, and weights a kernel wants in another layout are transformed once.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ...loader.jsonrt import JSONRuntimeModule
from ...loader.jsonrt_graph import JSONGraph
from ...protocol.dtypes import DataType
from ..module import STEP_HOOK, ExecutorError, RuntimeModule, StepInfo
from .attrs import Attrs, OpError
from .table import lookup


def _describe(graph: JSONGraph, nid: int) -> str:
    node = graph.nodes[nid]
    return f"node {nid}" if node.op == "kernel" else f"node {nid} ({node.op} {node.name!r})"


def _np_dtype(text: str, where: str) -> np.dtype:
    try:
        return DataType.parse(text).numpy()
    except ValueError as exc:
        raise ExecutorError(f"{where}: dtype {text!r} is not supported on this board ({exc})") from None


class Step:
    """One kernel node: its prepared op, the data entries it reads and writes."""

    def __init__(self, graph: JSONGraph, nid: int, where: str):
        node = graph.nodes[nid]
        self.nid, self.node, self.where = nid, node, where
        factory = lookup(node.name)
        if factory is None:
            raise ExecutorError(f"{where}: op {node.name!r} has no kernel on this board (see docs/jsonrt.md "
                                "for the ops it runs)")
        shapes = [graph.nodes[e.node].shapes[e.index] for e in node.inputs]
        dtypes = [graph.nodes[e.node].dtypes[e.index] for e in node.inputs]
        try:
            self.op = factory(node, Attrs(node, dtypes), shapes)
        except OpError as exc:
            raise ExecutorError(f"{where} op {node.name!r}: {exc}") from None
        except Exception as exc:  # attributes no check foresaw: still an answer naming the node
            raise ExecutorError(f"{where} op {node.name!r}: cannot prepare it: {type(exc).__name__}: {exc}") from None
        self.inputs = [graph.entry_id(e) for e in node.inputs]
        self.outputs = [graph.node_row_ptr[nid] + i for i in range(node.num_outputs)]
        self.out_types = [(tuple(s), _np_dtype(d, where)) for s, d in zip(node.shapes, node.dtypes)]
        self.info = StepInfo(nid, node.name)  # what a step hook learns of it


class JSONRuntime(RuntimeModule):
    """A ``tensorrt`` / ``arm_compute_lib`` / ``dnnl_json`` / ``clml`` / ``bnns_json`` / ``json``
    module run on numpy: ``get_function(symbol)`` is its graph."""

    def __init__(self, node: JSONRuntimeModule, imports: Optional[list[RuntimeModule]] = None):
        super().__init__(imports)
        self.type_key, self.symbol, self.const_names = node.type_key, node.symbol, list(node.const_names)
        self.graph_json = node.graph_json
        try:
            graph = node.graph
        except ValueError as exc:
            raise ExecutorError(str(exc)) from None
        self.graph = graph
        head = f"{node.type_key} module {node.symbol!r}"
        self.steps = [Step(graph, nid, f"{head} {_describe(graph, nid)}")
                      for nid, n in enumerate(graph.nodes) if n.op == "kernel"]
        self.head = head
        self.entry_types = {}
        for nid, n in enumerate(graph.nodes):
            where = f"{head} {_describe(graph, nid)}"
            for i, (s, d) in enumerate(zip(n.shapes, n.dtypes)):
                self.entry_types[graph.node_row_ptr[nid] + i] = (tuple(s), _np_dtype(d, where))
        self.input_eids = [graph.entry_id(e) for e in graph.input_entries]
        self.output_eids = [graph.entry_id(h) for h in graph.heads]
        # an intermediate is dropped after the last step that reads it, so memory stays near the live set
        last_use = {eid: k for k, step in enumerate(self.steps) for eid in step.inputs}
        kept = set(self.output_eids)
        self.drops: list[list[int]] = [[] for _ in self.steps]
        for k, step in enumerate(self.steps):
            for eid in step.outputs:
                if eid not in kept:
                    self.drops[last_use.get(eid, k)].append(eid)
        self.const_eids = {graph.nodes[n].name: graph.node_row_ptr[n] for n in graph.const_nodes}
        self.constants: dict[int, np.ndarray] = {}
        # weights in a kernel's layout: (step index, input position) -> array, made once per constant
        self.prepared: dict[tuple[int, int], np.ndarray] = {}

    # -- constants -------------------------------------------------------------------------------------
    def unbound(self) -> list[str]:
        """Constant names not bound yet."""
        return [name for name, eid in self.const_eids.items() if eid not in self.constants]

    def check_constants(self) -> None:
        """Its constants come from a const loader only (TVM's ``__init_<symbol>``), never the graph params."""
        if self.unbound():
            raise ExecutorError(f"{self.head}: constant(s) {', '.join(map(repr, self.unbound()))} not found "
                                "in a const loader module")

    def bind(self, arrays: Mapping[str, Any], source: str) -> None:
        """Bind the constants found in ``arrays`` by name, checked against their const nodes."""
        for name, eid in self.const_eids.items():
            if name not in arrays:
                continue
            arr = np.asarray(arrays[name])
            shape, dtype = self.entry_types[eid]
            if arr.shape != shape or arr.dtype != dtype:
                raise ExecutorError(f"{self.head}: constant {name!r} from {source} is {arr.dtype} {list(arr.shape)}, "
                                    f"the graph declares {dtype} {list(shape)}")
            bound = np.require(arr, requirements="AC")
            if bound is arr:
                bound = arr.view()
            bound.flags.writeable = False
            self.constants[eid] = bound
        for k, step in enumerate(self.steps):
            for pos, transform in step.op.weights.items():
                eid = step.inputs[pos]
                if eid in self.constants and (k, pos) not in self.prepared:
                    w = np.ascontiguousarray(transform(self.constants[eid]))
                    w.flags.writeable = False
                    self.prepared[(k, pos)] = w

    def _init(self, arrays: Sequence[Any]) -> int:
        if len(arrays) != len(self.const_names):
            raise ExecutorError(f"__init_{self.symbol}: {len(self.const_names)} constant(s) declared, "
                                f"{len(arrays)} given")
        self.bind(dict(zip(self.const_names, arrays)), "the const loader")
        return 0

    # -- functions ---------------------------------------------------------------------------------------
    def get_function(self, name: str):
        if name == self.symbol:
            return self.run
        if name == f"__init_{self.symbol}":
            return self._init
        if name == "get_symbol":
            return lambda: self.symbol
        return None

    def _check(self, arr: Any, eid: int, what: str) -> np.ndarray:
        shape, dtype = self.entry_types[eid]
        if not isinstance(arr, np.ndarray):
            raise ExecutorError(f"{self.head} {what}: expected a tensor, got {type(arr).__name__}")
        if arr.shape != shape or arr.dtype != dtype:
            raise ExecutorError(f"{self.head} {what}: expected {dtype} {list(shape)}, "
                                f"got {arr.dtype} {list(arr.shape)}")
        return arr

    def run(self, *args: Any) -> None:
        """The graph: ``args`` are the inputs, then the outputs (written in place)."""
        n_in, n_out = len(self.input_eids), len(self.output_eids)
        if len(args) != n_in + n_out:
            raise ExecutorError(f"{self.symbol} takes {n_in} input(s) and {n_out} output(s) "
                                f"({n_in + n_out} arguments), got {len(args)}")
        missing = self.unbound()
        if missing:
            raise ExecutorError(f"{self.head}: constant(s) {', '.join(map(repr, missing))} are not bound")
        values: dict[int, np.ndarray] = dict(self.constants)
        for k, eid in enumerate(self.input_eids):
            values[eid] = self._check(args[k], eid, f"argument {k} (input)")
        outs = [self._check(args[n_in + k], eid, f"argument {n_in + k} (output {k})")
                for k, eid in enumerate(self.output_eids)]
        hook = STEP_HOOK.get()
        for k, step in enumerate(self.steps):
            start = time.perf_counter() if hook is not None else 0.0
            ins = [values[eid] for eid in step.inputs]
            for pos, transform in step.op.weights.items():
                ins[pos] = self.prepared.get((k, pos))
                if ins[pos] is None:
                    ins[pos] = transform(values[step.inputs[pos]])
            try:
                result = step.op.run(*ins)
            except ExecutorError:
                raise
            except Exception as exc:  # a kernel's own error: say which node of which module
                raise ExecutorError(f"{step.where} op {step.node.name!r} failed: {type(exc).__name__}: {exc}") from exc
            results = result if isinstance(result, tuple) else (result,)
            if len(results) != len(step.outputs):
                raise ExecutorError(f"{step.where} op {step.node.name!r}: the op gave {len(results)} output(s), "
                                    f"the node declares {len(step.outputs)}")
            for eid, value, (shape, dtype) in zip(step.outputs, results, step.out_types):
                value = np.asarray(value)
                if value.shape != shape or value.dtype != dtype:
                    raise ExecutorError(f"{step.where} op {step.node.name!r}: kernel produced {value.dtype} "
                                        f"{list(value.shape)} but the node declares {dtype} {list(shape)}")
                values[eid] = value
            if hook is not None:  # the debug executor's per-kernel view (rpcsrv.executor.module.STEP_HOOK)
                hook(self.symbol, step.info, values[step.outputs[0]], time.perf_counter() - start)
            for eid in self.drops[k]:
                del values[eid]
        for out, eid in zip(outs, self.output_eids):
            np.copyto(out, values[eid], casting="no")


def jsonrt_runtime(node: JSONRuntimeModule, imports: list[RuntimeModule], _options: Any) -> JSONRuntime:
    """The runtime factory of the JSON-runtime kinds (attached by ``rpcsrv.executor.runtimes``)."""
    return JSONRuntime(node, imports)
