"""``byoc bench``: run the benchmarks in ``bench/`` (RPC transport, loader, executor).

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
    p.add_argument("--repeat", type=int, help="executor --zoo: interleaved runs per engine")
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
        for script in (folder / s for s in scripts):
            print(f"== {name}: {script.name}", flush=True)
            extra = []
            if name == "executor" and args.zoo:
                extra = ["--zoo"] + (["--repeat", str(args.repeat)] if args.repeat else [])
            status |= subprocess.call([sys.executable, str(script), *extra])
    return status
