"""Exporter benchmark: how long writing a library with large weights takes, per output format.

    python bench/export_bench.py [--size-mb 64] [--repeat 3] [--cc CC] [--formats so,tar,tar.gz,blob]

Builds a graph executor factory whose params total ``--size-mb`` MB (random float32, so they do
not compress) and times ``rpcsrv.client.export.export_library`` to each format, best of ``--repeat``,
against the anchor ``blob``: building the blob and writing it as a raw blob file.

Target: ``so`` and ``tar`` within a small multiple of ``blob`` (the symbol's bytes go to the
assembler with ``.incbin``; no C compiler reads a 64 MB array).  ``tar.gz`` adds gzip's time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rpcsrv.client.export import export_library  # noqa: E402
from loader_bench import best, make_tree  # noqa: E402 (the same 16-param tree)
from rpcsrv.loader import load_library  # noqa: E402


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
