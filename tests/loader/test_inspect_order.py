"""``rpcsrv inspect`` lists a library's external modules in the order of their functions (``main_0``, ``main_1``,
..., ``main_10``), while TVM's serializer numbers the modules a const loader imports last to first: the
indices shown stay the file's, the JSON keeps the file's order."""

from __future__ import annotations

import struct

import numpy as np

from rpcsrv.loader import (
    ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, build_blob,
)
from rpcsrv.loader.inspect import display_order, format_inspection, inspect_library

COUNT = 12


def _library() -> bytes:
    symbols = [f"tvmgen_default_examplejson_main_{k}" for k in range(COUNT)]
    subgraphs = [ExampleJSONModule(f"{s}\n  input 0 1 4\n  relu 1 inputs: 0 shape: 1 4\n  output 1\n") for s in symbols]
    consts = ConstLoaderModule({"c": np.zeros(4, np.float32)}, {s: [] for s in symbols}, imports=subgraphs)
    root = GraphExecutorFactoryModule("{}", {}, imports=[HostLibraryModule(imports=[consts])])
    blob = build_blob(root)
    return struct.pack("<Q", len(blob)) + blob


def test_modules_in_function_order():
    info = inspect_library(_library())
    first = [m["exports"]["functions"][0] for m in info["modules"] if "exports" in m]
    assert first[0].endswith("main_11") and first[-1].endswith("main_0")  # the file's order: last to first
    text = format_inspection(info).splitlines()
    tree = [line for line in text if line.startswith("  [") and "examplejson" in line]
    assert [line.rsplit("_", 1)[1] for line in tree] == [str(k) for k in range(COUNT)]
    assert tree[0].startswith(f"  [{len(info['modules']) - 1}] examplejson (plugin examplejson): ")
    details = [line for line in text if line.startswith("[") and "examplejson" in line]
    assert [int(line.split("]")[0][1:]) for line in details] == [m["index"] for m in info["modules"]
                                                                 if "exports" in m][::-1]


def test_display_order_is_numeric_and_keeps_other_modules_in_place():
    def mod(index, *functions):
        return {"index": index, **({"exports": {"functions": list(functions)}} if functions else {})}

    modules = [mod(0), mod(1, "f_main_10"), mod(2), mod(3, "f_main_2"), mod(4, "f_main_1")]
    assert [m["index"] for m in display_order(modules)] == [0, 4, 2, 3, 1]
