"""Debug-executor benchmark: does timing node by node add up to a plain run?

Builds in-process a graph of ``--nodes`` ExampleJSON subgraphs (each a ``--size``x``--size`` matmul
followed by an add and a relu, chained), runs it in rpcsrv's debug graph executor and compares:

* the sum over nodes of ``run_individual`` (best of ``--repeat`` rounds of ``--number`` calls) with
  the best plain ``run`` measured the same way — the goal is within 20 %;
* the sum of the ExampleJSON kernel times inside each node (``rpcsrv_profile_steps``, through the
  step hook) with the node's own time — what the hook and the subgraph wrapper cost.

    python bench/debug_bench.py [--nodes 8] [--size 128] [--number 5] [--repeat 20] [--threads 1]

Prints one JSON line; exits 1 when the node sum is off by more than 20 %.  BLAS runs on ``--threads``
threads (default 1, set before numpy starts): on a loaded 2-core machine a multithreaded OpenBLAS
made every matmul wait for its threads to be scheduled (measured: plain run 6.7 ms with 2 threads
against 0.5 ms with 1, the node-by-node sum 0.7 ms), which says nothing about the debug executor.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

_threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "1"
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _threads)  # before numpy's BLAS starts

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rpcsrv.executor.graph.debug import GraphExecutorDebugModule, time_calls  # noqa: E402
from rpcsrv.executor.examplejson.subgraphs import ExampleJSONRuntime  # noqa: E402
from rpcsrv.executor.module import RuntimeModule  # noqa: E402
from rpcsrv.protocol.dtypes import Device  # noqa: E402


def chain(nodes: int, n: int) -> tuple[str, str]:
    """ExampleJSON text and graph JSON for ``nodes`` chained subgraphs relu(x @ w + b)."""
    code = "".join(f"sg_{k}\n  input 0 {n} {n}\n  input 1 {n} {n}\n  input 2 {n} {n}\n"
                   f"  matmul 3 inputs: 0 1 shape: {n} {n}\n  add 4 inputs: 3 2 shape: {n} {n}\n"
                   f"  relu 5 inputs: 4 shape: {n} {n}\n" for k in range(nodes))
    graph = {"nodes": [{"op": "null", "name": name, "inputs": []} for name in ("x", "w", "b")],
             "arg_nodes": [0, 1, 2]}
    prev = 0
    for k in range(nodes):
        graph["nodes"].append({"op": "tvm_op", "name": f"sg_{k}", "inputs": [[prev, 0, 0], [1, 0, 0], [2, 0, 0]],
                               "attrs": {"func_name": f"sg_{k}", "num_inputs": "3", "num_outputs": "1",
                                         "flatten_data": "0"}})
        prev = len(graph["nodes"]) - 1
    total = len(graph["nodes"])
    graph.update(heads=[[prev, 0, 0]], node_row_ptr=list(range(total + 1)),
                 attrs={"shape": ["list_shape", [[n, n]] * total], "dltype": ["list_str", ["float32"] * total],
                        "storage_id": ["list_int", list(range(total))]})
    return code, json.dumps(graph)


class Lib(RuntimeModule):
    type_key = "bench_lib"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--number", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    args = ap.parse_args()
    code, graph = chain(args.nodes, args.size)
    dbg = GraphExecutorDebugModule(graph, Lib([ExampleJSONRuntime(code)]), [Device(1, 0)])
    rng = np.random.default_rng(0)
    for name in ("x", "w", "b"):
        dbg.set_input(name, (rng.standard_normal((args.size, args.size)) * 0.1).astype(np.float32))
    blob = dbg.run_individual(args.number, args.repeat)
    (count,) = struct.unpack_from("<q", blob)
    per_node = np.frombuffer(blob, "<f8", offset=8).reshape(count, args.repeat)
    node_sum = float(per_node.min(axis=1).sum())
    plain = min(time_calls(dbg.run, args.number, args.repeat))
    steps = json.loads(dbg.profile_steps(args.number, args.repeat))["nodes"]
    node_best = sum(min(n["seconds"]) for n in steps)
    kernel_best = sum(min(s["seconds"]) for n in steps for s in n["steps"])
    ratio = node_sum / plain
    print(json.dumps({"nodes": args.nodes, "size": args.size, "threads": args.threads,
                      "plain_run_us": round(plain * 1e6, 1),
                      "node_sum_us": round(node_sum * 1e6, 1), "node_sum_over_run": round(ratio, 3),
                      "kernel_sum_over_node_sum_with_hook": round(kernel_best / node_best, 3)}))
    return 0 if abs(ratio - 1) <= 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
