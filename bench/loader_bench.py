"""Loader benchmark: load a ~100 MB library against a plain read of the same file.

    python bench/loader_bench.py [--size-mb 100] [--repeat 5]

Builds, in a temporary directory, a graph executor factory whose params total ``--size-mb`` MB
(plus an ExampleJSON module and a const loader), as a raw blob file and as an ELF shared object
(``rpcsrv.client.export``, which pulls the blob in with ``.incbin``).  Then measures, best of
``--repeat`` with a warm page cache:

  * ``read``: ``open(path, "rb").read()`` (the anchor);
  * ``load``: ``load_library(path)`` (map, find the symbol, decode the tree; params are views);
  * ``load+touch``: ``load_library`` and then summing every parameter byte (forces each page in).

Target: ``load`` <= 2x ``read``.  Prints the figures and the ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rpcsrv.client.export import export_library, find_compiler  # noqa: E402
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


def write_files(work: Path, size_mb: int) -> dict[str, Path]:
    """The tree as a raw blob file and, when a C compiler is found, as the exporter's ``.so``."""
    tree = make_tree(size_mb)
    files = {"raw": Path(export_library(tree, work / "model.blob"))}
    if find_compiler():
        files["elf"] = Path(export_library(tree, work / "model.so"))
    return files


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def touch(lib) -> float:
    return float(sum(np.sum(a, dtype=np.float64) for a in lib.root.params.values()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write_files(Path(tmp), args.size_mb)
        for kind, path in files.items():
            size = path.stat().st_size
            path.read_bytes()  # warm the page cache for every contender
            t_read = best(lambda: path.read_bytes(), args.repeat)
            t_load = best(lambda: load_library(path), args.repeat)
            t_touch = best(lambda: touch(load_library(path)), args.repeat)
            print(f"{kind:4s} {size / 1e6:7.1f} MB  read {t_read * 1e3:7.2f} ms  "
                  f"load {t_load * 1e3:7.2f} ms ({t_load / t_read:.2f}x read)  "
                  f"load+touch {t_touch * 1e3:7.2f} ms ({t_touch / t_read:.2f}x read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
