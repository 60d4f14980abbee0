"""The graph executor: TVM's ``GraphExecutor`` (v0.19) over numpy buffers.

Storage follows the graph's plan: every node entry is a view into the pool buffer of its
``storage_id`` (sized for the largest entry sharing it), so entries that TVM's planner put in one
buffer share memory here too.  ``run`` calls each ``tvm_op``'s function, found by ``func_name`` in
the library module (root first, then its imports depth-first), with the input entries followed by
the output entries, exactly TVM's argument order; ``__nop`` does nothing and ``__copy`` copies.

Every executor owns its buffers; two executors never share memory except through
``share_params``, so two sessions can run at once in two threads.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from ...protocol.dtypes import HOST_DEVICE_TYPES, Device
from .. import compute
from ...loader.graph_json import Graph, parse_graph_json
from ..memory import before_allocation
from ..module import ExecutorError, RuntimeModule

def zeros(nbytes: int) -> np.ndarray:
    """A zero-filled storage pool: how an executor gets its storage unless told (``allocate``; a native
    worker's are in its shared arena, so that the session maps the outputs without a copy)."""
    return np.zeros(nbytes, dtype=np.uint8)


def _describe(arr: np.ndarray) -> str:
    return f"{arr.dtype} {list(arr.shape)}"


def check_devices(devices: Sequence[Any]) -> list[Device]:
    """The devices an executor is created for; only host memory devices exist on this board."""
    if not devices:
        raise ExecutorError("creating a graph executor needs at least one device, e.g. cpu(0)")
    for dev in devices:
        if not isinstance(dev, Device):
            raise ExecutorError(f"expected a device argument, got {type(dev).__name__}")
        if dev.device_type not in HOST_DEVICE_TYPES:
            raise ExecutorError(f"device {dev} is not available on this board: rpcsrv runs graphs on "
                                f"the host CPU (use cpu(0))")
    return list(devices)


class GraphExecutorModule(RuntimeModule):
    """A created graph executor (type key ``GraphExecutor``) with TVM's functions."""

    type_key = "GraphExecutor"

    def __init__(self, graph: str | Graph, lib: Optional[RuntimeModule], devices: Sequence[Any], *,
                 allocate: Callable[[int], np.ndarray] = zeros):
        super().__init__()
        self.allocate = allocate
        self.graph = graph if isinstance(graph, Graph) else parse_graph_json(graph)
        self.lib = lib
        self.devices = check_devices(devices)
        g = self.graph
        self.input_map = {g.nodes[nid].name: i for i, nid in enumerate(g.arg_nodes)}
        self.param_names: set[str] = set()
        self._functions = self._resolve_functions()
        self._setup_storage()
        self._setup_op_execs()
        self._threads = compute.ThreadChoice()  # this model's fastest BLAS thread count, learned
        self._api = {
            "set_input": self.set_input, "set_input_zero_copy": self.set_input_zero_copy,
            "set_output_zero_copy": self.set_output_zero_copy, "get_output": self.get_output,
            "get_input": self.get_input, "get_num_outputs": self.get_num_outputs,
            "get_num_inputs": self.get_num_inputs, "run": self.run, "load_params": self.load_params,
            "share_params": self.share_params, "get_input_index": self.get_input_index,
            "get_input_info": self.get_input_info, "get_output_info": self.get_output_info,
            "run_from_inputs": self.run_from_inputs,
        }

    # ------------------------------------------------------------------ setup
    def _resolve_functions(self) -> dict[str, Any]:
        funcs: dict[str, Any] = {}
        for nid, node in enumerate(self.graph.nodes):
            name = node.func_name
            if node.op != "tvm_op" or name in ("__nop", "__copy") or name in funcs:
                continue
            fn = self.lib.find_function(name) if self.lib is not None else None
            if fn is None:
                mods = list(self.lib.walk()) if self.lib is not None else []
                where = " → ".join(m.type_key for m in mods) if mods else "no library"
                opaque = sorted({m.type_key for m in mods if getattr(m, "opaque", False)})
                hint = (f"; modules of type {', '.join(opaque)} cannot be run by rpcsrv and export "
                        f"nothing") if opaque else ""
                raise ExecutorError(f"no such function in module: {name} (graph node {nid} "
                                    f"{node.name!r}; searched {where}{hint})")
            funcs[name] = fn
        return funcs

    def _setup_storage(self) -> None:
        g = self.graph
        sizes: dict[int, int] = {}
        for eid in range(g.num_entries):
            nbytes = int(np.prod(g.shape[eid], dtype=np.int64)) * g.dtypes[eid].itemsize
            sid = g.storage_id[eid]
            sizes[sid] = max(sizes.get(sid, 0), nbytes)
        before_allocation(self, sum(sizes.values()), "graph executor storage")  # budget check first
        # zero-filled (TVM leaves memory uninitialised; zeros make reruns reproducible)
        self.pool = {sid: self.allocate(size) for sid, size in sizes.items()}
        self.data_entry = [self._view(self.pool[g.storage_id[eid]], eid) for eid in range(g.num_entries)]

    def _view(self, buffer: np.ndarray, eid: int) -> np.ndarray:
        """Entry ``eid`` as a view of the raw bytes ``buffer``."""
        g = self.graph
        dtype, shape = g.dtypes[eid], g.shape[eid]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buffer[:nbytes].view(dtype).reshape(shape)

    def _setup_op_execs(self) -> None:
        g = self.graph
        self.op_execs = []
        for nid in op_exec_node_ids(g):  # the same list the debug executor maps its nodes with
            node = g.nodes[nid]
            args = [self.data_entry[g.entry_id(src, idx)] for src, idx in node.inputs]
            args += [self.data_entry[g.entry_id(nid, k)] for k in range(node.num_outputs)]
            if node.flatten_data:
                args = [a.reshape(-1) for a in args]
            if node.func_name == "__copy":
                self.op_execs.append((np.copyto, args[:2]))
            else:
                self.op_execs.append(_op_exec(self._functions[node.func_name], args))

    # ------------------------------------------------------------------ lookups
    def get_function(self, name: str):
        return self._api.get(name)

    def get_input_index(self, name: Any) -> int:
        """The index of input ``name`` in ``arg_nodes``, or -1."""
        if not isinstance(name, str):
            raise ExecutorError("Input key is not a string")
        return self.input_map.get(name, -1)

    def _input_index(self, key: Any, what: str) -> int:
        if isinstance(key, str):
            idx = self.input_map.get(key, -1)
            if idx < 0:
                names = ", ".join(self.input_map) or "none"
                raise ExecutorError(f"{what}: no input named {key!r} in the graph (inputs: {names})")
            return idx
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
            raise ExecutorError(f"{what}: the input key must be a name or an index, got {type(key).__name__}")
        key = int(key)
        if not 0 <= key < len(self.graph.arg_nodes):
            raise ExecutorError(f"{what}: input index {key} out of range (the graph has "
                                f"{len(self.graph.arg_nodes)} inputs)")
        return key

    def _output_index(self, key: Any, what: str) -> int:
        g = self.graph
        if isinstance(key, str):
            for i, (nid, _) in enumerate(g.heads):
                if g.nodes[nid].name == key:
                    return i
            raise ExecutorError(f"Invalid output node:{key}")
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
            raise ExecutorError(f"{what}: the output key must be an index, got {type(key).__name__}")
        key = int(key)
        if not 0 <= key < len(g.heads):
            raise ExecutorError(f"{what}: output index {key} out of range (the graph has {len(g.heads)} outputs)")
        return key

    def _input_eid(self, idx: int) -> int:
        return self.graph.entry_id(self.graph.arg_nodes[idx], 0)

    def _output_eid(self, idx: int) -> int:
        return self.graph.entry_id(*self.graph.heads[idx])

    # ------------------------------------------------------------------ TVM's functions
    def set_input(self, key: Any, value: Any) -> None:
        """Copy ``value`` (an array, or raw bytes of the input's size) into input ``key``."""
        idx = self._input_index(key, "set_input")
        self._copy_in(self.data_entry[self._input_eid(idx)], value, f"set_input {self._input_name(idx)!r}")

    def _input_name(self, idx: int) -> str:
        return self.graph.nodes[self.graph.arg_nodes[idx]].name

    @staticmethod
    def _copy_in(dst: np.ndarray, value: Any, what: str) -> None:
        if isinstance(value, (bytes, bytearray, memoryview)):
            raw = memoryview(value).cast("B")
            if raw.nbytes != dst.nbytes:
                raise ExecutorError(f"{what}: got {raw.nbytes} bytes, the input ({_describe(dst)}) "
                                    f"takes {dst.nbytes}")
            dst.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)
            return
        if not isinstance(value, np.ndarray):
            raise ExecutorError(f"{what}: expected an array, got {type(value).__name__}")
        if value.shape != dst.shape or value.dtype != dst.dtype:
            raise ExecutorError(f"{what}: expected {_describe(dst)}, got {_describe(value)}")
        np.copyto(dst, value)

    def run(self) -> None:
        """Run every op once, as one job of the compute policy (``compute``: a slot among the
        cores' and the BLAS threads that fit them)."""
        with compute.job(self._threads):
            for fn, args in self.op_execs:
                fn(*args)

    def run_from_inputs(self, device_type: Any, device_id: Any, *pairs: Any) -> list[np.ndarray]:
        """Set ``key, value`` pairs, run, and return copies of all outputs (TVM's convenience call)."""
        if len(pairs) % 2:
            raise ExecutorError("Number of arguments to run_from_inputs must be an even number of "
                                "key-value pairs")
        check_devices([Device(int(device_type), int(device_id))])
        for key, value in zip(pairs[::2], pairs[1::2]):
            self.set_input(key, value)
        self.run()
        return [self.data_entry[self._output_eid(i)].copy() for i in range(len(self.graph.heads))]

    def get_output(self, index: Any, out: Any = None) -> Optional[np.ndarray]:
        """Output ``index`` (a view of the executor's storage), or copy it into ``out``."""
        idx = self._output_index(index, "get_output")
        data = self.data_entry[self._output_eid(idx)]
        if out is None:
            return data
        if not isinstance(out, np.ndarray):
            raise ExecutorError(f"get_output: out must be an array, got {type(out).__name__}")
        if out.shape != data.shape or out.dtype != data.dtype:
            raise ExecutorError(f"get_output {idx}: out is {_describe(out)}, the output is {_describe(data)}")
        np.copyto(out, data)
        return None

    def get_input(self, key: Any) -> Optional[np.ndarray]:
        """Input ``key`` (name or index) as a view; None for an unknown name, as in TVM."""
        if isinstance(key, str) and key not in self.input_map:
            return None
        return self.data_entry[self._input_eid(self._input_index(key, "get_input"))]

    def get_num_outputs(self) -> int:
        return len(self.graph.heads)

    def get_num_inputs(self) -> int:
        return len(self.graph.arg_nodes)

    def _info(self, nids: list[int]) -> dict:
        g = self.graph
        shape = {g.nodes[nid].name: g.shape[g.entry_id(nid)] for nid in nids}
        dtype = {g.nodes[nid].name: g.dltype[g.entry_id(nid)] for nid in nids}
        return {"shape": shape, "dtype": dtype}

    def get_input_info(self) -> dict:
        """``{"shape": {name: shape}, "dtype": {name: dtype}}`` of inputs not loaded as params."""
        g = self.graph
        return self._info([nid for nid in g.arg_nodes if g.nodes[nid].name not in self.param_names])

    def get_output_info(self) -> dict:
        return self._info([nid for nid, _ in self.graph.heads])

    def load_params(self, blob: Any) -> None:
        """Load a TVM param dict (bytes) into the inputs of the same names; others are ignored."""
        params = _param_dict(blob, "load_params")
        for name, arr in params.items():
            self.param_names.add(name)
            idx = self.input_map.get(name, -1)
            if idx >= 0:
                self._copy_in(self.data_entry[self._input_eid(idx)], arr, f"load_params {name!r}")

    def share_params(self, other: Any, blob: Any) -> None:
        """Use ``other``'s arrays for the inputs named in the param dict ``blob`` (no copy)."""
        if not isinstance(other, GraphExecutorModule):
            got = getattr(other, "type_key", type(other).__name__)
            raise ExecutorError(f"share_params expects a GraphExecutor module, got {got}")
        for name in _param_dict(blob, "share_params"):
            idx = self.input_map.get(name, -1)
            oidx = other.input_map.get(name, -1)
            if idx < 0 or oidx < 0:
                continue
            eid, theirs = self._input_eid(idx), other.data_entry[other._input_eid(oidx)]
            if theirs.shape != self.data_entry[eid].shape or theirs.dtype != self.data_entry[eid].dtype:
                raise ExecutorError(f"share_params {name!r}: the other executor has {_describe(theirs)}, "
                                    f"this one needs {_describe(self.data_entry[eid])}")
            self.data_entry[eid] = theirs
        self._setup_op_execs()

    def _rebind(self, eid: int, value: Any, what: str) -> np.ndarray:
        own = self.data_entry[eid]
        if not isinstance(value, np.ndarray):
            raise ExecutorError(f"{what}: expected an array, got {type(value).__name__}")
        if value.shape != own.shape or value.dtype != own.dtype:
            raise ExecutorError(f"{what}: expected {_describe(own)}, got {_describe(value)}")
        if not value.flags.c_contiguous or not value.flags.writeable:
            raise ExecutorError(f"{what}: the array must be contiguous and writable")
        self.data_entry[eid] = value
        return value

    def set_input_zero_copy(self, key: Any, value: Any) -> None:
        """Let input ``key`` (and entries planned into its storage) use ``value``'s memory."""
        idx = self._input_index(key, "set_input_zero_copy")
        eid = self._input_eid(idx)
        arr = self._rebind(eid, value, f"set_input_zero_copy {self._input_name(idx)!r}")
        raw = arr.reshape(-1).view(np.uint8)
        g = self.graph
        for other in range(g.num_entries):
            if other != eid and g.storage_id[other] == g.storage_id[eid]:
                need = int(np.prod(g.shape[other], dtype=np.int64)) * g.dtypes[other].itemsize
                if need <= raw.nbytes:
                    self.data_entry[other] = self._view(raw, other)
        self._setup_op_execs()

    def set_output_zero_copy(self, key: Any, value: Any) -> None:
        """Let output ``key`` be computed straight into ``value``'s memory."""
        idx = self._output_index(key, "set_output_zero_copy")
        nid, _ = self.graph.heads[idx]
        eid = self._output_eid(idx)
        arr = self._rebind(eid, value, f"set_output_zero_copy {idx}")
        node = self.graph.nodes[nid]
        if node.op == "tvm_op" and node.func_name == "__nop":  # a reshape: its input holds the data
            src = self.graph.entry_id(*node.inputs[0])
            self.data_entry[src] = self._view(arr.reshape(-1).view(np.uint8), src)
        self._setup_op_execs()


def _op_exec(fn: Any, args: list[np.ndarray]) -> tuple:
    """One step of ``run``: a native host function gets its DLTensors over the storage built once
    (``fn.bind``, see ``rpcsrv.native``); anything else is called with the arrays."""
    bind = getattr(fn, "bind", None)
    if bind is not None and all(a.flags.c_contiguous for a in args):
        return (bind(*args), ())
    return (fn, args)


def _param_dict(blob: Any, what: str) -> dict[str, np.ndarray]:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ExecutorError(f"{what} expects the bytes of a saved param dict, got {type(blob).__name__}")
    from ...loader import LoaderError, load_param_dict

    try:
        return load_param_dict(bytes(blob))
    except LoaderError as exc:
        raise ExecutorError(f"{what}: invalid parameters file format ({exc})") from exc


def op_exec_node_ids(graph: Graph) -> list[int]:
    """The graph node of each entry of ``GraphExecutorModule.op_execs``, in order (every
    ``tvm_op`` node but ``__nop``, as ``_setup_op_execs`` lays them out; the debug executor maps
    nodes to their calls with it)."""
    return [nid for nid, node in enumerate(graph.nodes)
            if node.op == "tvm_op" and node.func_name != "__nop"]


def parse_create_args(args: Sequence[Any], what: str) -> tuple[Any, RuntimeModule, list[Device]]:
    """The arguments of TVM's ``tvm.graph_executor.create`` (v0.19 ``graph_executor.cc``): the graph
    JSON text, the library module, optionally a linked-param lookup function (skipped: libraries
    for this board have no linked params), then the devices as ``device_type, device_id`` integer
    pairs.  Device values are accepted as well (what a tvm-ffi client passes most naturally)."""
    if len(args) < 3:
        raise ExecutorError(f"{what} expects (graph_json, module, device_type, device_id, ...), "
                            f"got {len(args)} argument(s)")
    graph_json, lib, rest = args[0], args[1], list(args[2:])
    if not isinstance(graph_json, (str, bytes)):
        raise ExecutorError(f"{what}: the first argument must be the graph JSON text, got "
                            f"{type(graph_json).__name__}")
    if not isinstance(lib, RuntimeModule):
        raise ExecutorError(f"{what}: the second argument must be a module (the loaded library), got "
                            f"{type(lib).__name__}")
    if rest and callable(rest[0]) and not isinstance(rest[0], RuntimeModule):
        rest = rest[1:]
    devices: list[Device] = []
    while rest:
        first = rest.pop(0)
        if isinstance(first, Device):
            devices.append(first)
            continue
        if isinstance(first, bool) or not isinstance(first, (int, np.integer)) or not rest \
                or isinstance(rest[0], bool) or not isinstance(rest[0], (int, np.integer)):
            raise ExecutorError(f"{what}: devices must follow as device_type, device_id integer pairs")
        devices.append(Device(int(first), int(rest.pop(0))))
    return graph_json, lib, check_devices(devices)


def create_graph_executor(*args: Any, allocate: Callable[[int], np.ndarray] = zeros) -> GraphExecutorModule:
    """``tvm.graph_executor.create(graph_json, lib, device_type, device_id, ...)``: an executor for a
    graph sent as text over the functions of an uploaded library; params come by ``load_params``."""
    graph_json, lib, devices = parse_create_args(args, "tvm.graph_executor.create")
    return GraphExecutorModule(graph_json, lib, devices, allocate=allocate)
