"""Libraries for the debug-executor tests: the BYOC guide's seed subgraph under TVM's symbol name,
and a graph of several ExampleJSON calls (so per-node outputs and timings have something to say)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent.parent
for sub in ("executor", "loader", "server", "interop"):
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))

from exec_helpers import SEED, GraphBuilder, seed_graph_json  # noqa: E402
from loader_fixtures import compile_library  # noqa: E402
from rpcsrv.loader import (BLOB_SYMBOL, ConstLoaderModule, ExampleJSONModule,  # noqa: E402
                           GraphExecutorFactoryModule, HostLibraryModule, build_blob)

#: the symbol TVM's Relay codegen gave the seed subgraph in the recorded session
TVM_SYMBOL = "tvmgen_default_examplejson_main_0"


def seed_tree(symbol: str = TVM_SYMBOL):
    ej = ExampleJSONModule(code=SEED.replace("subgraph_0", symbol))
    const = ConstLoaderModule(arrays={}, const_vars_by_symbol={symbol: []}, imports=[ej])
    host = HostLibraryModule(symbols=[], imports=[const])
    return GraphExecutorFactoryModule(graph_json=seed_graph_json(symbol), params={}, module_name="default",
                                      imports=[host])


def seed_library(out: Path, symbol: str = TVM_SYMBOL) -> Path:
    return compile_library(build_blob(seed_tree(symbol)), BLOB_SYMBOL, "host", out)


N = 64
#: three subgraphs: a matmul chain (the slow node), an elementwise one and a reduction-free tail
CHAIN = f"""mm_0
  input 0 {N} {N}
  input 1 {N} {N}
  matmul 2 inputs: 0 1 shape: {N} {N}
  matmul 3 inputs: 2 1 shape: {N} {N}
  matmul 4 inputs: 3 1 shape: {N} {N}
ew_1
  input 0 {N} {N}
  input 1 {N} {N}
  add 2 inputs: 0 1 shape: {N} {N}
  mul 3 inputs: 2 2 shape: {N} {N}
tail_2
  input 0 {N} {N}
  input 1 {N} {N}
  sub 2 inputs: 0 1 shape: {N} {N}
"""


def chain_graph_json() -> str:
    """x, w, b (inputs and a param ``w``) → mm_0(x, w) → ew_1(mm, b) → tail_2(ew, x)."""
    g = GraphBuilder()
    x, w, b = g.input("x", (N, N)), g.input("w", (N, N)), g.input("b", (N, N))
    f32 = [((N, N), "float32")]
    mm = g.op("mm_0", [x, w], f32)
    ew = g.op("ew_1", [mm, b], f32)
    out = g.op("tail_2", [ew, x], f32)
    return g.json([out])


def chain_reference(x, w, b):
    mm = ((x @ w) @ w) @ w
    ew = (mm + b) * (mm + b)
    return [mm, ew, ew - x]


def chain_library(out: Path, params: dict | None = None) -> Path:
    """The chain model as a factory library (``params`` go into the factory, e.g. ``{"w": ...}``)."""
    ej = ExampleJSONModule(code=CHAIN)
    const = ConstLoaderModule(arrays={}, const_vars_by_symbol={s: [] for s in ("mm_0", "ew_1", "tail_2")},
                              imports=[ej])
    host = HostLibraryModule(symbols=[], imports=[const])
    tree = GraphExecutorFactoryModule(graph_json=chain_graph_json(), params=dict(params or {}),
                                      module_name="default", imports=[host])
    return compile_library(build_blob(tree), BLOB_SYMBOL, "host", out)


def chain_inputs(seed: int = 3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((N, N)) * 0.2).astype("float32") for _ in range(3)]
