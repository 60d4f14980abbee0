"""``byoc bench``: run the benchmarks in ``bench/`` (RPC transport, loader, executor).

``byoc bench executor --quant`` runs the int8 benchmark (``bench/quant_bench.py``: onnxruntime-quantized models
against onnxruntime's int8).  ``byoc bench rpc`` also prints where one small call's time goes on the server, layer
by layer
(``bench/rpc_layers.py``); ``--baseline SRC`` runs an older checkout beside it for before/after.

The benchmarks are scripts in the source tree (``bench/*.py``), run by hand or through here; they
print their figures and the ratios against the anchors (TVM's own RPC server, a plain file read,
onnxruntime).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

#: name -> its script(s); rpc: the transport, then native kernel calls (both against TVM's own server)
BENCHES = {"rpc": ("rpc_bench.py", "native_call_bench.py"), "loader": "loader_bench.py",
           "executor": "executor_bench.py", "concurrency": "concurrency_bench.py"}


def bench_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "bench"


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run the benchmarks in bench/ (rpc, loader, executor, concurrency)",
                       description="Run the benchmarks of a source checkout's bench/ folder and print their "
                                   "figures: rpc (against TVM's own RPC server, needs apache-tvm), loader "
                                   "(against a plain file read), executor (against onnxruntime; --zoo: real model "
                                   "topologies), concurrency (K sessions running a model over RPC).")
    p.add_argument("which", nargs="*", choices=[*BENCHES, "all"], default=["all"],
                   help="which benchmarks (default: all)")
    p.add_argument("--zoo", action="store_true",
                   help="executor: the light model zoo and an encoder against onnxruntime (bench/zoo_bench.py)")
    p.add_argument("--quant", action="store_true",
                   help="executor: onnxruntime-quantized models (int8: ResNet-18, MobileNetV2 in QDQ and QOperator, "
                        "a MiniLM-style encoder by quantize_dynamic) against onnxruntime's int8, one thread each, on "
                        "each CPU placement (bench/quant_bench.py)")
    p.add_argument("--repeat", type=int, help="executor --zoo / --quant: interleaved runs per engine")
    p.add_argument("--baseline", metavar="SRC",
                   help="rpc: also serve rpcsrv from this checkout (an older commit) in the same interleaved "
                        "rounds, and print both per-layer breakdowns (before/after)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    folder = bench_dir()
    if not folder.is_dir():
        print(f"byoc bench: error: no bench/ folder next to the installed package ({folder}); "
              "run it from a source checkout", file=sys.stderr)
        return 2
    names = list(BENCHES) if "all" in args.which else args.which
    status = 0
    for name in names:
        scripts = BENCHES[name] if isinstance(BENCHES[name], tuple) else (BENCHES[name],)
        if name == "executor" and getattr(args, "quant", False):
            scripts = ("quant_bench.py",)
        for script in (folder / s for s in scripts):
            print(f"== {name}: {script.name}", flush=True)
            extra = []
            if script.name == "quant_bench.py":
                extra = ["--repeat", str(args.repeat)] if args.repeat else []
            elif name == "executor" and args.zoo:
                extra = ["--zoo"] + (["--repeat", str(args.repeat)] if args.repeat else [])
            if name == "rpc" and getattr(args, "baseline", None):
                extra = ["--baseline", args.baseline]  # both rpc scripts serve a baseline checkout beside
            status |= subprocess.call([sys.executable, str(script), *extra])
    return status
