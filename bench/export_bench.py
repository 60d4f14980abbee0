"""Exporter benchmark: how long writing a library with large weights takes, per output format.

    python bench/export_bench.py [--size-mb 64] [--repeat 3] [--cc CC] [--formats so,tar,tar.gz,blob]

Builds a graph executor factory whose params total ``--size-mb`` MB (random float32, so they do
not compress) and times ``client.export.export_library`` to each format, best of ``--repeat``,
against the anchor ``blob``: building the blob and writing it as a raw blob file.

Target: ``so`` and ``tar`` within a small multiple of ``blob`` (the symbol's bytes go to the
assembler with ``.incbin``; no C compiler reads a 64 MB array).  ``tar.gz`` adds gzip's time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from client.export import export_library  # noqa: E402
from rpcsrv.loader import (  # noqa: E402
    ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, load_library,
)


def make_tree(size_mb: int) -> GraphExecutorFactoryModule:
    rng = np.random.default_rng(0)
    n_params = 16
    per = size_mb * (1 << 20) // n_params // 4
    params = {f"p{i}": rng.standard_normal(per, dtype=np.float32) for i in range(n_params)}
    ej = ExampleJSONModule("ext0\n  input 0 4\n  const 1 4 name: c0\n  add 2 inputs: 0 1 shape: 4\n")
    consts = ConstLoaderModule({"c0": np.ones(4, np.float32)}, {"ext0": ["c0"]}, imports=[ej])
    return GraphExecutorFactoryModule('{"nodes": []}', params, imports=[HostLibraryModule(imports=[consts])])


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cc", default=None, help="C compiler (default: cc, gcc or clang)")
    ap.add_argument("--formats", default="blob,so,tar,tar.gz")
    args = ap.parse_args()
    tree = make_tree(args.size_mb)
    with tempfile.TemporaryDirectory() as tmp:
        anchor = None
        for suffix in args.formats.split(","):
            path = Path(tmp) / f"model.{suffix}"
            t = best(lambda: export_library(tree, path, cc=args.cc), args.repeat)
            anchor = anchor or t
            lib = load_library(path)
            assert sum(a.nbytes for a in lib.root.params.values()) >= args.size_mb << 20
            print(f"{suffix:7s} {path.stat().st_size / 1e6:7.1f} MB  export {t:7.3f} s "
                  f"({t / anchor:5.1f}x blob)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
