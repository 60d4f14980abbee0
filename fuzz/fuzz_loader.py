"""atheris target: the library loader (containers, blob layouts, module payloads).

    python fuzz/fuzz_loader.py -max_total_time=3600 -timeout=5 -rss_limit_mb=2048

Any exception but LoaderError is a crash; so is a run over 5 s or 2 GB (a claimed size trusted).
Seeds: raw blobs of both layouts built by rpcsrv.loader.build_blob, and every library under
tests/data, if any.
"""

from __future__ import annotations

from common import run

from rpcsrv.loader import LoaderError
from rpcsrv.loader.inspect import inspect_library


def test_one(data: bytes) -> None:
    try:
        inspect_library(data)
    except LoaderError:
        pass


def seeds():
    from exec_helpers import SEED, seed_graph_json

    from rpcsrv.loader import (ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule,
                               HostLibraryModule, build_blob)

    tree = GraphExecutorFactoryModule(graph_json=seed_graph_json(), params={}, module_name="default", imports=[
        HostLibraryModule(symbols=[], imports=[ConstLoaderModule({}, {"subgraph_0": []},
                                                                 imports=[ExampleJSONModule(code=SEED)])])])
    for layout in ("classic", "ffi"):
        blob = build_blob(tree, layout)
        yield len(blob).to_bytes(8, "little") + blob


if __name__ == "__main__":
    run("loader", test_one, seeds())
