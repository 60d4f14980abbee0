"""The files one request crosses on the server, traced (``sys.setprofile``) on a real session, the server in a
fresh interpreter: the walks docs/architecture.md draws.  A request that starts crossing another file fails
here, so the picture and the code stay one: a small call (``tvm.rpc.server.workpath``), a graph executor's
``run()`` (the walk of docs/architecture.md, its kernels as one), and a native kernel called in the session's
worker process (the server's side; the worker adds ``worker.py``, ``budget.py`` and the kernel's ``library.py``,
and shares ``wire.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import trio

from rpcsrv import check
from rpcsrv.board.options import ServeOptions
from rpcsrv.board.server import Server, serve
from rpcsrv.client import rpc
from rpcsrv.loader import ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule, build_blob

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "native"), str(Path(__file__).resolve().parent.parent)]
from native_helpers import build_c  # noqa: E402

PACKAGE = Path(check.__file__).resolve().parent

#: the files each request crosses, in the order first entered (docs/architecture.md)
PATHS = {
    "small call": ["board/server.py", "protocol/connection.py", "board/transport.py", "board/session.py",
                   "board/globals.py", "board/workspace.py", "protocol/outgoing.py", "protocol/kinds.py"],
    "graph run": ["board/server.py", "board/transport.py", "protocol/connection.py", "board/session.py",
                  "executor/graph/executor.py", "executor/compute.py", "executor/examplejson/subgraphs.py",
                  "executor/kernels/", "protocol/outgoing.py", "protocol/kinds.py"],
    "native call": ["board/server.py", "board/transport.py", "protocol/connection.py", "board/session.py",
                    "native/proxy.py", "native/wire.py", "native/shm.py", "board/accounts.py", "board/baton.py",
                    "protocol/outgoing.py", "protocol/kinds.py"],
}


def _library(folder: Path) -> Path:
    tree = GraphExecutorFactoryModule(check._graph_json(), {}, imports=[HostLibraryModule([], imports=[
        ExampleJSONModule(check._EJ)])])
    blob = build_blob(tree)
    path = folder / "graph.blob"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob)
    return path


def _walks(kernel: Path, graph: Path) -> dict[str, list[str]]:
    """The files (relative to rpcsrv/; the kernels' as one ``executor/kernels/``) each request entered."""
    seen: dict[str, list[str]] = {}
    state = {"label": None, "client": None}

    def profile(frame, event, _arg):
        if event != "call" or state["label"] is None or threading.get_ident() == state["client"]:
            return
        path = Path(frame.f_code.co_filename)
        if PACKAGE not in path.parents or "client" in path.relative_to(PACKAGE).parts[:1]:
            return
        rel = str(path.relative_to(PACKAGE))
        rel = "executor/kernels/" if rel.startswith("executor/kernels/") else rel
        files = seen.setdefault(state["label"], [])
        if rel not in files:
            files.append(rel)

    def client(port: int) -> None:
        state["client"] = threading.get_ident()
        with rpc.connect("127.0.0.1", port) as sess:
            sess.upload(str(graph))
            run = sess.load_module(graph.name)["default"](sess.cpu(0))["run"]
            sess.upload(str(kernel))
            add_one = sess.load_module(kernel.name)["add_one"]
            a, b = sess.array(np.ones(16, "float32")), sess.empty((16,))
            workpath = sess.get_function("tvm.rpc.server.workpath")
            for label, call in (("small call", lambda: workpath("x")), ("graph run", run),
                                ("native call", lambda: add_one(a, b))):
                call()
                workpath("y")  # (another request between: the native call is not lent, see baton.py)
                state["label"] = label
                call()
                state["label"] = None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve, Server(ServeOptions(port=0, native=_isolated())))
            await trio.to_thread.run_sync(client, port)
            nursery.cancel_scope.cancel()

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        trio.run(main)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


def _isolated():
    from rpcsrv.board.options import NativeOptions

    return NativeOptions("isolated", "native")


@pytest.fixture(scope="module")
def walks(tmp_path_factory):
    """The walks, traced in a fresh interpreter (no thread started before the trace: each is traced)."""
    folder = tmp_path_factory.mktemp("path")
    kernel = build_c("c_target_kernels", folder)
    done = subprocess.run([sys.executable, __file__, str(kernel), str(folder)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("request_name", list(PATHS))
def test_a_request_crosses_the_files_the_architecture_draws(walks, request_name):
    """The same files (the order they are first entered in may vary: which of the transport and the connection
    a request meets first depends on whether it was read already)."""
    assert sorted(walks[request_name]) == sorted(PATHS[request_name]), walks[request_name]


if __name__ == "__main__":
    print(json.dumps(_walks(Path(sys.argv[1]), _library(Path(sys.argv[2])))))
