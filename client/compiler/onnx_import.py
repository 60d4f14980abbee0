"""ONNX → the compiler's graph IR: nodes in execution order, every tensor with a static shape.

The ``onnx`` library does the heavy lifting: parsing, the checker, shape inference.  We first put the
user's concrete input shapes into the graph inputs (dynamic dimensions such as ``N`` or unnamed ones
must be given), then run ``onnx.shape_inference.infer_shapes`` so that every tensor has a static
shape and dtype, which the graph JSON and the ExampleJSON text both need.  Initializers and
``Constant`` nodes become constants (later: the const loader's arrays).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rpcsrv.protocol.dtypes import dtype_str, numpy_dtype

from . import contrib_shapes
from .errors import CompileError, no_static_shape
from .fold import attr_value, fold_constants
from .ir import Graph, Node, TensorInfo
from .opsets import upgrade_nodes

#: Default-domain opsets we accept: all that the installed ``onnx`` knows.  Kernels take an op's
#: current attributes and inputs; a node of an old version with other attributes is reported as
#: unsupported by name (the partitioner checks attribute names against the kernel).
MIN_OPSET = 1
ONNX_DOMAINS = ("", "ai.onnx")
MAX_FOLD_ROUNDS = 32


def load_model(model_or_path) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, a path or the serialized bytes, with clear errors."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (bytes, bytearray)):
        data, where = bytes(model_or_path), "the given bytes"
    elif isinstance(model_or_path, (str, os.PathLike)):
        where = os.fspath(model_or_path)
        try:
            with open(where, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise CompileError(f"cannot read ONNX file {where!r}: {exc.strerror or exc}") from None
    else:
        raise CompileError(f"expected an onnx.ModelProto, a path or bytes, got {type(model_or_path).__name__}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise CompileError(f"{where} is not a valid ONNX file (truncated or not ONNX?): {exc}") from None
    if not model.HasField("graph") or not model.graph.node and not model.graph.output:
        raise CompileError(f"{where} holds no ONNX graph (truncated or not an ONNX model file?)")
    if isinstance(model_or_path, (str, os.PathLike)):
        _load_external_data(model, os.path.dirname(os.path.abspath(where)), where)
    return model


def _load_external_data(model: onnx.ModelProto, folder: str, where: str) -> None:
    """Tensors stored in files beside the model (ONNX external data) are read relative to the
    model's own folder, wherever the compiler runs from."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    every = list(model.graph.initializer) + [a.t for n in model.graph.node for a in n.attribute
                                             if a.type == onnx.AttributeProto.TENSOR]
    tensors = [t for t in every if uses_external_data(t)]
    if not tensors:
        return
    for t in tensors:
        location = next((e.value for e in t.external_data if e.key == "location"), "")
        path = os.path.normpath(os.path.join(folder, location))
        if not location or not os.path.isfile(path):
            raise CompileError(f"{where}: tensor {t.name!r} keeps its data in {location!r}, which is not "
                               f"in the model's folder {folder!r}")
    try:
        load_external_data_for_model(model, folder)
    except Exception as exc:  # onnx checks the paths stay inside the folder, and the lengths
        raise CompileError(f"{where}: cannot read external data: {exc}") from None


def _opset(model: onnx.ModelProto) -> int:
    newest = onnx.defs.onnx_opset_version()
    versions = {o.domain: o.version for o in model.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        raise CompileError("the model imports no default-domain ONNX opset (expected opset_import "
                           "with domain '' or 'ai.onnx')")
    if not MIN_OPSET <= version <= newest:
        raise CompileError(f"ONNX opset {version} is not supported (supported: {MIN_OPSET}..{newest}); "
                           f"convert the model with onnx.version_converter.convert_version")
    return version


def parse_shape(text: str) -> tuple[int, ...]:
    """``1x3x224x224`` (or ``1,3,224,224``; empty for a scalar) as a tuple of ints."""
    parts = [p for p in text.replace(",", "x").split("x") if p.strip()] if text.strip() else []
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise CompileError(f"bad shape {text!r}: expected dimensions like 1x3x224x224") from None
    if any(d < 0 for d in dims):
        raise CompileError(f"bad shape {text!r}: dimensions must be >= 0")
    return dims


def _shape_arg(name: str, value) -> tuple[int, ...]:
    """A shape from the API: ``"1x3x8x8"`` or a sequence of non-negative ints."""
    if isinstance(value, str):
        return parse_shape(value)
    try:
        dims = tuple(int(d) for d in value)
    except (TypeError, ValueError):
        raise CompileError(f"input {name!r}: shape {value!r} is not a sequence of integers") from None
    if any(d < 0 for d in dims):
        raise CompileError(f"input {name!r}: shape {value!r} has negative dimensions")
    return dims


def _set_input_shapes(model: onnx.ModelProto, input_shapes: dict, initializers: set) -> None:
    """Write concrete shapes into the graph inputs; refuse dynamic dims nobody gave."""
    graph_inputs = {vi.name: vi for vi in model.graph.input if vi.name not in initializers}
    unknown = sorted(set(input_shapes) - set(graph_inputs))
    if unknown:
        raise CompileError(f"--input-shape names {', '.join(unknown)}, which the model has no input for "
                           f"(inputs: {', '.join(graph_inputs) or 'none'})")
    for name, vi in graph_inputs.items():
        ttype = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise CompileError(f"model input {name!r} is not a tensor (sequences and maps are not supported)")
        if name in input_shapes:
            shape = _shape_arg(name, input_shapes[name])
            given = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
            if ttype.HasField("shape") and (len(given) != len(shape) or any(
                    g is not None and g != s for g, s in zip(given, shape))):
                shown = "x".join("?" if g is None else str(g) for g in given)
                raise CompileError(f"input {name!r}: shape {'x'.join(map(str, shape))} does not fit "
                                   f"the model's {shown or 'scalar'}")
        else:
            dims = ttype.shape.dim
            missing = not ttype.HasField("shape") or any(not d.HasField("dim_value") for d in dims)
            if missing:
                known = ttype.HasField("shape")
                shown = "x".join(d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
                                 for d in dims) if known else "unknown rank"
                example = "x".join(str(d.dim_value) if d.HasField("dim_value") else "1" for d in dims) \
                    if known else "1x3x224x224"
                raise CompileError(f"input {name!r} has a dynamic shape ({shown}); give a concrete one, "
                                   f"e.g. --input-shape {name}={example}")
            continue
        ttype.ClearField("shape")
        ttype.shape.SetInParent()
        for d in shape:
            ttype.shape.dim.add().dim_value = d


def board_dtype(np_dtype) -> str | None:
    """TVM's dtype string for a numpy dtype the board can hold (and send), else None."""
    try:
        return _board_dtype(np.dtype(np_dtype))
    except TypeError:
        return None


@functools.lru_cache(maxsize=None)
def _board_dtype(np_dtype: np.dtype) -> str | None:
    try:
        name = dtype_str(np.dtype(np_dtype))
        numpy_dtype(name)
        return name
    except Exception:
        return None


def _elem_dtype(elem_type: int, what: str) -> str:
    try:
        np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:
        np_dtype = None
    name = board_dtype(np_dtype) if np_dtype is not None else None
    if name is None:
        label = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() \
            else str(elem_type)
        raise CompileError(f"{what} has element type {label}, which the board has no dtype for "
                           f"(supported: bool, (u)int8..64, float16/32/64)")
    return name


def _tensor_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
        return None
    return TensorInfo(tuple(d.dim_value for d in tt.shape.dim), _elem_dtype(tt.elem_type, f"tensor {vi.name!r}"))


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference (:func:`_infer_onnx`), completed for onnxruntime's com.microsoft quantized ops."""
    return contrib_shapes.infer_shapes(model, _infer_onnx)


def _infer_onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference, strict first; when strict mode trips over a detail (e.g. inside a
    function body) the lenient result is used and tensors left unknown are reported later."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        strict_error = str(exc).strip()
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False, data_prop=True)
    except Exception:
        raise CompileError(f"ONNX shape inference failed: {strict_error}") from None


def import_onnx(model_or_path, input_shapes: dict | None = None,
                bind_inputs: dict | None = None) -> Graph:
    """The model as a :class:`Graph` with static shapes.

    ``input_shapes`` maps input names to concrete shapes (needed for dynamic dimensions);
    ``bind_inputs`` turns graph inputs into constants with the given values (TVM's bind-params
    step, for inputs such as a Reshape target shape that the model takes at run time).
    """
    model = onnx.ModelProto()
    model.CopyFrom(load_model(model_or_path))
    opset = _opset(model)
    graph = model.graph
    for name, value in (bind_inputs or {}).items():
        if not any(vi.name == name for vi in graph.input):
            raise CompileError(f"cannot bind {name!r}: the model has no such input")
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    initializers = {t.name for t in graph.initializer}
    _check_names(graph, initializers)
    _set_input_shapes(model, dict(input_shapes or {}), initializers)
    model = _infer(model)
    for _ in range(MAX_FOLD_ROUNDS):
        if not fold_constants(model):
            break
        model = _infer(model)
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    constants = {}
    for t in graph.initializer:
        try:
            constants[t.name] = numpy_helper.to_array(t)
        except Exception as exc:
            raise CompileError(f"initializer {t.name!r} cannot be read: {exc}") from None
    tensors = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        info = _tensor_info(vi)
        if info is not None:
            tensors[vi.name] = info
    for name, arr in constants.items():
        dtype = board_dtype(arr.dtype)
        if dtype is None:
            raise CompileError(f"constant {name!r} has dtype {arr.dtype}, which the board has no dtype for")
        tensors[name] = TensorInfo(tuple(arr.shape), dtype)
    result = _to_graph(model, opset, constants, tensors, initializers)
    upgrade_nodes(result)
    return result


def _to_graph(model, opset, constants, tensors, initializers) -> Graph:
    graph = model.graph
    nodes, names = [], set()
    for i, n in enumerate(graph.node):
        name = n.name or f"{n.op_type}_{i}"
        if name in names:
            name = f"{name}_{i}"
        names.add(name)
        attrs = {a.name: attr_value(a) for a in n.attribute}
        _normalize(n, attrs)
        nodes.append(Node(name, n.op_type, n.domain, list(n.input), list(n.output), attrs))
    inputs = [vi.name for vi in graph.input if vi.name not in initializers]
    outputs = [vi.name for vi in graph.output]
    _drop_unused_outputs(nodes, outputs)
    unknown = [(n, o) for n in nodes for o in n.outputs if o and o not in tensors]
    if unknown:
        raise no_static_shape([(n.name, n.op_type, o) for n, o in unknown])
    return Graph(graph.name or "model", inputs, outputs, nodes, tensors, constants, opset)


def _drop_unused_outputs(nodes: list[Node], outputs: list[str]) -> None:
    """Optional outputs nobody reads become absent (``""``): old ops such as Dropout-7's ``mask`` or
    BatchNormalization-6's running statistics have no inferred shape and are never computed here."""
    read = {i for n in nodes for i in n.inputs} | set(outputs)
    for n in nodes:
        n.outputs = [o if k == 0 or o in read else "" for k, o in enumerate(n.outputs)]


def _normalize(node: onnx.NodeProto, attrs: dict) -> None:
    """Spell older op versions the current way, where the meaning is the same."""
    if node.op_type == "Split" and "split" not in attrs and "num_outputs" not in attrs \
            and (len(node.input) < 2 or not node.input[1]):
        attrs["num_outputs"] = len(node.output)  # before opset 18: equal parts, one per output
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        attrs["return_indices"] = 1  # the optional Indices output is used
    if node.op_type == "ConstantOfShape":
        for a in node.attribute:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                # JSON keeps the fill number but not its element type: say it beside the value
                attrs["dtype"] = str(helper.tensor_dtype_to_np_dtype(a.t.data_type))


def _check_names(graph: onnx.GraphProto, initializers: set) -> None:
    """Each tensor is produced once and before use (ONNX's rules); say which name breaks them."""
    produced: dict[str, str] = {}
    for vi in graph.input:
        if vi.name in produced:
            raise CompileError(f"name collision: two model inputs are called {vi.name!r}")
        produced[vi.name] = "constant" if vi.name in initializers else "model input"
    for name in initializers:
        produced.setdefault(name, "constant")
    for i, n in enumerate(graph.node):
        label = n.name or f"#{i} ({n.op_type})"
        for inp in n.input:
            if inp and inp not in produced:
                raise CompileError(f"node {label!r} ({n.op_type}) reads {inp!r}, which no earlier node, "
                                   f"input or constant produces (nodes must be in topological order)")
        for o in n.output:
            if not o:
                continue
            if o in produced:
                raise CompileError(f"name collision: tensor {o!r} is produced by node {label!r} and is "
                                   f"already a {produced[o]}; every tensor name must be unique")
            produced[o] = f"output of node {label!r}"
    for vi in graph.output:
        if vi.name not in produced:
            raise CompileError(f"model output {vi.name!r} is not produced by any node")
