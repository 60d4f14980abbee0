"""ExampleJSON runtime module (type key ``examplejson``): one packed function per subgraph.

The text is parsed and checked by ``text.py`` (see there and ``docs/examplejson.md``).
Each subgraph becomes a packed function named by its header.  It is called with the inputs (in
the order of their ``input`` lines) followed by the outputs, and writes the outputs in place, as
TVM's external functions do.  Intermediate tensors live only for one call, so one module can be
called from several threads at once (the server runs each session's calls in a worker thread).
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .concat_chain import chain_kernels
from .concat_fold import fold_concats
from .dq_share import share_quantization
from .qchain_fold import chain_steps
from .qdq_fold import fold_quantized
from .text import RUNTIME_ATTRS, ExampleJSONError, Kernel, Node, Subgraph, parse_examplejson
from ..module import STEP_HOOK, ExecutorError, RuntimeModule
from .residual_fold import fold_residuals
from .scale_fold import fold_scales
from .shuffle_fold import fold_shuffles

__all__ = ["STEP_HOOK", "ExampleJSONError", "ExampleJSONRuntime", "Node", "Subgraph", "SubgraphFunction",
           "examplejson_runtime", "parse_examplejson"]


#: how a wrong shape or dtype is reported, for the subgraph's arguments and for kernel results
_ARGUMENT_MISMATCH = "expected {want}, got {got}"
_RESULT_MISMATCH = "kernel produced {got} but the node declares {want}"


def _check_array(arr: Any, node: Node, what: str, mismatch: str = _ARGUMENT_MISMATCH) -> np.ndarray:
    """``arr`` if it is a tensor of ``node``'s declared shape and dtype, else an ExecutorError."""
    if not isinstance(arr, np.ndarray):
        raise ExecutorError(f"{what}: expected a tensor, got {type(arr).__name__}")
    if arr.shape != node.shape or arr.dtype != node.dtype:
        raise ExecutorError(f"{what}: " + mismatch.format(want=f"{node.dtype} {list(node.shape)}",
                                                          got=f"{arr.dtype} {list(arr.shape)}"))
    return arr


class SubgraphFunction:
    """The packed function of one subgraph: ``f(*inputs, *outputs)``, outputs written in place."""

    def __init__(self, graph: Subgraph, kernels: Mapping[str, Kernel], constants: dict[int, np.ndarray]):
        self.source = graph  # as written; ``graph`` is it after the int8 fold (see ``prepare``)
        self.constants = constants  # node ID -> bound array (filled by ExampleJSONRuntime.bind)
        self.inputs = graph.inputs
        self.outputs = [graph.nodes[i] for i in graph.outputs]
        self._kernels = kernels
        self._build(graph)

    def _build(self, graph: Subgraph) -> None:
        """The steps of ``graph`` (the rewrites below made), bound to the table's kernels."""
        self.graph, kernels = graph, self._kernels
        # squeeze-and-excitation's Mul goes into the 1x1 conv that reads it (see scale_fold)
        ops, folded = fold_scales(graph, kernels)
        # a residual Add goes into the 1x1 conv whose output it adds (see residual_fold)
        ops, residuals = fold_residuals(graph, ops, kernels, folded)
        folded.update(residuals)
        # ShuffleNetV2's Concat + channel shuffle: one step writing the shuffled tensor (see shuffle_fold)
        ops, shuffles = fold_shuffles(graph, ops, kernels)
        # a Concat's producers write into its buffer (see concat_fold); the later ones read the owner's view
        into_kernels: dict = {}
        if "concat" in kernels:
            ops, self._into, into_kernels = fold_concats(graph, ops, kernels["concat"])
        else:
            self._into = {}
        # ops that share op, inputs and attrs (the outputs of one multi-output op) run once per call
        kernel_attrs = [{k: v for k, v in node.attrs.items() if k not in RUNTIME_ATTRS} for node in ops]
        keys = [(node.op, node.inputs, json.dumps(kattrs, sort_keys=True))
                for node, kattrs in zip(ops, kernel_attrs)]
        last_of_key = {key: k for k, key in enumerate(keys)}
        # an intermediate is dropped after its last use, so peak memory stays near the live set
        last_use: dict[int, int] = {}
        for k, node in enumerate(ops):
            for i in node.inputs:
                if i >= 0:
                    last_use[i] = k
        keep = set(graph.outputs) | {n.id for n in graph.nodes.values() if n.kind != "op"}
        drops: dict[int, list[int]] = {}
        for nid, k in last_use.items():
            if nid not in keep:
                drops.setdefault(k, []).append(nid)
        # DenseNet's growing concats write into one buffer per chain (see concat_chain)
        in_place = chain_kernels(graph, kernels["concat"]) if "concat" in kernels else {}
        in_place.update(folded)
        in_place.update(shuffles)
        in_place.update(into_kernels)
        self._raw: dict[int, Kernel] = {}  # folded producers' kernels before ``Into.wrap``
        self.steps = []
        for k, (node, key, kattrs) in enumerate(zip(ops, keys, kernel_attrs)):
            shared = keys.count(key) > 1
            kernel = in_place.get(node.id, kernels[node.op])
            if node.id in self._into:
                self._raw[node.id], kernel = kernel, self._into[node.id].wrap(kernel)
            self.steps.append((node, kernel, kattrs, key if shared else None,
                               last_of_key[key] == k, node.attrs.get("output_index", 0),
                               tuple(drops.get(k, ()))))
        self._table_steps = list(self.steps)  # the kernels of the table, before any plan (``prepare``)
        self._stepwise = self.steps  # the steps one by one (``steps`` may join runs of them: ``prepare``)
        read = {i for node in ops for i in node.inputs} | set(graph.outputs)
        self._read_consts = [n for n in graph.consts if n.id in read]  # (what __call__ puts in place)
        self._bound = None
        # kernels of the table, and the folded convs (planned as ``scaled_conv``); not the concat chains
        self._plannable = {node.id for node in ops if node.id not in in_place or node.id in folded}
        self._plannable -= set(into_kernels)

    def prepare(self) -> None:
        """Derive what kernels cache from the constants bound so far (``kernels.load_time``), so the
        first run after loading does not."""
        from ..kernels.clib import compiled
        from ..kernels.load_time import prepare_constants

        # quantized chains into int8 ops, once the constants they read are bound (see qdq_fold)
        folded = fold_quantized(self.source, self.constants) if compiled.library() is not None else None
        if folded is not None:
            self.constants.update(folded[1])
        graph = self.source if folded is None else folded[0]
        if graph is not self.graph and (folded is not None or self.graph is not self.source):
            self._build(graph)
        ops = self.graph.ops  # as declared (a folded conv's weights are scaled at each call: nothing to prepare)
        prepare_constants(ops, self.graph.nodes, self.constants,
                          [{k: v for k, v in node.attrs.items() if k not in RUNTIME_ATTRS} for node in ops])
        self.steps = self._table_steps  # the old plans (and what they keep) freed before the new are made
        # the dynamic MatMuls of one input quantize it once (see dq_share)
        self.steps = self._stepwise = share_quantization([self._planned(step) for step in self._table_steps])
        # runs of int8 steps as one step each (see qchain_fold); a run with a step hook takes them one by one
        self.steps = chain_steps(self.steps, self.graph.nodes, self.graph.outputs, self.constants)
        self._bound = None

    def _planned(self, step: tuple) -> tuple:
        """``step`` with its kernel bound to its node's shapes and constants when ``kernels.plans`` has a
        plan for it (its attributes then go into the plan), else as it is."""
        from ..kernels.plans import plan

        node, kernel, kattrs, key, last_of_key, index, drops = step
        if key is not None or index != 0 or node.id not in self._plannable:
            return step
        into = self._into.get(node.id)
        kernel, declared = (self._raw[node.id], into.node) if into is not None else (kernel, node)
        nodes = self.graph.nodes
        inputs = [self.constants[i] if i in self.constants else (nodes[i].shape, nodes[i].dtype) if i in nodes
                  else None for i in declared.inputs]
        fn = plan(getattr(kernel, "plan_as", node.op), kernel, kattrs, inputs, node.shape, node.dtype)
        if fn is None:
            return step
        return (node, fn if into is None else into.wrap(fn), {}, key, last_of_key, index, drops)

    def __call__(self, *args: Any) -> None:
        g, n_in, n_out = self.graph, len(self.inputs), len(self.outputs)
        if len(args) != n_in + n_out:
            raise ExecutorError(f"{g.name} takes {n_in} input(s) and {n_out} output(s) "
                                f"({n_in + n_out} arguments), got {len(args)}")
        values: dict[int, Optional[np.ndarray]] = {-1: None}
        for k, node in enumerate(self.inputs):
            values[node.id] = _check_array(args[k], node, f"{g.name} argument {k} (input {node.id})")
        outs = [_check_array(args[n_in + k], node, f"{g.name} argument {n_in + k} (output {node.id})")
                for k, node in enumerate(self.outputs)]
        bound = self._bound if self._bound is not None else self._bind_steps()
        if len(bound) != len(self._read_consts):
            node = next(n for n in self._read_consts if n.id not in self.constants)
            raise ExecutorError(f"{g.name}: constant {node.name!r} (node {node.id}) is not bound")
        values.update(bound)
        shared: dict[tuple, Any] = {}  # results of multi-output ops until their last node
        node = None
        hook = STEP_HOOK.get()
        try:
            for node, kernel, kattrs, key, last_of_key, index, drops in (self.steps if hook is None else
                                                                          self._stepwise):
                start = time.perf_counter() if hook is not None else 0.0
                if key is None:
                    result = kernel(*[values[i] for i in node.inputs], **kattrs)
                else:
                    if key not in shared:
                        shared[key] = kernel(*[values[i] for i in node.inputs], **kattrs)
                    result = shared.pop(key) if last_of_key else shared[key]
                if type(result) is np.ndarray and index == 0 and result.shape == node.shape \
                        and result.dtype == node.dtype:
                    values[node.id] = result  # the common case, checked inline
                else:
                    values[node.id] = self._pick(node, result, index)
                if hook is not None:
                    hook(g.name, node, values[node.id], time.perf_counter() - start)
                for nid in drops:
                    del values[nid]
        except ExecutorError:
            raise
        except Exception as exc:  # a kernel's own error: say which node of which subgraph
            raise ExecutorError(f"{g.name} {node.describe()} failed: {type(exc).__name__}: {exc}") from exc
        for out, onode in zip(outs, self.outputs):
            np.copyto(out, values[onode.id], casting="no")

    def _bind_steps(self) -> dict:
        """The bound constants the steps read, by node ID (worked out once per binding, not at each call: a folded
        int8 graph keeps hundreds of constants only its dropped nodes read)."""
        self._bound = {n.id: self.constants[n.id] for n in self._read_consts if n.id in self.constants}
        return self._bound

    def _pick(self, node: Node, result: Any, index: int) -> np.ndarray:
        """The node's tensor from a kernel result that is not simply the declared array (the
        common case is checked inline in ``__call__``): one of several outputs, or a mismatch."""
        what = f"{self.graph.name} {node.describe()}"
        if isinstance(result, (tuple, list)):
            if index >= len(result):
                raise ExecutorError(f"{what}: output_index {index} but the op gave {len(result)} outputs")
            result = result[index]
        elif index != 0:
            raise ExecutorError(f"{what}: output_index {index} but the op gave one output")
        if isinstance(result, np.generic):
            result = np.asarray(result)
        return _check_array(result, node, what, _RESULT_MISMATCH)


class ExampleJSONRuntime(RuntimeModule):
    """The runtime of an ``examplejson`` module: one packed function per subgraph.

    ``__init_<symbol>`` (TVM's constant initialiser, called by a const loader) binds the
    subgraph's ``const`` nodes in line order; :meth:`bind` binds them by name.
    """

    type_key = "examplejson"

    def __init__(self, code: str, kernels: Optional[Mapping[str, Kernel]] = None, imports=None):
        super().__init__(imports)
        if kernels is None:
            from ..kernels import KERNELS as kernels  # noqa: N811 - the shared kernel table
        self.code = code
        self.graphs = parse_examplejson(code, kernels)
        self.constants: dict[str, dict[int, np.ndarray]] = {name: {} for name in self.graphs}
        self.functions = {name: SubgraphFunction(g, kernels, self.constants[name])
                          for name, g in self.graphs.items()}

    def get_function(self, name: str):
        if name in self.functions:
            return self.functions[name]
        if name.startswith("__init_") and name[len("__init_"):] in self.graphs:
            symbol = name[len("__init_"):]
            return lambda arrays: self._init_in_order(symbol, arrays)
        return None

    def const_names(self, symbol: str) -> list[str]:
        """The constant names subgraph ``symbol`` needs, in line order."""
        return [n.name for n in self.graphs[symbol].consts]

    def unbound(self, symbol: str) -> list[str]:
        """Names of subgraph ``symbol``'s constants that are not bound yet."""
        return [n.name for n in self.graphs[symbol].consts if n.id not in self.constants[symbol]]

    def bind(self, symbol: str, arrays: Mapping[str, Any], source: str, only_missing: bool = False) -> None:
        """Bind the constants of ``symbol`` found in ``arrays`` (by name); ``source`` is for errors.  The steps
        are planned again only when a constant was bound (the plans keep packed weights: a second planning,
        e.g. from the graph params after a const loader bound every constant, held two copies at once)."""
        bound_any = False
        for node in self.graphs[symbol].consts:
            if node.name not in arrays or (only_missing and node.id in self.constants[symbol]):
                continue
            arr = np.asarray(arrays[node.name])
            if arr.shape != node.shape or arr.dtype != node.dtype:
                raise ExecutorError(f"{symbol} {node.describe()}: constant {node.name!r} from {source} is "
                                    f"{arr.dtype} {list(arr.shape)}, declared {node.dtype} {list(node.shape)}")
            # aligned and contiguous once at load: numpy's matmul takes its BLAS path only for aligned
            # data, and a constant sliced from a blob at an odd offset is not (measured: 100x on GEMV)
            bound = np.require(arr, requirements="AC")
            if bound is not arr:  # our own copy: read-only, so kernels may trust what they derive from it
                bound.flags.writeable = False
            self.constants[symbol][node.id] = bound
            bound_any = True
        if bound_any:
            self.functions[symbol].prepare()

    def bind_constants(self, symbol: str, arrays: Mapping[str, Any], source: str) -> bool:
        if symbol not in self.graphs:
            return False
        self.bind(symbol, arrays, source)
        return True

    def bind_params(self, params: Mapping[str, Any], source: str) -> None:
        for symbol in self.graphs:
            self.bind(symbol, params, source, only_missing=True)

    def check_constants(self) -> None:
        for symbol in self.graphs:
            missing = self.unbound(symbol)
            if missing:
                raise ExecutorError(f"ExampleJSON subgraph {symbol!r}: constant(s) "
                                    f"{', '.join(map(repr, missing))} not found in a const loader "
                                    f"module or the graph params")

    def _init_in_order(self, symbol: str, arrays: Sequence[Any]) -> int:
        names = self.const_names(symbol)
        if len(arrays) != len(names):
            raise ExecutorError(f"__init_{symbol}: {len(names)} constant(s) declared, {len(arrays)} given")
        self.bind(symbol, dict(zip(names, arrays)), f"__init_{symbol}")
        return 0


def examplejson_runtime(node: Any, imports: list[RuntimeModule], _options: Any = None) -> ExampleJSONRuntime:
    """The runtime factory of the ``examplejson`` kind (``rpcsrv.loader.examplejson.KIND``)."""
    return ExampleJSONRuntime(node.code, imports=imports)
